"""Position-embedding similarity (ViT paper Fig. 7 centre)."""
from __future__ import annotations

import numpy as np
import torch

from .layout import TokenLayout


def patch_position_embeddings(model, layout: TokenLayout, grid_size: tuple[int, int] | None = None) -> np.ndarray:
    """The learned position embedding of every patch position: (gh * gw, D).

    Prefix rows (CLS etc.) are dropped; ``no_embed_class`` models have none. With ``grid_size``
    the grid is resampled as timm does when such a model runs at another resolution (the
    starting point of a higher-resolution fine-tune).

    Raises:
        ValueError: the model has no learned absolute position embedding.
    """
    from timm.layers import resample_abs_pos_embed

    pos = getattr(model, "pos_embed", None)
    if not isinstance(pos, torch.Tensor) or pos.ndim != 3:
        raise ValueError("This model has no learned absolute position embedding (e.g. RoPE), so there is "
                         "no position-embedding similarity to show.")
    grid = pos.detach().float().cpu()[:, layout.pos_embed_prefix_rows:]
    if grid_size is not None and tuple(grid_size) != layout.grid_size:
        grid = resample_abs_pos_embed(grid, new_size=list(grid_size), old_size=list(layout.grid_size),
                                      num_prefix_tokens=0)
    return grid[0].numpy()


def position_embedding_similarity(embeddings: np.ndarray, grid_size: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of each position's embedding with every other.

    embeddings: (gh * gw, D) in raster order -> (gh, gw, gh, gw); [i, j] is the map of position (i, j).
    """
    e = embeddings.astype(np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    gh, gw = grid_size
    return (e @ e.T).reshape(gh, gw, gh, gw)
