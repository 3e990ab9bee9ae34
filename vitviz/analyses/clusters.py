"""Token clusters: k-means of the patch tokens' features, the "sky / grass / horse" groups of a ViT.

Labels are reproducible (fixed seed, several initialisations, the best kept) and numbered by
cluster size, largest first (ties: the cluster whose first patch in raster order comes first),
so the same image, model and settings always give the same picture and the same legend.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..errors import OptionError

K_RANGE = (2, 12)
N_INIT = 10
SEED = 0


@dataclass
class TokenClusters:
    """k-means of one image's patch tokens.

    Attributes:
        labels: (gh, gw) int cluster of every patch, 0 = the largest cluster.
        inertia: sum of squared distances of the features to their cluster's mean.
        sizes: (K,) patches per cluster, non-increasing.
    """

    labels: np.ndarray
    inertia: float
    sizes: np.ndarray

    @property
    def k(self) -> int:
        return len(self.sizes)


def check_k(k: int, num_points: int) -> None:
    """Raise OptionError with a sentence unless 2 <= k <= 12 and there are at least k points."""
    lo, hi = K_RANGE
    if not lo <= k <= hi:
        raise OptionError(f"the number of clusters must be between {lo} and {hi}, not {k}")
    if k > num_points:
        raise OptionError(f"{k} clusters need at least {k} patches; the image has {num_points}")


def inertia_of(points: np.ndarray, labels: np.ndarray) -> float:
    """Sum of squared distances of (M, D) points to the mean of their label's points."""
    points = np.asarray(points, dtype=np.float64)
    return float(sum(((points[labels == c] - points[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels)))


def order_by_size(labels: np.ndarray) -> np.ndarray:
    """Renumber (M,) labels 0..K-1 by cluster size, largest first; ties by first occurrence."""
    ids, first, counts = np.unique(labels, return_index=True, return_counts=True)
    order = ids[np.lexsort((first, -counts))]
    rank = np.empty(ids.max() + 1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[labels]


def kmeans_labels(points: np.ndarray, k: int, *, seed: int = SEED, n_init: int = N_INIT) -> np.ndarray:
    """k-means (Lloyd, k-means++ starts, the best of ``n_init``) of (M, D) points -> (M,) labels by size."""
    from sklearn.cluster import KMeans

    points = np.asarray(points, dtype=np.float64)
    check_k(k, len(points))
    labels = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(points)
    return order_by_size(labels)


def token_clusters(features: np.ndarray, grid_size: tuple[int, int], k: int, *, seed: int = SEED,
                   n_init: int = N_INIT) -> TokenClusters:
    """Cluster one image's patch tokens.

    features: (gh * gw, D) patch-token features in raster order (no prefix tokens) -> :class:`TokenClusters`.
    """
    labels = kmeans_labels(features, k, seed=seed, n_init=n_init)
    return TokenClusters(labels=labels.reshape(grid_size), inertia=inertia_of(features, labels),
                         sizes=np.bincount(labels, minlength=k))


def cluster_overlay(image: Image.Image, labels: np.ndarray, colours: list[tuple[int, int, int]], *,
                    opacity: float = 0.55, boundaries: bool = True, zoom: int = 1) -> Image.Image:
    """The clusters as coloured regions over the model-input image, with white lines between clusters.

    labels: (gh, gw) ints indexing ``colours``; opacity: the colour's share of each pixel.
    """
    size = (image.width * zoom, image.height * zoom)
    base = np.asarray(image.convert("RGB").resize(size, Image.BICUBIC) if zoom > 1 else image.convert("RGB"),
                      dtype=np.float64)
    gh, gw = labels.shape
    rows = np.minimum((np.arange(size[1]) * gh) // size[1], gh - 1)
    cols = np.minimum((np.arange(size[0]) * gw) // size[0], gw - 1)
    per_pixel = labels[rows[:, None], cols[None, :]]
    palette = np.asarray(colours, dtype=np.float64)
    out = base * (1 - opacity) + palette[per_pixel] * opacity
    if boundaries:
        edge = np.zeros(per_pixel.shape, dtype=bool)
        edge[:, 1:] |= per_pixel[:, 1:] != per_pixel[:, :-1]
        edge[1:, :] |= per_pixel[1:, :] != per_pixel[:-1, :]
        out[edge] = 255.0
    return Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8))


def batch_clusters(model, images, features: np.ndarray, layout, k: int, layer: int | None = None,
                   batch_size: int = 8) -> tuple[np.ndarray, list[float]]:
    """Cluster every image's patch tokens on its own, as the CLI's ``--clusters`` does.

    Args:
        model: the timm model (needed only when ``layer`` is set).
        images: (B, 3, H, W) model input.
        features: (B, N, D) final features (``analysis.npz``'s ``features``), used when ``layer`` is None.
        layout: the token layout.
        k: clusters per image, 2..12.
        layer: 0-based block whose output is clustered; None = the final features.

    Returns:
        labels (B, gh, gw) int64 and the inertia of each image.
    """
    import torch

    from .anatomy import block_output

    check_k(k, layout.num_patches)
    if layer is not None:
        features = torch.cat([block_output(model, images[i:i + batch_size], layer).float().cpu()
                              for i in range(0, len(images), batch_size)]).numpy()
    results = [token_clusters(f[layout.patch_slice], layout.grid_size, k) for f in features]
    return np.stack([r.labels for r in results]), [r.inertia for r in results]
