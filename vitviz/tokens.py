"""Token diagnostics: output-token norms, high-norm artifact tokens, feature PCA, top classes."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .layout import TokenLayout

ARTIFACT_FACTOR = 10.0


def artifact_tokens(norms: np.ndarray, layout: TokenLayout, factor: float = ARTIFACT_FACTOR) -> np.ndarray:
    """Patch tokens whose norm exceeds ``factor`` x the median patch norm (Darcet et al. 2023).

    norms: (N,) token norms of one layer -> sorted token indices (into the full sequence).
    """
    patch = norms[layout.patch_slice]
    return np.flatnonzero(patch > factor * np.median(patch)) + layout.num_prefix_tokens


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


def top_classes(logits: np.ndarray, k: int = 5) -> list[tuple[int, str, float]]:
    """(C,) logits -> [(class index, label, probability)] best first; ImageNet labels when C is 1000 or 21843."""
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    order = np.argsort(-p)[:k]
    labels = _imagenet_labels(len(logits))
    return [(int(i), labels[i] if labels else f"class {i}", float(p[i])) for i in order]


@lru_cache(maxsize=4)
def _imagenet_labels(num_classes: int) -> tuple[str, ...] | None:
    from timm.data import ImageNetInfo

    subsets = {1000: "imagenet-1k", 21843: "imagenet-21k", 11821: "imagenet-12k", 21841: "imagenet-21k-goog"}
    if num_classes not in subsets:
        return None
    info = ImageNetInfo(subsets[num_classes])
    return tuple(info.index_to_description(i) for i in range(num_classes))
