"""Raw attention views: one layer, one head, one query, as a map over the patch grid."""
from __future__ import annotations

import numpy as np

from .layout import TokenLayout


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
            raise ValueError("this model has no class token; use query='mean' or a patch index")
        row = rows[layout.cls_index]
    elif query == "mean":
        row = rows[layout.patch_slice].mean(axis=0)
    else:
        row = rows[layout.num_prefix_tokens + int(query)]
    return layout.to_grid(row[layout.patch_slice])
