"""Position-embedding similarity (ViT paper Fig. 7 centre)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .layout import TokenLayout


@dataclass(frozen=True)
class NativePosEmbed:
    """The position embedding as the weights store it, and how the loader fits it to other grids.

    A model run at another resolution gets its grid by resampling these native rows, never the
    already-resampled ones: resampling twice (37x37 -> 16x16 -> 24x24) is not what a fine-tune
    at 24x24 would start from.

    Args:
        pos_embed: (1, prefix_rows + gh * gw, D) float32 on the CPU, as stored in the weights.
        grid_size: (gh, gw) of the stored grid.
        prefix_rows: rows before the grid (CLS etc.; 0 for ``no_embed_class`` models).
        interpolation: ``F.interpolate`` mode the loader uses (``"bicubic"``, ``"bilinear"``).
        antialias: whether the loader resamples with antialiasing.
    """

    pos_embed: torch.Tensor
    grid_size: tuple[int, int]
    prefix_rows: int
    interpolation: str = "bicubic"
    antialias: bool = True

    @classmethod
    def from_weights(cls, pos_embed: torch.Tensor, prefix_rows: int, grid_size: tuple[int, int] | None = None,
                     interpolation: str = "bicubic", antialias: bool = True) -> NativePosEmbed | None:
        """Keep ``pos_embed`` (1, N, D) as the native grid; None when its grid cannot be told.

        Without ``grid_size`` the grid is taken square, as timm assumes for checkpoints.
        """
        if not isinstance(pos_embed, torch.Tensor) or pos_embed.ndim != 3:
            return None
        if grid_size is None:
            side = math.isqrt(pos_embed.shape[1] - prefix_rows)
            if side * side != pos_embed.shape[1] - prefix_rows:
                return None
            grid_size = (side, side)
        return cls(pos_embed.detach().to("cpu", torch.float32).clone(), tuple(int(g) for g in grid_size),
                   prefix_rows, interpolation, antialias)

    def to_dict(self) -> dict:
        return {"native_grid": list(self.grid_size), "interpolation": self.interpolation,
                "antialias": self.antialias, "align_corners": False}

    def grid_rows(self, grid_size: tuple[int, int]) -> torch.Tensor:
        """The grid rows fitted to ``grid_size`` as the loader fits them: (gh * gw, D)."""
        from timm.layers import resample_abs_pos_embed

        grid = self.pos_embed[:, self.prefix_rows:]
        if tuple(grid_size) != self.grid_size:
            grid = resample_abs_pos_embed(grid, new_size=list(grid_size), old_size=list(self.grid_size),
                                          num_prefix_tokens=0, interpolation=self.interpolation,
                                          antialias=self.antialias)
        return grid[0]


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
    from .capture import is_hf_model

    if is_hf_model(model):
        from . import hf

        # transformers keeps the stored grid and fits it to the input in every forward.
        native = native or hf.native_pos_embed(model, layout)
        if native is None:
            raise _no_table(model)
        return native.grid_rows(grid_size or layout.grid_size).numpy()
    pos = getattr(model, "pos_embed", None)
    if not isinstance(pos, torch.Tensor) or pos.ndim != 3:
        raise _no_table(model)
    if grid_size is None or tuple(grid_size) == layout.grid_size:
        return pos.detach().float().cpu()[0, layout.pos_embed_prefix_rows:].numpy()
    if native is None:
        native = NativePosEmbed.from_weights(pos, layout.pos_embed_prefix_rows, layout.grid_size)
    return native.grid_rows(grid_size).numpy()


def position_encoding(model) -> str:
    """How a model encodes position, in words, from its family's adapter."""
    from .capture import is_hf_model

    if is_hf_model(model):
        from .hf import position_encoding as hf_position_encoding

        return hf_position_encoding(model)
    from . import swin

    if swin.is_swin(model):
        return swin.POSITION_ENCODING
    from .timm_families import model_reader

    return model_reader(model).position(model)


def _no_table(model):
    from .errors import ViewNotApplicable

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


def position_at(fraction: tuple[float, float], grid_size: tuple[int, int]) -> tuple[int, int]:
    """The (row, col), 0-based, of the grid cell holding a point given as fractions of the grid's height
    and width; clamped, so a position chosen on one grid maps to the same place on another."""
    return tuple(min(max(int(f * g), 0), g - 1) for f, g in zip(fraction, grid_size))


def position_fraction(position: tuple[int, int], grid_size: tuple[int, int]) -> tuple[float, float]:
    """The centre of cell (row, col) as fractions of the grid's height and width (inverse of position_at)."""
    return tuple((p + 0.5) / g for p, g in zip(position, grid_size))
