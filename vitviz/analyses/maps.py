"""Raw attention views: one layer, one head, one query, as a map over the patch grid."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import OptionError, ViewNotApplicable
from ..layout import TokenLayout
from ..tensors import as_tensor, to_host


def query_attention_map(attention: np.ndarray, layout: TokenLayout, layer: int, head: int,
                        query: str | int = "cls") -> np.ndarray:
    """Attention of a query token over the patch keys.

    Args:
        attention: (L, H, N, N) attention probabilities of one image.
        layout: token layout of the sequence.
        layer, head: which layer and head.
        query: ``"cls"`` (the class token's row), ``"mean"`` (mean over patch queries), or a
            patch index in raster order.

    Returns:
        (gh, gw) attention weights on patch keys (prefix keys left out, not renormalised).
    """
    rows = np.asarray(attention[layer, head])
    if query == "cls":
        if layout.cls_index is None:
            raise ViewNotApplicable("this model has no class token; use query='mean' or a patch index")
        row = rows[layout.cls_index]
    elif query == "mean":
        row = rows[layout.patch_slice].mean(axis=0)
    else:
        row = rows[layout.num_prefix_tokens + int(query)]
    return layout.patch_grid(row)


def key_attention_map(attention: np.ndarray, layout: TokenLayout, layer: int, head: int, key: int) -> np.ndarray:
    """The transposed view: how much each patch query attends *to* one key patch.

    attention: (L, H, N, N); key: patch index in raster order -> (gh, gw).
    """
    column = np.asarray(attention[layer, head])[layout.patch_slice, layout.num_prefix_tokens + int(key)]
    return layout.to_grid(column)


def threshold_mask(grid_map: np.ndarray, keep: float = 0.6) -> np.ndarray:
    """DINO-style mask: the fewest highest-weight patches that hold ``keep`` of the map's mass.

    grid_map: (gh, gw) non-negative -> (gh, gw) bool.
    """
    if not 0 < keep <= 1:
        raise OptionError(f"the kept share of attention must be in (0, 1], not {keep}")
    flat = grid_map.ravel().astype(np.float64)
    order = np.argsort(-flat, kind="stable")
    cumulative = np.cumsum(flat[order]) / flat.sum()
    n_kept = int(np.searchsorted(cumulative, keep - 1e-12)) + 1
    mask = np.zeros(flat.shape, dtype=bool)
    mask[order[:n_kept]] = True
    return mask.reshape(grid_map.shape)


def _entropy(rows: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row renormalised: (..., K) -> (..., ) float64.

    Terms in the rows' own precision (float32 logs are vectorised on the CPU, float64 ones are
    ~5x slower), summed in float64. For float32 rows of K keys that is within u·((K+3)·log K + K) nats
    of an all-float64 computation (u = 2**-24; 1.2e-4 nats at K = 256, the derivation is in the tests'
    ``conftest.entropy_float32_atol``); about 5e-7 relative is typical.
    """
    p = rows / rows.sum(dim=-1, keepdim=True)
    # 0 log 0 = 0: the clamp turns log 0 into a finite number that the 0 then cancels.
    return -(p * torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))).sum(dim=-1, dtype=torch.float64)


def head_entropy(attention: np.ndarray | torch.Tensor, layout: TokenLayout) -> np.ndarray:
    """Mean entropy (nats) of the patch queries' attention over patch keys (renormalised).

    attention: (L, H, N, N), numpy or a tensor on any device (computed there) -> (L, H).
    Uniform attention gives log(num_patches); one key gives 0.
    """
    # One layer at a time: never a copy of the whole (L, H, N, N) array.
    return to_host(torch.stack([_entropy(layer[..., layout.patch_slice, layout.patch_slice]).mean(dim=-1)
                                for layer in as_tensor(attention)]))


def cls_focus(attention: np.ndarray | torch.Tensor, layout: TokenLayout) -> np.ndarray:
    """How concentrated the readout's attention over patches is: 1 - entropy / log(num_patches).

    The readout is the CLS row, or the mean of the patch rows for models without CLS.
    attention: (L, H, N, N), numpy or a tensor on any device (computed there) -> (L, H) in [0, 1]:
    1 = all on one patch, 0 = uniform.
    """
    return to_host(cls_focus_rows(as_tensor(attention), layout))


def cls_focus_rows(attention: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """:func:`cls_focus` of a tensor (..., N, N) -> (...) float64 on its device."""
    if layout.has_class_token:
        row = attention[..., layout.cls_index, layout.patch_slice].double()
    else:
        row = attention[..., layout.patch_slice, layout.patch_slice].mean(dim=-2, dtype=torch.float64)
    return 1 - _entropy(row) / np.log(layout.num_patches)


def layer_maps(attention: np.ndarray, layout: TokenLayout, layer: int, query: str | int = "cls",
               direction: str = "query") -> np.ndarray:
    """Every head of one layer as maps: (L, H, N, N) -> (H, gh, gw).

    direction ``"query"``: where ``query`` (``"cls"``, ``"mean"`` or a patch) looks;
    ``"key"``: how much each patch query attends to the patch ``query`` (needs a patch index).
    """
    heads = range(attention.shape[1])
    if direction == "key":
        if not isinstance(query, (int, np.integer)):
            raise OptionError("the keys -> query direction needs a patch: click one on the image")
        return np.stack([key_attention_map(attention, layout, layer, h, int(query)) for h in heads])
    return np.stack([query_attention_map(attention, layout, layer, h, query) for h in heads])


RANKINGS = {
    "entropy (low = focused)": "entropy",
    "CLS focus (high = focused)": "cls_focus",
    "mean distance (px)": "distance",
}


def mean_head_map(attention: np.ndarray, layout: TokenLayout, layer: int, query: str | int = "cls") -> np.ndarray:
    """One layer's attention of a query over the patch keys, averaged over heads (not renormalised).

    attention: (L, H, N, N); query as in :func:`query_attention_map` -> (gh, gw) in the attention's precision.
    """
    return layer_maps(attention, layout, layer, query).mean(axis=0)


def head_scores(attention: np.ndarray | torch.Tensor, layout: TokenLayout, distance: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-head scores for ranking: entropy, CLS focus and (if given) mean distance, each (L, H)."""
    scores = {"entropy": head_entropy(attention, layout), "cls_focus": cls_focus(attention, layout)}
    if distance is not None:
        scores["distance"] = distance
    return scores


def head_notes(scores: dict[str, np.ndarray], distance: np.ndarray) -> np.ndarray:
    """Each head's note under its tile: entropy (nats), CLS focus (share) and mean attention distance (pixels).

    scores: :func:`head_scores` (``"entropy"`` and ``"cls_focus"``, each (L, H)); distance: (L, H) pixels
    -> (L, H) object array of str, e.g. ``"H 4.12 nats · focus 0.31 · 57 px"``.
    """
    entropy, focus = np.asarray(scores["entropy"]), np.asarray(scores["cls_focus"])
    notes = np.empty(entropy.shape, dtype=object)
    for (layer, head), h in np.ndenumerate(entropy):
        notes[layer, head] = f"H {h:.2f} nats · focus {focus[layer, head]:.2f} · {distance[layer, head]:.0f} px"
    return notes


def rank_heads(scores: np.ndarray, descending: bool) -> np.ndarray:
    """Head indices of one layer ordered by score: (H,) -> (H,)."""
    order = np.argsort(scores, kind="stable")
    return order[::-1] if descending else order
