"""Gradient × Input of a target at the pixels through a forward with relevance rules (:mod:`vitviz.explainers.rules`):
what AttnLRP, CP-LRP and the plain gradient compute, each with its own rules.

Relevance at the pixels is Σ over colour channels of input ⊙ (modified) gradient, with the input being the
normalised model input; the patch map is its sum over each patch. What the pixels receive is compared with the
target's value (conservation, :meth:`vitviz.explainers.base.Map.conservation`): the rest went to the prefix tokens,
the position embedding, biases and the softmax.
"""
from __future__ import annotations

import torch

from .base import Map, check_attribution, get_method, patch_sums, to_model
from .targets import Target, default_target
from ..adapters import adapter_for
from ..errors import MethodError
from ..lens import Lens


def relevance(model, x: torch.Tensor, method: str = "attnlrp", target: Target | None = None) -> Map:
    """Gradient × Input of ``target`` at the pixels with ``method``'s rules: (B, 3, H, W) -> maps.

    Args:
        method: ``"attnlrp"``, ``"cp-lrp"`` or ``"gradient"`` (the plain gradient).
        target: default :func:`default_target`.

    Raises:
        MethodError: the model's family does not run its forward through the rules (sentence says why).
    """
    check_attribution(model, method)
    found = get_method(method)
    rules = found.rules()
    target = target or default_target(model)
    adapter = adapter_for(model)
    x = to_model(model, x).requires_grad_(True)
    with torch.enable_grad():
        points = Lens.around(model).trace(x, keep=(target.point,), rules=rules, grad=None)
        bound = target.bind(points)
        score = bound(points)
        (grad,) = torch.autograd.grad(score.sum(), x)
    if method != "gradient" and rules.calls == 0:
        raise MethodError(f"{adapter.label(model)} models run through their library's own forward here, so "
                          f"{found.label}'s rules cannot be applied to them yet.")
    pixels = (x.detach() * grad).sum(1)
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    return Map(found.name, patch_sums(pixels, layout).double().cpu().numpy(), pixels.double().cpu().numpy(),
               score.detach().double().cpu().numpy(), bound, signed=True)
