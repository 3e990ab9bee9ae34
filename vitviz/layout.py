"""Where each token of a ViT sequence comes from: the one place that knows the model's layout.

Every analysis takes a :class:`TokenLayout` instead of re-deriving prefix tokens or the grid
from the sequence length (never ``sqrt(N)``: grids need not be square, prefixes vary).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .errors import ModelNotSupported


# How a patch is named on every page (TokenLayout.token_name), said once where the app explains it.
PATCH_NUMBERING = ("Patch numbers count from 0 in raster order, row by row (the index into the downloads' patch "
                   "arrays and the link's patch=); rows and columns count from 1.")


def patch_stride(patch_embed) -> tuple[int, int]:
    """Pixels of the model input per patch token: (sh, sw).

    A plain ViT's is its patch size. A hybrid's (timm ``HybridEmbed``: a CNN stem, then patches
    of its feature map) is the stem's reduction times the patch size on the feature map, e.g.
    16 x 1 for R50+ViT-B/16.
    """
    ratio = getattr(patch_embed, "feature_ratio", (1, 1))
    return (int(ratio[0]) * int(patch_embed.patch_size[0]), int(ratio[1]) * int(patch_embed.patch_size[1]))


@dataclass(frozen=True)
class TokenLayout:
    """Layout of the token sequence ``[prefix tokens..., patch tokens in raster order]``.

    Args:
        prefix_tokens: names of the tokens before the patches, in sequence order:
            ``"cls"``, ``"dist"`` (distilled DeiT) and ``"reg0"``, ``"reg1"``, ... (registers).
        grid_size: (gh, gw) patch rows and columns.
        patch_size: (ph, pw) pixels of the model input covered by one patch token (its stride).
        global_pool: timm pooling of the head: ``"token"``, ``"avg"``, ``"map"`` or ``""``.
        pos_embed_prefix_rows: rows of ``pos_embed`` that belong to prefix tokens
            (0 for ``no_embed_class`` models such as DeiT-III and DINOv2 with registers).
    """

    prefix_tokens: tuple[str, ...]
    grid_size: tuple[int, int]
    patch_size: tuple[int, int]
    global_pool: str
    pos_embed_prefix_rows: int

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.prefix_tokens)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    @property
    def has_class_token(self) -> bool:
        return "cls" in self.prefix_tokens

    @property
    def cls_index(self) -> int | None:
        return self.prefix_tokens.index("cls") if self.has_class_token else None

    @property
    def centre_patch(self) -> int:
        """The patch (0-based raster) at the grid's centre; below and right of it on an even side."""
        return (self.grid_size[0] // 2) * self.grid_size[1] + self.grid_size[1] // 2

    @property
    def patch_slice(self) -> slice:
        return slice(self.num_prefix_tokens, self.num_tokens)

    def patch_centres(self) -> np.ndarray:
        """Pixel coordinates (y, x) of every patch centre in raster order: (num_patches, 2)."""
        gh, gw = self.grid_size
        ph, pw = self.patch_size
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        return np.stack([(rows.ravel() + 0.5) * ph, (cols.ravel() + 0.5) * pw], axis=1)

    def to_grid(self, patch_values: np.ndarray) -> np.ndarray:
        """Reshape values over patch tokens to the grid: (..., num_patches) -> (..., gh, gw)."""
        if patch_values.shape[-1] != self.num_patches:
            raise ValueError(f"expected {self.num_patches} patch values, got {patch_values.shape[-1]}")
        return patch_values.reshape(*patch_values.shape[:-1], *self.grid_size)

    def patch_grid(self, token_values: np.ndarray) -> np.ndarray:
        """Values over the whole sequence on the patch grid, the prefix tokens left out: (..., num_tokens) ->
        (..., gh, gw)."""
        if token_values.shape[-1] != self.num_tokens:
            raise ValueError(f"expected {self.num_tokens} token values, got {token_values.shape[-1]}")
        return self.to_grid(token_values[..., self.patch_slice])

    def patch_at(self, x: float, y: float, scale: float = 1.0) -> int:
        """The patch under pixel (x, y) of the model input shown ``scale`` times enlarged (raster index)."""
        row = min(max(int(y / scale // self.patch_size[0]), 0), self.grid_size[0] - 1)
        col = min(max(int(x / scale // self.patch_size[1]), 0), self.grid_size[1] - 1)
        return row * self.grid_size[1] + col

    def patch_from(self, index: int, grid: tuple[int, int]) -> int:
        """The patch of this grid that holds the centre of patch ``index`` (raster) of ``grid``.

        Both grids cover the same model-input image, so a selection keeps its place in the picture
        when the resolution changes: patch (8, 8) of 16x16 (centre at 8.5/16 of each side) is patch
        (19, 19) of 37x37 (8.5/16 * 37 = 19.66).
        """
        gh, gw = grid
        row, col = divmod(int(index), gw)
        new_h, new_w = self.grid_size
        # Exact integer arithmetic: floor((row + 1/2) / gh * new_h) = floor((2 row + 1) new_h / (2 gh)).
        new_row = min((2 * row + 1) * new_h // (2 * gh), new_h - 1)
        new_col = min((2 * col + 1) * new_w // (2 * gw), new_w - 1)
        return new_row * new_w + new_col

    def token_name(self, index: int) -> str:
        """A readable name: ``"cls"``, ``"reg2"`` or ``"patch 17 (row 2, col 2)"`` on a 16-wide grid.

        The patch number is the 0-based raster index (as in arrays); row and column count from 1,
        as everywhere on screen.
        """
        if index < self.num_prefix_tokens:
            return self.prefix_tokens[index]
        p = index - self.num_prefix_tokens
        return f"patch {p} (row {p // self.grid_size[1] + 1}, col {p % self.grid_size[1] + 1})"

    def to_dict(self) -> dict:
        return asdict(self) | {"num_prefix_tokens": self.num_prefix_tokens, "num_tokens": self.num_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> "TokenLayout":
        """The layout :meth:`to_dict` wrote (its derived counts are ignored)."""
        return cls(prefix_tokens=tuple(data["prefix_tokens"]), grid_size=tuple(data["grid_size"]),
                   patch_size=tuple(data["patch_size"]), global_pool=data["global_pool"],
                   pos_embed_prefix_rows=int(data["pos_embed_prefix_rows"]))

    @classmethod
    def from_model(cls, model, input_hw: tuple[int, int] | None = None) -> "TokenLayout":
        """Read the layout from a timm VisionTransformer (or VisionTransformerDistilled), Eva or Beit.

        Args:
            model: the timm model.
            input_hw: the (H, W) of the input; default the model's configured image size.
        """
        patch_embed = model.patch_embed
        if input_hw is None or tuple(input_hw) == tuple(patch_embed.img_size):
            grid = tuple(patch_embed.grid_size)
        else:
            grid = tuple(patch_embed.dynamic_feat_size(tuple(input_hw)))
        stride = patch_stride(patch_embed)
        prefix = []
        if getattr(model, "cls_token", None) is not None:
            prefix.append("cls")
        if getattr(model, "dist_token", None) is not None:
            prefix.append("dist")
        registers = getattr(model, "num_reg_tokens", None)
        if registers is None:  # Eva keeps only the parameter: reg_token (1, R, D)
            reg_token = getattr(model, "reg_token", None)
            registers = 0 if reg_token is None else reg_token.shape[1]
        prefix += [f"reg{i}" for i in range(registers)]
        if len(prefix) != model.num_prefix_tokens:
            raise ModelNotSupported(f"token layout of {type(model).__name__} not understood: "
                                    f"{model.num_prefix_tokens} prefix tokens, found {prefix}")
        return cls(
            prefix_tokens=tuple(prefix),
            grid_size=(int(grid[0]), int(grid[1])),
            patch_size=(stride[0], stride[1]),
            global_pool=str(model.global_pool),
            pos_embed_prefix_rows=0 if getattr(model, "no_embed_class", False) else len(prefix),
        )
