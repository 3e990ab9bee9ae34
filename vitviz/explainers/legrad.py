"""LeGrad (Bousselham et al., CVPR 2025): each layer's attention gradient of the target read through the head.

Per layer, the target computed from that layer's tokens through the final norm and head; its gradient with respect to
that layer's attention map, ReLU, mean over heads and query rows, prefix columns dropped; summed over layers and
min-max scaled. Window attention (Swin): the gradient of the target itself with respect to each layer's window
attention (the head reads only the last stage), ReLU, mean over heads and over the queries that share the key's
window, each key put back at its place on its stage's grid, padding dropped; each stage's map given to the patches its
tokens merge (nearest), summed over layers and min-max scaled.
"""
from __future__ import annotations

import torch

from .base import (AttributionMethod, Map, block_of, check_attribution, register_method, target_text, to_model,
                   to_patch_grid)
from .targets import Target, default_target
from ..adapters import Hooks, adapter_for, point_name
from ..errors import MethodError
from ..layout import TokenLayout
from ..lens import Lens


@register_method
class LeGrad(AttributionMethod):
    name, label = "legrad", "LeGrad"
    needs = ("gradients", "readout")
    summary = "per layer, the ReLU'd gradient of the target w.r.t. the attention, summed over layers; min-max 0..1"

    def why_not_target(self, lens, target):
        """LeGrad scores the target on each layer's tokens read through the final norm and head: a target read inside
        the model (an SAE latent) is not computed by that readout."""
        point = getattr(target, "point", None)
        if point is None or block_of(point) is None:
            return None
        return (f"LeGrad cannot explain {target_text(target)}: LeGrad scores the target on each layer's tokens read "
                f"through the final norm and head, and this target is read at {point}, inside the model, which that "
                "readout never computes. Use AttnLRP, Gradient x Input, Integrated Gradients or occlusion.")

    def maps(self, model, x, target):
        return legrad(model, x, target)


def _min_max(maps: torch.Tensor) -> torch.Tensor:
    flat = maps.reshape(len(maps), -1)
    lo, hi = flat.min(-1).values, flat.max(-1).values
    return ((flat - lo[:, None]) / (hi - lo).clamp_min(torch.finfo(flat.dtype).tiny)[:, None]).reshape(maps.shape)


def legrad(model, x: torch.Tensor, target: Target | None = None, layers: range | None = None) -> Map:
    """LeGrad (reference: ``WalBouss/LeGrad`` ``compute_legrad``): (B, 3, H, W) -> (B, gh, gw) in [0, 1].

    Window attention (Swin) has its own per-layer map (:func:`_legrad_windows`).

    Args:
        layers: 0-based blocks whose attention is read (across stages for Swin); default the last two (the
            reference's ``layer_index=-2``).
    """
    check_attribution(model, "legrad")
    adapter = adapter_for(model)
    depth = adapter.num_layers(model)
    layers = range(max(depth - 2, 0), depth) if layers is None else layers
    target = target or default_target(model)
    x = to_model(model, x).requires_grad_(True)  # so the attention maps are in a graph even with frozen weights
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    if adapter.scope == "window":
        return _legrad_windows(model, x, target, layers, layout)
    keep = [point_name(k, i) for i in layers for k in ("attn", "resid_post")] + [target.point]
    with torch.enable_grad():
        points = Lens.around(model).trace(x, keep=keep, grad=None)
        bound = target.bind(points)
        total = 0
        for i in layers:
            hooks = Hooks(keep=(target.point,))
            try:
                adapter.readout(model, points[point_name("resid_post", i)], hooks)
            except NotImplementedError:
                raise MethodError(f"LeGrad reads each layer's tokens through the model's head, which vitviz cannot "
                                  f"do yet for {adapter.label(model)} models.") from None
            attn = points[point_name("attn", i)]
            (grad,) = torch.autograd.grad(bound(hooks.kept).sum(), attn, retain_graph=True)
            total = total + grad.clamp_min(0).mean(dim=1).mean(dim=1)[:, layout.num_prefix_tokens:]
    gh, gw = layout.grid_size
    maps = _min_max(total.detach().double().reshape(-1, gh, gw))
    return Map("legrad", maps.cpu().numpy(), None, bound(points).detach().double().cpu().numpy(), bound)


def window_key_map(grad: torch.Tensor, geometry) -> torch.Tensor:
    """LeGrad's per-layer map on window attention: (B, nW, H, T, T) gradients w.r.t. one block's window attention ->
    (B, gh', gw') on the block's stage grid.

    ReLU, mean over heads, then for each key the mean over the queries that attend in the same window as it (real
    slots the shift mask lets reach it: a window that wrapped around the image edge is up to four windows); each
    key slot is put back at its token's place on the stage grid (the roll and partition undone by
    :meth:`~vitviz.adapters.windows.WindowGeometry.token_positions`); padding slots are dropped.
    """
    pos = torch.as_tensor(geometry.token_positions(), device=grad.device)  # (nW, T, 2), -1 for padding
    real = pos[..., 0] >= 0
    pairs = torch.as_tensor(geometry.keys_allowed(), device=grad.device) & real[:, :, None]  # (nW, query, key)
    per_pair = grad.clamp_min(0).mean(dim=2) * pairs  # (B, nW, T, T)
    per_key = per_pair.sum(dim=2)[:, real] / pairs.sum(dim=1)[real].to(grad.dtype)  # (B, real slots)
    gh, gw = geometry.grid_size
    out = torch.zeros(grad.shape[0], gh * gw, dtype=grad.dtype, device=grad.device)
    out[:, pos[real][:, 0] * gw + pos[real][:, 1]] = per_key  # every token is one real slot of one window
    return out.reshape(-1, gh, gw)


def _legrad_windows(model, x: torch.Tensor, target: Target, layers, layout: TokenLayout) -> Map:
    """LeGrad on window attention: the head reads only the last stage's tokens, so every layer's map is the gradient
    of the target itself (one backward for all layers) through :func:`window_key_map`, each stage's map given to the
    patches its tokens merge (:func:`to_patch_grid`, nearest), summed over ``layers`` and min-max scaled."""
    adapter = adapter_for(model)
    geometry = adapter.geometry(model, tuple(x.shape[-2:]))
    names = [point_name("attn", i) for i in layers]
    with torch.enable_grad():
        points = Lens.around(model).trace(x, keep=names + [target.point], grad=None)
        bound = target.bind(points)
        score = bound(points)
        grads = torch.autograd.grad(score.sum(), [points[n] for n in names])
    total = 0
    for i, grad in zip(layers, grads):
        g = geometry[i]
        total = total + to_patch_grid(window_key_map(grad.detach().double(), g), g.layout, layout, "nearest")
    maps = _min_max(total)
    return Map("legrad", maps.cpu().numpy(), None, score.detach().double().cpu().numpy(), bound)
