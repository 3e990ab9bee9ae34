"""Token diagnostics: output-token norms, high-norm artifact tokens, feature PCA, top classes."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..layout import TokenLayout
from ..tensors import as_tensor, to_host

ARTIFACT_FACTOR = 10.0
SINK_Z = 8.0
SINK_MIN_SHARE = 10.0


@dataclass
class AttentionSinks:
    """Tokens that receive a disproportionate share of attention, per layer.

    Attributes:
        received: (L, N) mean share of a query's attention that each token receives
            (mean over heads and all queries; each layer's row sums to 1).
        z: (L, N) robust z-score of ``received`` against the patch tokens of that layer
            ((x - median) / (1.4826 * MAD)).
        sinks: per layer, sorted token indices (full sequence) flagged as sinks.
    """

    received: np.ndarray
    z: np.ndarray
    sinks: list[np.ndarray]

    def patch_sinks(self, layout: TokenLayout, layers=None) -> np.ndarray:
        """Sink patches (raster indices over the grid) in any of ``layers`` (default all)."""
        picked = range(len(self.sinks)) if layers is None else layers
        tokens = np.unique(np.concatenate([self.sinks[layer] for layer in picked] + [np.zeros(0, int)]))
        return (tokens[tokens >= layout.num_prefix_tokens] - layout.num_prefix_tokens).astype(int)

    def received_map(self, layout: TokenLayout, layer: int) -> np.ndarray:
        """(1, gh, gw) the share of attention each patch receives in ``layer``, as a multiple of the uniform share 1/N."""
        return layout.patch_grid(self.received[layer] * layout.num_tokens)[None]

    def patch_counts(self, layout: TokenLayout) -> list[int]:
        """Per layer, how many of its sinks are patches (prefix tokens not counted)."""
        return [int((s >= layout.num_prefix_tokens).sum()) for s in self.sinks]

    def share(self, layer: int, tokens) -> float:
        """The share of all attention in ``layer`` that ``tokens`` (full-sequence indices) receive."""
        return float(self.received[layer, list(tokens)].sum()) if len(tokens) else 0.0


def artifact_tokens(norms: np.ndarray, layout: TokenLayout, factor: float = ARTIFACT_FACTOR) -> np.ndarray:
    """Patch tokens whose norm exceeds ``factor`` x the median patch norm (Darcet et al. 2023).

    norms: (N,) token norms of one layer -> sorted token indices (into the full sequence).
    """
    patch = norms[layout.patch_slice]
    return np.flatnonzero(patch > factor * np.median(patch)) + layout.num_prefix_tokens


def attention_sinks(attention: np.ndarray, layout: TokenLayout, z_threshold: float = SINK_Z,
                    min_share: float = SINK_MIN_SHARE) -> AttentionSinks:
    """Attention sinks: tokens receiving far more attention than a typical patch, layer by layer.

    A token is a sink in a layer when its received share is a robust outlier among the patch
    tokens (z > ``z_threshold``) and at least ``min_share`` times the uniform share 1/N. Prefix
    tokens (CLS, registers) are scored against the same patch statistics. High-norm tokens
    (:func:`artifact_tokens`) are one cause; sinks are what actually distorts maps.

    attention: (L, H, N, N), numpy or a tensor on any device -> :class:`AttentionSinks`.
    """
    L, H, N, _ = attention.shape
    # (L, N): mean over heads and queries, on the attention's device, summed in float64 one layer at
    # a time (torch reduces over a contiguous leading axis far faster than over two); only this comes to the host.
    received = to_host(torch.stack([layer.reshape(H * N, N).sum(dim=0, dtype=torch.float64)
                                    for layer in as_tensor(attention)]) / (H * N))
    return sinks_from_received(received, layout, z_threshold, min_share)


def sinks_from_received(received: np.ndarray, layout: TokenLayout, z_threshold: float = SINK_Z,
                        min_share: float = SINK_MIN_SHARE) -> AttentionSinks:
    """:func:`attention_sinks` from the received shares (L, N): robust z-scores against the patch tokens."""
    patch = received[:, layout.patch_slice]
    median = np.median(patch, axis=1, keepdims=True)
    mad = 1.4826 * np.median(np.abs(patch - median), axis=1, keepdims=True)
    z = (received - median) / np.maximum(mad, 1e-12)
    flagged = (z > z_threshold) & (received > min_share / layout.num_tokens)
    return AttentionSinks(received=received, z=z, sinks=[np.flatnonzero(row) for row in flagged])


def feature_pca_rgb(features: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Patch features to their first 3 principal components, each min-max scaled to [0, 1].

    features: (N, D) last-layer tokens -> (gh, gw, 3) RGB.
    """
    from sklearn.decomposition import PCA

    patches = features[layout.patch_slice].astype(np.float64)
    rgb = PCA(n_components=3, svd_solver="full").fit_transform(patches)
    lo, hi = rgb.min(0), rgb.max(0)
    rgb = (rgb - lo) / np.where(hi > lo, hi - lo, 1)
    return rgb.reshape(*layout.grid_size, 3)


def top_classes(logits: np.ndarray, k: int = 5, labels: tuple[str, ...] | None = None) -> list[tuple[int, str, float]]:
    """(C,) logits -> [(class index, label, probability)] best first.

    ``labels``: the model's own class names (e.g. a transformers ``config.id2label``); without
    them, ImageNet labels when C is 1000 or 21843.
    """
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    order = np.argsort(-p)[:k]
    labels = labels or _imagenet_labels(len(logits))
    return [(int(i), labels[i] if labels else f"class {i}", float(p[i])) for i in order]


@lru_cache(maxsize=4)
def _imagenet_labels(num_classes: int) -> tuple[str, ...] | None:
    from timm.data import ImageNetInfo

    subsets = {1000: "imagenet-1k", 21843: "imagenet-21k", 11821: "imagenet-12k", 21841: "imagenet-21k-goog"}
    if num_classes not in subsets:
        return None
    info = ImageNetInfo(subsets[num_classes])
    return tuple(info.index_to_description(i) for i in range(num_classes))
