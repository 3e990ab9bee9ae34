"""Map methods by name: ``vitviz.explain(lens, x, "attnlrp")``, ``vitviz.methods()``, ``vitviz.faithfulness(...)``.

Every method that turns an image into a patch map — relevance (AttnLRP, CP-LRP, Gradient × Input, Integrated
Gradients, LeGrad, Grad-CAM, gradient rollout), perturbation (occlusion), attention (rollout, attention flow, the
last layer's mean) and the random floor — is one module here, registered in :mod:`vitviz.explainers.base`.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..attribution import Target
from ..types import ModelInput
from .base import (METHOD_MODULES, NEEDS, Map, MapMethod, MethodError, get_method, methods, names,
                   register_method, registered)

__all__ = ["Map", "MapMethod", "MethodError", "METHOD_MODULES", "NEEDS", "explain", "faithfulness", "get_method",
           "methods", "names", "register_method", "registered", "FaithfulnessTables"]


def _tensor(lens, x) -> torch.Tensor:
    if isinstance(x, ModelInput):
        return x.tensor
    if isinstance(x, torch.Tensor):
        return x
    return lens.preprocess(x).tensor


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
        MethodError: an unknown method, or one that does not apply to this model (a sentence says why).
    """
    found = get_method(method)
    why = found.why_not(lens)
    if why:
        raise MethodError(why)
    return found.compute(lens, _tensor(lens, x), target, trace, **options)


@dataclass
class FaithfulnessTables:
    """The tables ``python -m vitviz faithfulness`` writes, for one batch.

    Attributes:
        curves: rows (image, method, protocol, fraction, score) — ``faithfulness.parquet``'s columns.
        aucs: rows (image, method, protocol, auc) — ``auc.parquet``'s columns.
        settings: the run's settings (``settings.json``'s ``run`` entry).
    """

    curves: pd.DataFrame
    aucs: pd.DataFrame
    settings: dict


def faithfulness(lens, x, methods: list[str] | tuple[str, ...] = ("attnlrp", "rollout", "random"),
                 protocols: tuple[str, ...] = ("morf", "lerf", "insertion"), names: list[str] | None = None,
                 **settings) -> FaithfulnessTables:
    """Perturbation curves and AUCs of ``methods`` on a batch, as ``python -m vitviz faithfulness`` computes them.

    Args:
        x: as :func:`explain` takes it.
        methods: registered names; ``"random"`` is the floor (mean of ``random_seeds`` seeded maps).
        protocols: among ``morf``, ``lerf``, ``insertion`` and Chefer's ``positive`` / ``negative`` (classifiers).
        names: one name per image for the tables (default ``image0``, ``image1``, ...).
        settings: the CLI's options by their :class:`vitviz.faithfulness_run.RunSettings` names (``replacement``,
            ``ordering``, ``steps``, ``random_seeds``, ``first_seed``, ``target_class``).
    """
    from ..faithfulness_run import RunSettings, image_tables, parse_list

    tensor = _tensor(lens, x)
    run = RunSettings(model=lens.spec.name, methods=tuple(parse_list(",".join(methods), tuple(registered()),
                                                                     "methods")),
                      protocols=tuple(protocols), checkpoint=lens.spec.checkpoint, img_size=lens.spec.img_size,
                      head=lens.spec.head, **settings)
    run.check()
    names = names or [f"image{i}" for i in range(len(tensor))]
    curves, aucs = image_tables(lens.loaded, tensor, names, run)
    return FaithfulnessTables(curves, aucs, run.record())
