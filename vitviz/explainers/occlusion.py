"""Occlusion (Zeiler & Fergus 2014): slide a window of patches over the image, replace it as the faithfulness
protocols replace patches (:func:`vitviz.perturbation.protocols.replacement_of`: the mean colour, or RISE's blur),
and record how far the target drops. Model-agnostic: it needs only forwards.

A patch's value is the mean drop s(x) - s(x with the window replaced) over the windows that cover it; with the
default 1-patch window and stride 1 that is exactly its own drop (one forward per patch, batched).
"""
import numpy as np
import torch

from ..perturbation.curves import pixel_masks
from ..perturbation.protocols import REPLACEMENTS, replacement_of
from .base import Map, MapMethod, MethodError, bound_target, register_method, repeat_target


@register_method
class Occlusion(MapMethod):
    """Options: ``window`` (patches per side, default 1), ``stride`` (patches, default ``window``), ``replacement``
    (``"mean"`` default, or ``"blur"``), ``batch_size`` (forwards per batch, default 32)."""

    name, label, kind, signed = "occlusion", "Occlusion", "perturbation", True
    summary = "the target's drop when a sliding window of patches is replaced (mean colour or blur); model-agnostic"

    def compute(self, lens, x, target=None, trace=None, window: int = 1, stride: int | None = None,
                replacement: str = "mean", batch_size: int = 32):
        if replacement not in REPLACEMENTS:
            raise MethodError(f"occlusion replacement must be one of {', '.join(REPLACEMENTS)}, not {replacement!r}.")
        layout = lens.layout_for(x)
        gh, gw = layout.grid_size
        stride = stride or window
        if not (1 <= window <= min(gh, gw) and stride >= 1):
            raise MethodError(f"occlusion window {window} and stride {stride} must be at least 1 and fit the "
                              f"{gh}x{gw} patch grid.")
        param = next(lens.model.parameters())
        x = x.to(device=param.device, dtype=param.dtype)
        bound, values = bound_target(lens, x, target)
        tops = [(r, c) for r in _starts(gh, window, stride) for c in _starts(gw, window, stride)]
        grids = np.zeros((len(tops), gh, gw), dtype=bool)
        for k, (r, c) in enumerate(tops):
            grids[k, r:r + window, c:c + window] = True
        masks = torch.from_numpy(pixel_masks(grids, layout, tuple(x.shape[-2:]))).to(x.device)[:, None]
        cover = grids.sum(0)
        maps = np.zeros((len(x), gh, gw))
        with torch.inference_mode():
            for i in range(len(x)):
                base = replacement_of(x[i], replacement)
                drops = []
                for s in range(0, len(tops), batch_size):
                    inputs = torch.where(masks[s:s + batch_size], base[None], x[i][None])
                    scorer = repeat_target(bound, i, len(inputs))
                    score = scorer(lens.trace(inputs, keep=(bound.point,), fast=True, grad=None))
                    drops.append(values[i] - score.double().cpu().numpy())
                drops = np.concatenate(drops)
                maps[i] = (drops[:, None, None] * grids).sum(0) / cover
        return Map(self.name, maps, signed=True, target_value=values, target=bound,
                   settings={"method": self.name, "window": window, "stride": stride, "replacement": replacement,
                             "target": bound.describe(),
                             "definition": "mean over covering windows of s(x) - s(x with the window replaced)"})


def _starts(size: int, window: int, stride: int) -> list[int]:
    """Window starts along one axis: every ``stride``, plus one flush with the end so every patch is covered."""
    starts = list(range(0, size - window + 1, stride))
    if starts[-1] != size - window:
        starts.append(size - window)
    return starts
