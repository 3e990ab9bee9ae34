"""Window attention, shared by every window family (timm Swin, Hugging Face Swin V1 and V2).

A window block attends inside local windows of its stage's token grid. Every second block shifts
the windows by half a window: the grid is rolled cyclically, padded up to whole windows and
partitioned, and the pairs of tokens that only share a window because the roll wrapped them around
the image edge are masked (score -100). Libraries differ in one order: timm rolls then pads, Hugging
Face pads then rolls (so its padding is rolled too). :class:`WindowGeometry` holds one block's
windows on the image and does the partition, the reverse and the mask for both orders;
:func:`block` runs one block with the named points of :mod:`vitviz.adapters.base` in window shapes:
``q``, ``k``, ``v``, ``z`` (B, nW, H, T, d), ``scores``, ``attn`` (B, nW, H, T, T), token points
(B, gh, gw, D).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import FileContentError, OptionError
from ..layout import TokenLayout
from . import common
from .base import Hooks, point_name

PAD_FIRST = "pads_before_rolling"  # settings.json's name of WindowGeometry.pad_first
MASKED = -100.0  # the score the libraries give a masked pair (exp(-100) ~ 4e-44: zero in float32 after softmax)


@dataclass(frozen=True, eq=False)
class WindowGeometry:
    """Where one window block's windows lie on the image.

    Args:
        index: 0-based block across all stages.
        stage: 0-based stage; ``block``: 0-based block within the stage.
        grid_size: (gh, gw) tokens of the stage's grid.
        window_size: (wh, ww) tokens per window.
        shift: (sh, sw) the cyclic shift of the grid before partitioning ((0, 0): regular windows).
        stride: (sy, sx) pixels of the model input between neighbouring tokens of the stage.
        allowed: (nW, T, T) bool, the key slots each query slot may attend to (False: masked by the
            shift mask); None when the block has no mask.
        pad_first: the grid is padded before it is rolled (Hugging Face) rather than after (timm).
    """

    index: int
    stage: int
    block: int
    grid_size: tuple[int, int]
    window_size: tuple[int, int]
    shift: tuple[int, int]
    stride: tuple[int, int]
    allowed: np.ndarray | None = field(default=None, repr=False)
    pad_first: bool = False

    @classmethod
    def build(cls, index: int, stage: int, block: int, grid_size, window_size, shift, stride,
              pad_first: bool = False) -> "WindowGeometry":
        """A geometry with its ``allowed`` pairs from :meth:`shift_mask`."""
        g = cls(index, stage, block, tuple(int(v) for v in grid_size), tuple(int(v) for v in window_size),
                tuple(int(v) for v in shift), tuple(int(v) for v in stride), None, pad_first)
        mask = g.shift_mask()
        return g if mask is None else cls(g.index, g.stage, g.block, g.grid_size, g.window_size, g.shift, g.stride,
                                          (mask == 0).numpy(), pad_first)

    @property
    def padded_size(self) -> tuple[int, int]:
        """The grid padded up to whole windows, as the libraries partition it."""
        return tuple(-(-g // w) * w for g, w in zip(self.grid_size, self.window_size))

    @property
    def num_windows(self) -> int:
        hp, wp = self.padded_size
        return (hp // self.window_size[0]) * (wp // self.window_size[1])

    @property
    def window_area(self) -> int:
        return self.window_size[0] * self.window_size[1]

    @property
    def shifted(self) -> bool:
        return any(self.shift)

    @property
    def layout(self) -> TokenLayout:
        """The stage's grid as a token layout: no prefix tokens, ``stride`` pixels per token."""
        return TokenLayout(prefix_tokens=(), grid_size=self.grid_size, patch_size=self.stride, global_pool="avg",
                           pos_embed_prefix_rows=0)

    def describe(self) -> str:
        """``"block 3 · stage 2, block 1 · regular 7×7 windows · 8 px stride"`` (1-based, as on screen)."""
        windows = f"{'shifted' if self.shifted else 'regular'} {self.window_size[0]}×{self.window_size[1]} windows"
        if self.shifted:
            windows += f" (shift {self.shift[0]},{self.shift[1]})"
        return (f"block {self.index + 1} · stage {self.stage + 1}, block {self.block + 1} · {windows} · "
                f"{self.stride[0]} px stride")

    # --- the partition, as the libraries do it -------------------------------------------------
    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """(B, gh, gw, C) -> (B, nW, T, C): rolled by -shift and padded (in the family's order), windows in
        raster order, slots in raster order inside a window."""
        (gh, gw), (hp, wp) = self.grid_size, self.padded_size
        if self.pad_first:
            x = F.pad(x, (0, 0, 0, wp - gw, 0, hp - gh))
        if self.shifted:
            x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        if not self.pad_first:
            x = F.pad(x, (0, 0, 0, wp - gw, 0, hp - gh))
        return self._windows(x)

    def _windows(self, x: torch.Tensor) -> torch.Tensor:
        """(B, hp, wp, C) -> (B, nW, T, C), the libraries' ``window_partition``."""
        (hp, wp), (wh, ww) = self.padded_size, self.window_size
        B, C = x.shape[0], x.shape[-1]
        x = x.view(B, hp // wh, wh, wp // ww, ww, C).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(B, self.num_windows, self.window_area, C)

    def reverse(self, windows: torch.Tensor) -> torch.Tensor:
        """(B, nW, T, C) -> (B, gh, gw, C): the inverse of :meth:`partition` (padding dropped)."""
        (gh, gw), (hp, wp), (wh, ww) = self.grid_size, self.padded_size, self.window_size
        B, C = windows.shape[0], windows.shape[-1]
        x = windows.view(B, hp // wh, wp // ww, wh, ww, C).permute(0, 1, 3, 2, 4, 5).reshape(B, hp, wp, C)
        if not self.pad_first:
            x = x[:, :gh, :gw]
        if self.shifted:
            x = torch.roll(x, shifts=self.shift, dims=(1, 2))
        return x[:, :gh, :gw].contiguous()

    def shift_mask(self, device=None, dtype=torch.float32) -> torch.Tensor | None:
        """(nW, T, T) 0 / -100: the libraries' shift mask over the padded grid (three regions per axis:
        ``[0, P - w)``, ``[P - w, P - s)``, ``[P - s, P)``; pairs from different regions are masked), or None
        for regular windows."""
        if not self.shifted:
            return None
        (hp, wp), (wh, ww), (sh, sw) = self.padded_size, self.window_size, self.shift

        def regions(size, w, s):
            i = torch.arange(size, device=device)
            return (i >= size - w).long() + (i >= size - s).long()

        label = (regions(hp, wh, sh)[:, None] * 3 + regions(wp, ww, sw)[None, :]).to(dtype)
        slots = self._windows(label[None, :, :, None])[0, ..., 0]  # (nW, T): the labels are in the rolled frame
        diff = slots[:, None, :] - slots[:, :, None]
        return torch.zeros_like(diff).masked_fill(diff != 0, MASKED)

    # --- where the slots are on the image -------------------------------------------------------
    def token_positions(self) -> np.ndarray:
        """(nW, T, 2) the true (row, col) on the stage grid of every window slot; (-1, -1) for padding.

        Rolling by -shift puts token ``(i + sh) mod g`` at row i (timm: g the grid; Hugging Face, which pads
        first: g the padded grid, whose rows past the grid are padding), so slots in windows that wrapped
        around hold tokens from the opposite edge.
        """
        (gh, gw), (hp, wp), (wh, ww) = self.grid_size, self.padded_size, self.window_size

        def axis(g, p, s):
            i = np.arange(p)
            if self.pad_first:
                t = (i + s) % p
                return np.where(t < g, t, -1)
            return np.where(i < g, (i + s) % g, -1)

        r, c = np.meshgrid(axis(gh, hp, self.shift[0]), axis(gw, wp, self.shift[1]), indexing="ij")
        pad = (r < 0) | (c < 0)
        grid = np.stack([np.where(pad, -1, r), np.where(pad, -1, c)], axis=-1)  # (hp, wp, 2)
        windows = grid.reshape(hp // wh, wh, wp // ww, ww, 2).transpose(0, 2, 1, 3, 4)
        return windows.reshape(self.num_windows, self.window_area, 2)

    def slot_of(self, row: int, col: int) -> tuple[int, int]:
        """(window, slot) holding the token at (row, col) of the stage grid (0-based)."""
        if not (0 <= row < self.grid_size[0] and 0 <= col < self.grid_size[1]):
            raise OptionError(f"token (row {row}, col {col}) is outside the {self.grid_size} grid of stage "
                              f"{self.stage + 1}")
        hit = np.argwhere((self.token_positions() == (row, col)).all(-1))
        return int(hit[0, 0]), int(hit[0, 1])

    def keys_allowed(self) -> np.ndarray:
        """(nW, T, T) bool: the key slots each query slot can attend to (mask and padding applied)."""
        real = self.token_positions()[..., 0] >= 0
        allowed = np.ones((self.num_windows, self.window_area, self.window_area), bool) if self.allowed is None \
            else self.allowed
        return allowed & real[:, None, :]

    def to_dict(self) -> dict:
        """The geometry as settings.json records it (``window_geometry``); :meth:`from_dict` reads it back."""
        return {"block (0-based, across stages)": self.index, "stage (0-based)": self.stage,
                "block_in_stage (0-based)": self.block, "grid_size": list(self.grid_size),
                "window_size": list(self.window_size), "shift": list(self.shift),
                "stride_px": list(self.stride), "padded_size": list(self.padded_size), PAD_FIRST: self.pad_first}

    @classmethod
    def from_dict(cls, data: dict) -> "WindowGeometry":
        """The geometry :meth:`to_dict` wrote, its ``allowed`` pairs rebuilt (:meth:`build`).

        Raises:
            FileContentError: a record without the padding order (written before vitviz recorded it) of a shifted block
                whose grid is padded, where the order decides which token sits in which slot.
        """
        g = cls.build(data["block (0-based, across stages)"], data["stage (0-based)"], data["block_in_stage (0-based)"],
                      data["grid_size"], data["window_size"], data["shift"], data["stride_px"],
                      bool(data.get(PAD_FIRST, False)))
        if PAD_FIRST not in data and g.shifted and g.padded_size != g.grid_size:
            raise FileContentError(f"block {g.index + 1}'s record lacks {PAD_FIRST!r}: its shifted windows over a "
                                   "padded grid cannot be placed without it")
        return g


def why_not_views(family: str) -> dict[str, str]:
    """View -> the one sentence a window model of ``family`` ("Swin") shows for each view of
    :data:`vitviz.adapters.base.VIEWS` that does not apply (heads, distance, filters and attribution apply)."""
    why = {
        "overview": (f"Token norms, attention sinks, feature PCA and token clusters are not supported yet for window "
                     f"attention ({family}): they read one token sequence at one resolution, and its tokens are "
                     "merged into coarser grids stage by stage; the heads and attention-distance pages show its "
                     "window attention."),
        "rollout": (f"Rollout and attention flow do not apply to window attention ({family}): they chain one (N, N) "
                    "attention matrix per layer and read the CLS token's row, but this model has no CLS token and "
                    "attends only inside local windows that shift between blocks and merge between stages, so there "
                    "is no whole-image matrix to chain."),
        "anatomy": (f"The attention anatomy is not supported yet for window attention ({family}): its steps would "
                    "also need the window partition, the relative position bias and the shift mask; the heads page "
                    "shows each window's attention exactly as the model computes it."),
        "faithfulness": (f"Faithfulness is not supported yet for window attention ({family}): the maps it scores "
                         "(readout attention, rollout, attention flow, gradient rollout) are defined on attention over "
                         "the whole image, and this model's blocks attend only inside local windows."),
        "stats": (f"The per-head statistics are defined on attention over the whole image (layers x heads of one "
                  f"token sequence); the current model attends within windows ({family}): its distances per block "
                  "are on the Attention distance page."),
        "position": (f"The position-embedding view does not apply ({family}): the model has no learned absolute "
                     "position table, only a relative position bias inside each window."),
        "registers": (f"The registers view does not apply ({family}): the model has no register or other prefix "
                      "tokens, only patch tokens in windows."),
    }
    why["readout"] = (f"The direct readout is not supported yet for window attention ({family}): its tokens are "
                      "merged into coarser grids between stages, so a head's write to the pooled vector would also "
                      "have to pass through each patch merging; the logit lens and per-head readout read global "
                      "attention models.")
    why["flow"] = why["rollout"]
    return why


# ---------------------------------------------------------------------------------------------
# The spelled-out window block


@dataclass
class WindowHeads:
    """One block's attention inputs per window, as the dot product sees them.

    Attributes:
        q, k, v: (B, nW, H, T, d) (Swin V2: q and k already L2-normalised).
        scale: what q·k is multiplied by: a float, or a tensor broadcastable to (B, nW, H, T, T) (Swin V2's
            per-head logit scale).
        bias: the relative position bias (1, H, T, T) or (H, T, T), added to the scaled scores.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float | torch.Tensor
    bias: torch.Tensor | None = None


def attention(hooks: Hooks, layer: int, heads: WindowHeads, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q·kᵀ · scale + bias + mask) @ v per window, with the points ``q``, ``k``, ``v``, ``scores``,
    ``attn``, ``z``. mask: (nW, T, T) or None. Returns (B, nW, T, H * d) in v's dtype."""
    q, k, v = (hooks(point_name(n, layer), t) for n, t in (("q", heads.q), ("k", heads.k), ("v", heads.v)))
    qs, kt = hooks.rules.bilinear(q * heads.scale, k.transpose(-2, -1))
    scores = qs @ kt
    if heads.bias is not None:
        scores = scores + heads.bias.reshape(1, 1, *heads.bias.shape[-3:])
    if mask is not None:
        scores = scores + mask[None, :, None].to(scores.dtype)
    scores = hooks(point_name("scores", layer), scores)
    probs = hooks(point_name("attn", layer), hooks.rules.softmax(scores))
    a, vv = hooks.rules.bilinear(probs.to(v.dtype), v)
    z = hooks(point_name("z", layer), a @ vv)
    B, nW, H, T, d = z.shape
    return z.permute(0, 1, 3, 2, 4).reshape(B, nW, T, H * d)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, nW, T, H * d) -> (B, nW, H, T, d)."""
    B, nW, T, C = x.shape
    return x.view(B, nW, T, heads, C // heads).permute(0, 1, 3, 2, 4)


@dataclass(frozen=True)
class BlockParts:
    """What a window block is made of, read from the family's block module.

    Args:
        norm1, norm2: the two norms (before the branches, or after them with ``post_norm``).
        heads: windows (B, nW, T, D) -> :class:`WindowHeads`.
        proj: the attention's output projection (B, nW, T, H * d) -> (B, nW, T, D).
        mlp: (hooks, layer, x) -> the MLP branch, calling ``mlp_hidden``.
        post_norm: Swin V2: x + norm1(attn(x)), x + norm2(mlp(x)).
    """

    norm1: torch.nn.Module
    norm2: torch.nn.Module
    heads: Callable[[torch.Tensor], WindowHeads]
    proj: Callable[[torch.Tensor], torch.Tensor]
    mlp: Callable[[Hooks, int, torch.Tensor], torch.Tensor]
    post_norm: bool = False


def block(hooks: Hooks, g: WindowGeometry, parts: BlockParts, x: torch.Tensor) -> torch.Tensor:
    """One window block (eval mode) with every named point: (B, gh, gw, D) -> (B, gh, gw, D)."""
    layer = g.index
    x = hooks(point_name("resid_pre", layer), x)
    h = x if parts.post_norm else common.norm(hooks, parts.norm1, x)
    h = hooks(point_name("ln1", layer), h)
    mask = g.shift_mask(h.device, h.dtype)
    z = attention(hooks, layer, parts.heads(g.partition(h)), mask)
    out = g.reverse(parts.proj(z))
    if parts.post_norm:
        out = common.norm(hooks, parts.norm1, out)
    out = hooks(point_name("attn_out", layer), out)
    x = hooks(point_name("resid_mid", layer), x + out)
    h = x if parts.post_norm else common.norm(hooks, parts.norm2, x)
    h = hooks(point_name("ln2", layer), h)
    m = parts.mlp(hooks, layer, h)
    if parts.post_norm:
        m = common.norm(hooks, parts.norm2, m)
    m = hooks(point_name("mlp_out", layer), m)
    return hooks(point_name("resid_post", layer), x + m)


def linear_mlp(fc1: torch.nn.Module, act: Callable, fc2: torch.nn.Module):
    """An MLP fc1 -> act -> fc2 with the ``mlp_hidden`` point (Hugging Face's SwinMLP / Swinv2MLP)."""
    def run(hooks: Hooks, layer: int, x: torch.Tensor) -> torch.Tensor:
        h = hooks(point_name("mlp_hidden", layer), hooks.rules.act(act, fc1(x)))
        return fc2(h)
    return run
