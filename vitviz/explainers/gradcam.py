"""Grad-CAM for ViTs with pytorch-grad-cam's recipe (the last block's ln1 activations, gradient-weighted).

Window attention (Swin): its Swin recipe, on the block's stage grid, brought to the patch grid bilinearly (as
pytorch-grad-cam resizes its map to the image); the stage-grid map is returned too (:attr:`Map.coarse`).
"""
from __future__ import annotations

import torch

from .base import (AttributionMethod, Map, block_of, check_attribution, register_method, target_text, to_model,
                   to_patch_grid)
from .targets import Target, default_target
from ..adapters import adapter_for, point_name
from ..errors import MethodError
from ..lens import Lens


@register_method
class GradCAM(AttributionMethod):
    name, label = "gradcam", "Grad-CAM"
    summary = "the last block's normalised tokens weighted by their mean gradient, ReLU (pytorch-grad-cam's ViT recipe)"

    def why_not_target(self, lens, target):
        """A target read inside the model (an SAE latent) must come at or after the last block's ln1 in the forward:
        a score computed before that point does not depend on it, and its gradient there does not exist."""
        point = getattr(target, "point", None)
        if point is None or block_of(point) is None:
            return None
        last = f"blocks.{lens.num_layers - 1}.ln1"
        order = lens.points()
        if point in order and order.index(point) >= order.index(last):
            return None
        return (f"Grad-CAM cannot explain {target_text(target)}: Grad-CAM weights the last block's ln1 activations "
                f"(layer {lens.num_layers}) by the target's gradient, and this target is read at {point} (layer "
                f"{block_of(point) + 1}), earlier in the forward, so it does not depend on them. Use AttnLRP, "
                "Gradient x Input, Integrated Gradients or occlusion, or an SAE on the last layer.")

    def maps(self, model, x, target):
        return gradcam(model, x, target)


def gradcam(model, x: torch.Tensor, target: Target | None = None, layer: int = -1) -> Map:
    """Grad-CAM with pytorch-grad-cam's ViT recipe: (B, 3, H, W) -> (B, gh, gw), ReLU'd, not rescaled.

    The activations A (B, N, D) of block ``layer``'s ``ln1`` (0-based; -1 the last), prefix tokens
    dropped; weights = the mean of ∂target/∂A over patches per channel; map = ReLU(Σ_c w_c A_c).
    Window attention (Swin; its recipe, ``layers[-1].blocks[-1].norm1``): A is on the block's stage grid
    (B, gh', gw', D); the map there is :attr:`vitviz.explainers.base.Map.coarse`, and ``patches`` is it brought to the patch
    grid bilinearly (:func:`to_patch_grid`; pytorch-grad-cam resizes it to the image the same way).
    """
    check_attribution(model, "gradcam")
    adapter = adapter_for(model)
    layer = layer % adapter.num_layers(model)
    target = target or default_target(model)
    x = to_model(model, x).requires_grad_(True)
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    name = point_name("ln1", layer)
    with torch.enable_grad():
        points = Lens.around(model).trace(x, keep=(name, target.point), grad=None)
        if name not in points:
            raise MethodError(f"Grad-CAM reads a block's ln1 activations, which {adapter.label(model)} models do not "
                              "show yet.")
        bound = target.bind(points)
        score = bound(points)
        (grad,) = torch.autograd.grad(score.sum(), points[name])
    acts = points[name].detach()
    if adapter.scope == "window":  # tokens on the block's stage grid (B, gh', gw', D), no prefix tokens
        grid = adapter.geometry(model, tuple(x.shape[-2:]))[layer].layout
        acts, grad = acts.flatten(1, 2), grad.flatten(1, 2)
    else:
        grid, npt = layout, layout.num_prefix_tokens
        acts, grad = acts[:, npt:], grad[:, npt:]
    cam = (grad.mean(dim=1, keepdim=True) * acts).sum(-1).clamp_min(0).double().reshape(-1, *grid.grid_size)
    value = score.detach().double().cpu().numpy()
    if grid.grid_size == layout.grid_size:
        return Map("gradcam", cam.cpu().numpy(), None, value, bound)
    patches = to_patch_grid(cam, grid, layout, "bilinear")
    return Map("gradcam", patches.cpu().numpy(), None, value, bound, coarse=cam.cpu().numpy(), coarse_layout=grid)
