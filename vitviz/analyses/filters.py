"""PCA of the patch-embedding filters (ViT paper Fig. 7 left)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ViewNotApplicable


@dataclass
class FilterPCA:
    """Attributes:
        components: (k, C, P, P) principal components of the filters, as filters; each signed so
            that its largest-magnitude entry is positive (see :func:`fix_signs`).
        explained_variance_ratio: (k,) share of variance each explains, decreasing.
        tiles: (k, P, P, C) each component min-max scaled to [0, 1] for display as RGB.
    """

    components: np.ndarray
    explained_variance_ratio: np.ndarray
    tiles: np.ndarray


def patch_filters(model) -> np.ndarray:
    """The linear patch-embedding filters (D, C, P, P) of a ViT.

    Raises:
        ViewNotApplicable: the model has no linear RGB patch filters (hybrid or conv stem).
    """
    from ..adapters import adapter_for

    try:
        weight = adapter_for(model).patch_filters(model)
    except ValueError:
        weight = None
    if weight is None or weight.ndim != 4 or weight.shape[1] != 3:
        raise ViewNotApplicable("This model has no linear RGB patch filters (hybrid or convolutional stem).")
    return weight.detach().float().cpu().numpy()


def minmax_tiles(filters: np.ndarray) -> np.ndarray:
    """(k, C, P, P) -> (k, P, P, C), each filter scaled to [0, 1] on its own."""
    flat = filters.reshape(len(filters), -1)
    lo, hi = flat.min(1, keepdims=True), flat.max(1, keepdims=True)
    scaled = (flat - lo) / np.where(hi > lo, hi - lo, 1)
    return scaled.reshape(filters.shape).transpose(0, 2, 3, 1)


def patch_filter_pca(filters: np.ndarray, n_components: int = 28) -> FilterPCA:
    """PCA over the D filters of length C*P*P.

    filters: (D, C, P, P) -> FilterPCA with min(n_components, D, C*P*P) components.
    """
    from sklearn.decomposition import PCA

    D = filters.shape[0]
    k = min(n_components, D, int(np.prod(filters.shape[1:])))
    pca = PCA(n_components=k, svd_solver="full").fit(filters.reshape(D, -1).astype(np.float64))
    components = fix_signs(pca.components_).reshape(k, *filters.shape[1:])
    return FilterPCA(components=components, explained_variance_ratio=pca.explained_variance_ratio_,
                     tiles=minmax_tiles(components))


def fix_signs(components: np.ndarray) -> np.ndarray:
    """Flip each component so that its largest-magnitude entry is positive: (k, F) -> (k, F).

    A principal component's sign is arbitrary, and scikit-learn's rule for it changed after 1.4
    (from the left to the right singular vectors), so the same filters gave inverted colours
    depending on the installed version. Ties go to the first largest entry.
    """
    flat = components.reshape(len(components), -1)
    largest = flat[np.arange(len(flat)), np.abs(flat).argmax(axis=1)]
    return components * np.where(largest < 0, -1.0, 1.0).reshape(-1, *([1] * (components.ndim - 1)))
