"""AttentionViz's two corrections of a head's queries and keys, and the model's scores split into the scaled dot
product and a bias (Yeh et al., IEEE VIS 2023; the method and its exactness on the softmax are written out in
:mod:`vitviz.heads.qk`, which re-exports every name here).

Arrays are float64 numpy. Shapes: G groups (images, or images x windows), N tokens per group, d head dimensions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Corrected:
    """Queries and keys after AttentionViz's two corrections.

    Attributes:
        queries: (..., N, d) the queries divided by ``scale``.
        keys: (..., N, d) the keys plus ``translation``, times ``scale``.
        translation: (d,) mean(q) - mean(k) over every token given, added to each key before scaling.
        scale: c = sqrt(mean‖q‖ / mean‖k + t‖).
    """

    queries: np.ndarray
    keys: np.ndarray
    translation: np.ndarray
    scale: float


def translate_keys(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys moved so that their mean is the queries' mean: (keys + t, t) with t = mean(q) - mean(k) (d,).

    queries, keys: (..., N, d); the means run over every token of every group. Each query's logits all
    change by q · t, one constant per query: the softmax rows are unchanged.
    """
    d = queries.shape[-1]
    t = queries.reshape(-1, d).mean(axis=0) - keys.reshape(-1, d).mean(axis=0)
    return keys + t, t


def norm_balance(queries: np.ndarray, keys: np.ndarray) -> float:
    """c = sqrt(mean‖q‖ / mean‖k‖) (norms over the last axis, means over every token): keys x c and queries / c
    have the same mean norm and the same dot products."""
    q_norm = float(np.linalg.norm(queries, axis=-1).mean())
    k_norm = float(np.linalg.norm(keys, axis=-1).mean())
    if k_norm == 0.0 or q_norm == 0.0:
        return 1.0  # a head with all-zero queries or keys: nothing to balance
    return float(np.sqrt(q_norm / k_norm))


def correct(queries: np.ndarray, keys: np.ndarray) -> Corrected:
    """AttentionViz's corrections in order: translate the keys (:func:`translate_keys`), then scale keys by c and
    queries by 1/c with c from :func:`norm_balance` on the translated keys.

    queries, keys: (..., N, d) -> :class:`Corrected` of the same shapes. Attention rows are unchanged exactly
    (up to rounding): every query's logits move by one constant.
    """
    moved, t = translate_keys(queries, keys)
    c = norm_balance(queries, moved)
    return Corrected(queries / c, moved * c, t, c)


def distance_dot_correlation(queries: np.ndarray, keys: np.ndarray) -> float:
    """Pearson correlation between query-key distance and dot product over every pair of the same group.

    Args:
        queries, keys: (G, N, d): pairs (i, j) run over the N x N queries and keys of each group (an image, or a
            window), G * N * N pairs in all.

    Returns:
        r in [-1, 1] (AttentionViz's target: close to -1, near keys are attended keys); NaN when either is
        constant.
    """
    dots = queries @ np.swapaxes(keys, -1, -2)  # (G, N, N)
    squared = (queries ** 2).sum(-1)[..., :, None] + (keys ** 2).sum(-1)[..., None, :] - 2 * dots
    distance = np.sqrt(np.maximum(squared, 0.0))
    a, b = distance.ravel(), dots.ravel()
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denominator) if denominator > 0 else float("nan")


@dataclass(frozen=True)
class ScoreParts:
    """The scores split into the scaled dot product and what is added to it.

    Attributes:
        scale: the factor of q · k in the scores (least squares; head_dim ** -0.5 in most models).
        bias: (G, N, N) scores - scale * q · kᵀ: a relative position bias, a mask, or rounding.
        bias_share: the share of the scores' within-row spread the bias carries (the softmax ignores one constant
            per row): ‖bias - row mean‖ / ‖scores - row mean‖; 0 for plain dot-product attention.
    """

    scale: float
    bias: np.ndarray
    bias_share: float

    @property
    def has_bias(self) -> bool:
        """Whether a bias beyond float32 rounding is added to the scores (then it is not in the picture)."""
        return self.bias_share > 1e-4


def score_scale_and_bias(queries: np.ndarray, keys: np.ndarray, scores: np.ndarray, windows: int = 1) -> ScoreParts:
    """Split the model's scores (the Trace's ``scores`` point) into scale * q · kᵀ and a bias.

    The scale is fitted by least squares on differences between images of the same window, which cancel a bias
    that every image shares (a relative position bias, a shift mask); with one image, on the scores themselves.

    Args:
        queries, keys: (G, N, d); scores: (G, N, N) of the same head; windows: groups per image (G = B * windows).

    Returns:
        ScoreParts. softmax(scale * q · kᵀ + bias) is the model's attention exactly, whatever the fit.
    """
    dots = queries @ np.swapaxes(keys, -1, -2)
    G, N, _ = dots.shape
    if G // windows >= 2:
        per_image = lambda a: a.reshape(G // windows, windows, N, N)  # noqa: E731
        x = per_image(dots) - per_image(dots).mean(axis=0)
        y = per_image(scores) - per_image(scores).mean(axis=0)
    else:
        x, y = dots, scores
    denominator = float((x * x).sum())
    scale = float((x * y).sum() / denominator) if denominator > 0 else 0.0
    bias = scores - scale * dots
    spread = lambda a: float(np.linalg.norm(a - a.mean(axis=-1, keepdims=True)))  # noqa: E731
    total = spread(scores)
    return ScoreParts(scale, bias, spread(bias) / total if total > 0 else 0.0)


def attention_rows(queries: np.ndarray, keys: np.ndarray, scale: float, bias: np.ndarray | None = None) -> np.ndarray:
    """softmax(scale * q · kᵀ + bias) over the keys: (..., N, d) x2 -> (..., N, N) float64, rows sum to 1."""
    scores = scale * (queries @ np.swapaxes(keys, -1, -2))
    if bias is not None:
        scores = scores + bias
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)
