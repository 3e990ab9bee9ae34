"""Map methods by name: ``vitviz.explain(lens, x, "attnlrp")``, ``vitviz.methods()``.

Every method that turns an image into a patch map — relevance (AttnLRP, CP-LRP, Gradient × Input, Integrated
Gradients, LeGrad, Grad-CAM, gradient rollout), perturbation (occlusion), attention (rollout, attention flow, the
last layer's mean) and the random floor — is one module here, registered in :mod:`vitviz.explainers.base`.
"""
from __future__ import annotations

import torch

from .targets import Target, for_lens
from .base import (METHOD_MODULES, NEEDS, Map, MapMethod, MethodError, get_method, methods, names, parse_methods,
                   register_method, registered)

__all__ = ["Map", "MapMethod", "MethodError", "METHOD_MODULES", "NEEDS", "explain", "get_method", "methods", "names",
           "parse_methods", "as_tensor", "register_method", "registered"]


def as_tensor(lens, x) -> torch.Tensor:
    """A batch as a normalised tensor (B, 3, H, W): a ModelInput's, a tensor as it is, or images preprocessed."""
    return lens.as_input(x).tensor


def explain(lens, x, method: str, target: Target | None = None, trace=None, **options) -> Map:
    """One method's maps of a batch.

    Args:
        lens: an opened model (:func:`vitviz.open`).
        x: a :class:`ModelInput` from ``lens.preprocess``, a normalised tensor (B, 3, H, W), or images
            (paths, PIL images, arrays) as ``lens.preprocess`` takes them.
        method: a registered name (``vitviz.methods()``): ``"attnlrp"``, ``"rollout"``, ``"occlusion"``, ...
        target: what relevance and perturbation methods explain: ``vitviz.ClassLogit(281)`` (default: each image's
            top-1 logit), or ``vitviz.Projection()`` (headless models' default: the pooled vector's projection on
            its unperturbed direction). Attention methods explain no target.
        trace: a :class:`vitviz.Trace` of ``x`` that kept ``attn``: attention methods reuse it.
        options: the method's own settings (its class docstring).

    Returns:
        Map: ``patches`` (B, gh, gw) float64; ``pixels`` (B, H, W) where the method has them; ``signed``;
        ``settings`` (dict for settings.json).

    Raises:
        MethodError: an unknown method, or one that does not apply to this model or target (a sentence says why).
    """
    found = get_method(method)
    target = for_lens(target, lens)
    why = found.why_not(lens) or found.why_not_target(lens, target)
    if why:
        raise MethodError(why)
    return found.compute(lens, as_tensor(lens, x), target, trace, **options)
