"""Swin Transformer (timm ``SwinTransformer``): window attention read exactly, and its analyses.

Swin attends inside local windows of each stage's token grid. Every second block shifts the
windows by half a window: timm rolls the grid cyclically, partitions it, and masks the pairs of
tokens that only share a window because the roll wrapped them around the image edge (score
-100). Patch merging between stages halves the grid, so a token of stage s stands for
``patch_size * 2**s`` pixels of the input. There is no CLS token and no (N, N) attention over the
whole image: the ViT views built on that do not apply, and this module gives their window analogues.

As :mod:`vitviz.capture` does for ViTs, the model's own submodules run in a forward that spells
the window attention out (relative position bias and shift mask included): no hooks, no state,
nothing written to the model, so threads can share one cached model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ModelError
from .layout import TokenLayout

DISTANCE_CONVENTION = ("each query patch's attention over the keys of its window, Σ_k a(q,k)·‖p_q − p_k‖ with p the "
                       "tokens' true centres on the image (tokens that the shifted windows' cyclic roll wrapped "
                       "around the edge are where they are on the image, not where the roll put them), in pixels "
                       "of the model input at the stage's stride; padding tokens (grids not divisible by the "
                       "window) dropped as queries and keys and each row renormalised; averaged over the queries")


POSITION_ENCODING = "relative position bias per window"


def is_swin(model) -> bool:
    """Whether ``model`` is a timm Swin Transformer (read by this module, not by :mod:`vitviz.capture`)."""
    from timm.models.swin_transformer import SwinTransformer

    return isinstance(model, SwinTransformer)


def check_supported(model, name: str) -> None:
    """Raise ModelError unless every block is timm's ``SwinTransformerBlock`` with ``WindowAttention``."""
    from timm.layers import PatchEmbed
    from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention

    why = None
    if type(model.patch_embed) is not PatchEmbed:
        why = f"its patch embedding is a {type(model.patch_embed).__name__}"
    for s, stage in enumerate(model.layers):
        for b, blk in enumerate(stage.blocks):
            attn = getattr(blk, "attn", None)
            if why is None and (type(blk) is not SwinTransformerBlock or type(attn) is not WindowAttention):
                inside = f" with {type(attn).__name__} attention" if attn is not None else " without one attention module"
                why = f"stage {s + 1} block {b + 1} is a {type(blk).__name__}{inside}"
    if why:
        raise ModelError(f"Model {name!r} is not supported yet: {why}. vitviz reads Swin models built from timm's "
                         "SwinTransformerBlock and WindowAttention (Swin V1).")


@dataclass(frozen=True, eq=False)
class WindowGeometry:
    """Where one Swin block's windows lie on the image.

    Args:
        index: 0-based block across all stages.
        stage: 0-based stage; ``block``: 0-based block within the stage.
        grid_size: (gh, gw) tokens of the stage's grid.
        window_size: (wh, ww) tokens per window.
        shift: (sh, sw) the cyclic shift of the grid before partitioning ((0, 0): regular windows).
        stride: (sy, sx) pixels of the model input between neighbouring tokens of the stage.
        allowed: (nW, T, T) bool, the key slots each query slot may attend to (False: masked by the
            shift mask); None when the block has no mask.
    """

    index: int
    stage: int
    block: int
    grid_size: tuple[int, int]
    window_size: tuple[int, int]
    shift: tuple[int, int]
    stride: tuple[int, int]
    allowed: np.ndarray | None = field(default=None, repr=False)

    @property
    def padded_size(self) -> tuple[int, int]:
        """The grid padded up to whole windows, as timm partitions it."""
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

    def token_positions(self) -> np.ndarray:
        """(nW, T, 2) the true (row, col) on the stage grid of every window slot; (-1, -1) for padding.

        Window w, slot t is where timm's ``window_partition`` puts them: windows in raster order over
        the rolled, padded grid, slots in raster order inside a window. Rolling by -shift puts token
        ``(i + sh) mod gh`` at row i, so slots in windows that wrapped around hold tokens from the
        opposite edge.
        """
        (gh, gw), (hp, wp), (wh, ww) = self.grid_size, self.padded_size, self.window_size
        rows = np.where(np.arange(hp) < gh, (np.arange(hp) + self.shift[0]) % gh, -1)
        cols = np.where(np.arange(wp) < gw, (np.arange(wp) + self.shift[1]) % gw, -1)
        r, c = np.meshgrid(rows, cols, indexing="ij")
        pad = (r < 0) | (c < 0)
        grid = np.stack([np.where(pad, -1, r), np.where(pad, -1, c)], axis=-1)  # (hp, wp, 2)
        windows = grid.reshape(hp // wh, wh, wp // ww, ww, 2).transpose(0, 2, 1, 3, 4)
        return windows.reshape(self.num_windows, self.window_area, 2)

    def slot_of(self, row: int, col: int) -> tuple[int, int]:
        """(window, slot) holding the token at (row, col) of the stage grid (0-based)."""
        if not (0 <= row < self.grid_size[0] and 0 <= col < self.grid_size[1]):
            raise ValueError(f"token (row {row}, col {col}) is outside the {self.grid_size} grid of stage {self.stage + 1}")
        hit = np.argwhere((self.token_positions() == (row, col)).all(-1))
        return int(hit[0, 0]), int(hit[0, 1])

    def keys_allowed(self) -> np.ndarray:
        """(nW, T, T) bool: the key slots each query slot can attend to (mask and padding applied)."""
        real = self.token_positions()[..., 0] >= 0
        allowed = np.ones((self.num_windows, self.window_area, self.window_area), bool) if self.allowed is None \
            else self.allowed
        return allowed & real[:, None, :]

    def to_dict(self) -> dict:
        return {"block (0-based, across stages)": self.index, "stage (0-based)": self.stage,
                "block_in_stage (0-based)": self.block, "grid_size": list(self.grid_size),
                "window_size": list(self.window_size), "shift": list(self.shift),
                "stride_px": list(self.stride), "padded_size": list(self.padded_size)}


@dataclass
class WindowCapture:
    """What one forward pass of a Swin model saw.

    Attributes:
        attention: one (B, nW, H, T, T) float32 tensor per block (all stages in order), the softmax
            probabilities of each window with relative position bias and shift mask; rows sum to 1.
        geometry: one :class:`WindowGeometry` per block.
        features: (B, gh, gw, D) float32, the final-norm features of the last stage (``forward_features``).
        logits: (B, C) float32, or None without a classifier head.
        layout: the patch grid of the input (stage 1's grid, patch-size stride).
    """

    attention: list[torch.Tensor]
    geometry: list[WindowGeometry]
    features: torch.Tensor
    logits: torch.Tensor | None
    layout: TokenLayout


def window_attention_forward(attn, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """timm ``WindowAttention.forward`` (non-fused path) that also returns the probabilities.

    x: (B * nW, T, C); mask: (nW, T, T) of 0 / -100, or None -> (output (B * nW, T, C),
    probabilities (B * nW, H, T, T) float32).
    """
    B_, N, C = x.shape
    qkv = attn.qkv(x).reshape(B_, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    bias = attn.relative_position_bias_table[attn.relative_position_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
    scores = (q * attn.scale) @ k.transpose(-2, -1) + bias.unsqueeze(0)
    if mask is not None:
        num_windows = mask.shape[0]
        scores = scores.view(-1, num_windows, attn.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
        scores = scores.view(-1, attn.num_heads, N, N)
    # Softmax in float32 so half-precision models still give rows that sum to 1.
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    out = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(B_, N, -1)
    return attn.proj(out), probs


def block_forward(blk, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A timm ``SwinTransformerBlock`` forward (eval mode) returning its window attention and mask too.

    x: (B, H, W, C) -> (output (B, H, W, C), probabilities (B * nW, heads, T, T), mask (nW, T, T) or None).
    """
    from timm.models.swin_transformer import window_partition, window_reverse

    B, H, W, C = x.shape
    (wh, ww), (sh, sw) = blk.window_size, blk.shift_size
    h = blk.norm1(x)
    if sh or sw:
        h = torch.roll(h, shifts=(-sh, -sw), dims=(1, 2))
    h = F.pad(h, (0, 0, 0, (ww - W % ww) % ww, 0, (wh - H % wh) % wh))
    _, Hp, Wp, _ = h.shape
    mask = blk.get_attn_mask(h) if blk.dynamic_mask else blk.attn_mask
    out, probs = window_attention_forward(blk.attn, window_partition(h, (wh, ww)).view(-1, wh * ww, C), mask)
    out = window_reverse(out.view(-1, wh, ww, C), (wh, ww), Hp, Wp)[:, :H, :W]
    if sh or sw:
        out = torch.roll(out, shifts=(sh, sw), dims=(1, 2))
    x = x + blk.drop_path1(out)
    x = x.reshape(B, -1, C)
    x = x + blk.drop_path2(blk.mlp(blk.norm2(x)))
    return x.reshape(B, H, W, C), probs, mask


def iter_blocks(model, x: torch.Tensor) -> Iterator[tuple[WindowGeometry, torch.Tensor, torch.Tensor]]:
    """Run the stages block by block: yields (geometry, tokens after the block (B, gh, gw, D),
    attention (B, nW, H, T, T)).

    x: (B, 3, H, W) normalised input on the model's device and dtype.
    """
    h = model.patch_embed(x)  # (B, gh, gw, D): timm's Swin keeps tokens as NHWC
    stride = tuple(int(p) for p in model.patch_embed.patch_size)
    index = 0
    for s, stage in enumerate(model.layers):
        h = stage.downsample(h)
        if not isinstance(stage.downsample, torch.nn.Identity):
            stride = (stride[0] * 2, stride[1] * 2)  # patch merging: 2x2 neighbours become one token
        for b, blk in enumerate(stage.blocks):
            grid = (int(h.shape[1]), int(h.shape[2]))
            h, probs, mask = block_forward(blk, h)
            geometry = WindowGeometry(index=index, stage=s, block=b, grid_size=grid,
                                      window_size=tuple(int(w) for w in blk.window_size),
                                      shift=tuple(int(v) for v in blk.shift_size), stride=stride,
                                      allowed=None if mask is None else (mask == 0).cpu().numpy())
            yield geometry, h, probs.view(h.shape[0], geometry.num_windows, *probs.shape[1:])
            index += 1


def input_layout(model, input_hw: tuple[int, int] | None = None) -> TokenLayout:
    """The patch grid of the input: stage 1's tokens, ``patch_size`` pixels each, no prefix tokens."""
    patch_embed = model.patch_embed
    grid = patch_embed.grid_size if input_hw is None else patch_embed.dynamic_feat_size(tuple(input_hw))
    return TokenLayout(prefix_tokens=(), grid_size=(int(grid[0]), int(grid[1])),
                       patch_size=tuple(int(p) for p in patch_embed.patch_size), global_pool=str(model.global_pool),
                       pos_embed_prefix_rows=0)


@torch.inference_mode()
def capture(model, images: torch.Tensor) -> WindowCapture:
    """Window attention of every block and head, the final features and the logits, in one pass.

    images: (B, 3, H, W) normalised model input (see :func:`vitviz.images.preprocess`).
    """
    from .types import to_model_input

    x = to_model_input(model, images)
    attention, geometry, h = [], [], None
    for g, h, probs in iter_blocks(model, x):
        attention.append(probs.float().cpu())
        geometry.append(g)
    features = model.norm(h)
    logits = model.forward_head(features) if model.num_classes > 0 else None
    return WindowCapture(attention=attention, geometry=geometry, features=features.float().cpu(),
                         logits=None if logits is None else logits.float().cpu(),
                         layout=input_layout(model, tuple(images.shape[-2:])))


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


def architecture(model):
    """What fixes a Swin model's window-attention size, for :mod:`vitviz.budget` (works on the meta device).

    The window of each stage is the one the model was built with (timm keeps it at other input sizes
    and shrinks it only where a stage's grid is smaller).
    """
    from .types import WindowArchitecture

    windows = getattr(model, "_ref_window_sizes", None) or [s.blocks[0].window_size for s in model.layers]
    stages = tuple((len(s.blocks), int(s.blocks[0].attn.num_heads), int(w[0])) for s, w in zip(model.layers, windows))
    return WindowArchitecture(depth=sum(b for b, _, _ in stages), heads=sum(h * b for b, h, _ in stages),
                              patch=tuple(int(p) for p in model.patch_embed.patch_size), prefix_tokens=0,
                              default_size=int(model.patch_embed.img_size[0]), stages=stages)


def card(model) -> dict:
    """Facts about a Swin model for the model card and settings.json."""
    heads = [stage.blocks[0].attn.num_heads for stage in model.layers]
    return {
        "library": "timm", "family": type(model).__name__,
        "architecture": model.pretrained_cfg.get("architecture", type(model).__name__),
        "timm_architecture": model.pretrained_cfg.get("architecture", type(model).__name__),
        "layers": sum(len(stage.blocks) for stage in model.layers),
        "heads": ", ".join(str(h) for h in heads) + " (per stage)",
        "embed_dim": ", ".join(str(stage.blocks[0].dim) for stage in model.layers) + " (per stage)",
        "attention": "shifted windows: " + ", ".join(f"stage {i + 1} {s.blocks[0].window_size[0]}x"
                                                     f"{s.blocks[0].window_size[1]}" for i, s in enumerate(model.layers)),
        "stage_depths": [len(stage.blocks) for stage in model.layers],
    }


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
