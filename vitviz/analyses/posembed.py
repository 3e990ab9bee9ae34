"""Position-embedding similarity (ViT paper Fig. 7 centre)."""
from __future__ import annotations

import numpy as np

from ..layout import TokenLayout
from ..types import NativePosEmbed

__all__ = ["NativePosEmbed", "patch_position_embeddings", "position_at", "position_embedding_similarity",
           "position_encoding", "position_fraction"]


def patch_position_embeddings(model, layout: TokenLayout, grid_size: tuple[int, int] | None = None,
                              native: NativePosEmbed | None = None) -> np.ndarray:
    """The learned position embedding of every patch position: (gh * gw, D).

    Prefix rows (CLS etc.) are dropped; ``no_embed_class`` models have none. Without
    ``grid_size`` (or at the model's own grid) these are the rows the model runs with. With
    another ``grid_size`` they are resampled from the ``native`` weights with the loader's own
    settings, so they equal what loading the model at that resolution gives (the starting point
    of a higher-resolution fine-tune). Without ``native`` the model's rows count as native
    (timm's default bicubic with antialiasing).

    Raises:
        ViewNotApplicable: the model has no learned absolute position embedding.
    """
    from ..adapters import adapter_for

    own = adapter_for(model).native_pos_embed(model, layout)  # the table as the model runs it
    if own is None:
        raise _no_table(model)
    if grid_size is None or tuple(grid_size) == layout.grid_size:
        return own.grid_rows(layout.grid_size).numpy()
    return (native or own).grid_rows(grid_size).numpy()


def position_encoding(model) -> str:
    """How a model encodes position, in words, from its family's adapter."""
    from ..adapters import adapter_for

    return adapter_for(model).position_encoding(model)


def _no_table(model):
    from ..errors import ViewNotApplicable

    how = position_encoding(model)
    how = (f"it encodes position with a {how.replace(' + ', ' and a ')} inside its attention" if how != "none"
           else "it has no position encoding")
    return ViewNotApplicable(f"This model has no learned absolute position embedding ({how}), so the position-"
                             "embedding similarity of the ViT paper (Fig. 7 centre) does not apply to it.")


def position_embedding_similarity(embeddings: np.ndarray, grid_size: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of each position's embedding with every other.

    embeddings: (gh * gw, D) in raster order -> (gh, gw, gh, gw); [i, j] is the map of position (i, j).
    """
    e = embeddings.astype(np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    gh, gw = grid_size
    return (e @ e.T).reshape(gh, gw, gh, gw)


def resampled_rows(rows: int, stored_rows: int | None, most: int) -> int:
    """The most grid rows worth resampling a position table to, for a model whose own grid has ``rows`` rows and whose
    stored table ``stored_rows`` (None when the table is the grid's own): twice the model's grid or the stored one,
    whichever is larger, capped at ``most`` (never below ``rows``)."""
    return min(max(2 * rows, stored_rows or rows), max(rows, most))


def grid_with_rows(rows: int, grid_size: tuple[int, int]) -> tuple[int, int]:
    """A grid of ``rows`` rows with the aspect of ``grid_size`` (columns rounded down)."""
    return rows, rows * grid_size[1] // grid_size[0]


def position_at(fraction: tuple[float, float], grid_size: tuple[int, int]) -> tuple[int, int]:
    """The (row, col), 0-based, of the grid cell holding a point given as fractions of the grid's height
    and width; clamped, so a position chosen on one grid maps to the same place on another."""
    return tuple(min(max(int(f * g), 0), g - 1) for f, g in zip(fraction, grid_size))


def position_fraction(position: tuple[int, int], grid_size: tuple[int, int]) -> tuple[float, float]:
    """The centre of cell (row, col) as fractions of the grid's height and width (inverse of position_at)."""
    return tuple((p + 0.5) / g for p, g in zip(position, grid_size))
