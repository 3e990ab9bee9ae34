"""Shared types that know no model family: what a model reads and what fixes its attention's size.

Family modules (:mod:`vitviz.adapters`) and analyses both import these; this module imports
nothing of vitviz, so no import circle runs through it. What a forward saw is a
:class:`vitviz.trace.Trace`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from PIL import Image



@dataclass
class ModelInput:
    """A batch ready for the model.

    Attributes:
        tensor: (B, 3, H, W) float32, normalised with the model's mean/std.
        images: the exact model-input images (after resize and crop), RGB, H x W: overlays go on these.
        sources: what each image was before preprocessing, when known (:class:`vitviz.io.images.LoadedImage`: the
            name, the file's SHA-256 and notes on its decoding), as settings.json records it; None otherwise.
    """

    tensor: torch.Tensor
    images: list[Image.Image]
    sources: list | None = None


def to_model_input(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The batch on the model's device and in its dtype."""
    param = next(model.parameters())
    return images.to(device=param.device, dtype=param.dtype)


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


@dataclass(frozen=True)
class HFModelType:
    """How a transformers ``config.model_type`` is built: what readers call it, its class without a head,
    and the classifier classes accepted from ``config.architectures``. An adapter that reads the type lists
    it in ``Adapter.hf_model_types``; :mod:`vitviz.sources.hf` loads every listed type."""

    label: str
    base: str
    heads: tuple[str, ...] = ()


FLOAT32_BYTES = 4  # capture stores attention as float32 whatever the model's precision


@dataclass(frozen=True)
class Architecture:
    """What fixes the attention's size: depth, heads, patch size, prefix tokens, the model's own input size."""

    depth: int
    heads: int
    patch: tuple[int, int]
    prefix_tokens: int
    default_size: int

    def tokens(self, img_size: int) -> int:
        """N for a square input of ``img_size`` pixels (timm's grid: size // patch per side)."""
        return (img_size // self.patch[0]) * (img_size // self.patch[1]) + self.prefix_tokens

    def attention_bytes(self, img_size: int) -> int:
        """Bytes of one image's attention, L * H * N * N float32."""
        n = self.tokens(img_size)
        return self.depth * self.heads * n * n * FLOAT32_BYTES

    def composition(self, img_size: int) -> str:
        """What the bytes are made of, for the refusal sentence."""
        n = self.tokens(img_size)
        return f"{self.depth} layers x {self.heads} heads x {n}x{n} tokens x 4 bytes"

    def largest_size(self, limit_bytes: int, step: int | None = None) -> int | None:
        """The largest multiple of ``step`` (default the patch height) whose attention fits ``limit_bytes``."""
        step = step or self.patch[0]
        size = step
        if self.attention_bytes(size) > limit_bytes:
            return None
        while self.attention_bytes(size + step) <= limit_bytes:
            size += step
        return size


@dataclass(frozen=True)
class WindowArchitecture(Architecture):
    """A Swin model: attention only inside windows, (nW, H, T, T) per block (see :mod:`vitviz.swin`).

    stages: (blocks, heads, window side) per stage; ``depth`` and ``heads`` are the totals.
    """

    stages: tuple[tuple[int, int, int], ...] = ()

    def attention_bytes(self, img_size: int) -> int:
        """Bytes of one image's window attention: per block (grid padded to whole windows)² x H x T float32."""
        total, grid = 0, img_size // self.patch[0]
        for s, (blocks, heads, window) in enumerate(self.stages):
            grid = grid if s == 0 else (grid + 1) // 2  # patch merging halves the grid, rounding up
            side = min(window, grid)  # timm shrinks a window larger than its stage's grid
            padded = -(-grid // side) * side
            total += blocks * padded * padded * heads * side * side * FLOAT32_BYTES
        return total

    def composition(self, img_size: int) -> str:
        return f"{self.depth} blocks of window attention in {len(self.stages)} stages, 4 bytes a weight"
