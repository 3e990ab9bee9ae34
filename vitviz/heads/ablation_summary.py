"""An ablation's effects summed up for a picture: per image and head, the mean over images, and the head that moved
the output most (:func:`summarise_ablation`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .patching import Effects


@dataclass(frozen=True)
class AblationSummary:
    """What :func:`summarise_ablation` returns.

    Attributes:
        kind: the effect read: "logit_change" (a model with a classifier) or "pooled_cosine" (without).
        grids: (B, L, H) the effect per image, layer and head (0-based), NaN where a head was not ablated.
        values: (L, H) the mean over images: the top-1 logit's change, or 1 − cosine(pooled after, before), so that
            larger is a larger effect; NaN where a head was not ablated.
        strongest: the 0-based (layer, head) of ``pairs`` with the largest |value|.
    """

    kind: str
    grids: np.ndarray
    values: np.ndarray
    strongest: tuple[int, int]


def summarise_ablation(effects: Effects, has_head: bool, num_layers: int, num_heads: int, num_images: int,
                       pairs: Sequence[tuple[int, int]]) -> AblationSummary:
    """One head ablated at a time (:func:`vitviz.heads.patching.ablate` with ``each=True``) over ``num_images``
    images, as one (L, H) picture of mean effects and the head to show first.

    Args:
        effects: the ablation's rows.
        has_head: the model has a classifier (logit change) or not (the pooled vector's cosine).
        pairs: the 0-based (layer, head) pairs that were ablated, non-empty.
    """
    kind = "logit_change" if has_head else "pooled_cosine"
    grids = np.stack([effects.grid(kind, num_layers, num_heads, i) for i in range(num_images)])
    mean = grids.mean(0)
    values = mean if has_head else 1.0 - mean
    layers, heads = zip(*pairs)
    strongest = pairs[int(np.nanargmax(np.abs(values[list(layers), list(heads)])))]
    return AblationSummary(kind, grids, values, tuple(strongest))
