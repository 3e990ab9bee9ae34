"""Window attention (Swin, timm and Hugging Face): one forward's window probabilities, and their analyses.

Swin attends inside local windows of each stage's token grid. Every second block shifts the
windows by half a window (the grid is rolled cyclically and the pairs of tokens that only share a
window because the roll wrapped them around the image edge are masked). Patch merging between stages
halves the grid, so a token of stage s stands for ``patch_size * 2**s`` pixels of the input. There is no
CLS token and no (N, N) attention over the whole image: the ViT views built on that do not apply, and
this module gives their window analogues. The forward itself is the family's adapter's
(:mod:`vitviz.adapters.timm_swin`, ``hf_swin``, ``hf_swinv2``), run with the named points of
:mod:`vitviz.adapters.base` and read as a :class:`vitviz.trace.Trace` (:func:`vitviz.analyses.per_image.analysis_trace`: ``attn``
per block, (B, nW, H, T, T), and ``trace.geometry``); the windows' geometry is
:class:`vitviz.adapters.windows.WindowGeometry`.
"""
from __future__ import annotations

import numpy as np
import torch

from .adapters.windows import WindowGeometry

__all__ = ["DISTANCE_CONVENTION", "WindowGeometry", "block_labels", "bounding_box", "heads_padded",
           "mean_window_attention_distance", "query_scope", "uniform_window_distance", "window_attention_for_patch"]

DISTANCE_CONVENTION = ("each query patch's attention over the keys of its window, Σ_k a(q,k)·‖p_q − p_k‖ with p the "
                       "tokens' true centres on the image (tokens that the shifted windows' cyclic roll wrapped "
                       "around the edge are where they are on the image, not where the roll put them), in pixels "
                       "of the model input at the stage's stride; padding tokens (grids not divisible by the "
                       "window) dropped as queries and keys and each row renormalised; averaged over the queries")


def window_attention_for_patch(attention: np.ndarray, geometry: WindowGeometry, row: int, col: int) -> np.ndarray:
    """Where the query at (row, col) of the stage grid looks: its row over its window, put back on the grid.

    attention: (nW, H, T, T) one image's block -> (H, gh, gw); zero outside the window and on keys
    the shift mask hides (up to exp(-100)); keys in padding have no place on the image and are
    left out, so a row there sums to less than 1.
    """
    w, t = geometry.slot_of(row, col)
    positions = geometry.token_positions()[w]  # (T, 2)
    real = positions[:, 0] >= 0
    out = np.zeros((attention.shape[1], *geometry.grid_size), dtype=np.float32)
    out[:, positions[real, 0], positions[real, 1]] = attention[w, :, t][:, real]
    return out


def query_scope(geometry: WindowGeometry, row: int, col: int) -> np.ndarray:
    """(gh, gw) bool: the tokens the query at (row, col) can attend to in this block (its window, minus
    what the shift mask hides)."""
    w, t = geometry.slot_of(row, col)
    positions = geometry.token_positions()[w]
    keys = geometry.keys_allowed()[w, t]
    scope = np.zeros(geometry.grid_size, dtype=bool)
    scope[positions[keys, 0], positions[keys, 1]] = True
    return scope


def _pair_distances(geometry: WindowGeometry) -> np.ndarray:
    """(nW, T, T) pixel distances between the true centres of every pair of slots in each window."""
    centres = (geometry.token_positions() + 0.5) * np.asarray(geometry.stride, dtype=np.float64)
    return np.sqrt(((centres[:, :, None] - centres[:, None, :]) ** 2).sum(-1))


def mean_window_attention_distance(attention: np.ndarray | torch.Tensor, geometry: WindowGeometry) -> np.ndarray:
    """Mean attention distance of one block per image and head, in pixels of the model input.

    attention: (B, nW, H, T, T) -> (B, H). See :data:`DISTANCE_CONVENTION`.
    """
    a = attention.double() if isinstance(attention, torch.Tensor) else torch.from_numpy(np.array(attention, np.float64))
    real = torch.as_tensor(geometry.token_positions()[..., 0] >= 0)  # (nW, T)
    a = a * real[None, :, None, None, :]
    d = torch.as_tensor(_pair_distances(geometry))
    per_query = torch.einsum("bwhqk,wqk->bwhq", a, d) / a.sum(-1).clamp_min(1e-300)
    weights = real[None, :, None, :].double()
    return ((per_query * weights).sum((1, 3)) / weights.sum()).numpy()


def uniform_window_distance(geometry: WindowGeometry) -> float:
    """The reference: a head attending uniformly to every key its query can reach in this block, pixels."""
    allowed = geometry.keys_allowed().astype(np.float64)
    uniform = allowed / np.maximum(allowed.sum(-1, keepdims=True), 1)
    return float(mean_window_attention_distance(uniform[None, :, None], geometry)[0, 0])


def block_labels(geometry: list[WindowGeometry]) -> list[str]:
    """One short label per block for pickers: ``"3 · stage 2.1 · shifted"`` (1-based)."""
    return [f"{g.index + 1} · stage {g.stage + 1}.{g.block + 1} · {'shifted' if g.shifted else 'regular'}"
            for g in geometry]


def heads_padded(per_block: list[np.ndarray]) -> np.ndarray:
    """Per-block values over heads (stages have different head counts) as one array, NaN-padded.

    per_block: blocks x (..., H_b) -> (..., blocks, max H_b).
    """
    width = max(v.shape[-1] for v in per_block)
    padded = [np.concatenate([v, np.full((*v.shape[:-1], width - v.shape[-1]), np.nan)], axis=-1) for v in per_block]
    return np.stack(padded, axis=-2)


def bounding_box(region: np.ndarray, margin: int = 0) -> tuple[slice, slice]:
    """(rows, cols) slices of the smallest box around a non-empty (gh, gw) bool region, widened by
    ``margin`` cells and kept inside the grid. A query's reach (:func:`query_scope`) is always one
    rectangle on the image: a shifted window's regions each map back to one band of rows and columns."""
    rows, cols = np.flatnonzero(region.any(axis=1)), np.flatnonzero(region.any(axis=0))
    gh, gw = region.shape
    return (slice(max(rows[0] - margin, 0), min(rows[-1] + margin + 1, gh)),
            slice(max(cols[0] - margin, 0), min(cols[-1] + margin + 1, gw)))
