"""timm Swin Transformer (V1): ``SwinTransformer`` spelled out block by block.

Each block's window attention runs through :mod:`vitviz.adapters.windows` (timm rolls, then pads):
the named points are those of :mod:`vitviz.adapters.base` in window shapes, ``q``/``k``/``v``/``z``
(B, nW, H, T, d), ``scores``/``attn`` (B, nW, H, T, T) with the relative position bias and the shift
mask in the scores, token points (B, gh, gw, D). Patch merging between stages runs as timm's module.
"""
from __future__ import annotations

import torch

from ..errors import ModelNotSupported
from ..layout import TokenLayout
from . import common, windows
from .base import Adapter, Hooks
from .registry import register_adapter

POSITION_ENCODING = "relative position bias per window"
WHY_NOT = windows.why_not_views("Swin")


def _heads(attn):
    """timm ``WindowAttention`` on windows (B, nW, T, C): q, k, v per head, its scale and relative position bias."""
    def heads(x: torch.Tensor) -> windows.WindowHeads:
        B, nW, T, _ = x.shape
        qkv = attn.qkv(x).view(B, nW, T, 3, attn.num_heads, -1).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv.unbind(0)
        return windows.WindowHeads(q, k, v, float(attn.scale), attn._get_rel_pos_bias())
    return heads


def _parts(blk) -> windows.BlockParts:
    return windows.BlockParts(norm1=blk.norm1, norm2=blk.norm2, heads=_heads(blk.attn), proj=blk.attn.proj,
                              mlp=lambda hooks, layer, x: common.mlp(hooks, layer, blk.mlp, x))


def _patch_embed(patch_embed, x: torch.Tensor, hooks: Hooks) -> torch.Tensor:
    """timm ``PatchEmbed`` with NHWC output, its norm through the run's rules: (B, 3, H, W) -> (B, gh, gw, D)."""
    if patch_embed.img_size is not None and patch_embed.strict_img_size and \
            tuple(x.shape[-2:]) != tuple(patch_embed.img_size):
        raise ModelNotSupported(f"this Swin model was built for {patch_embed.img_size[0]}x{patch_embed.img_size[1]} "
                                f"inputs and was given {x.shape[-2]}x{x.shape[-1]}; load it at that size (timm's "
                                "strict_img_size).")
    if patch_embed.dynamic_img_pad:
        ph, pw = patch_embed.patch_size
        x = torch.nn.functional.pad(x, (0, (pw - x.shape[-1] % pw) % pw, 0, (ph - x.shape[-2] % ph) % ph))
    return common.norm(hooks, patch_embed.norm, patch_embed.proj(x).permute(0, 2, 3, 1))


def _downsample(module, x: torch.Tensor, hooks: Hooks) -> torch.Tensor:
    """timm ``PatchMerging`` (pad to even, 2x2 neighbours concatenated, norm through the run's rules, linear
    reduction), or the stage's identity: (B, gh, gw, C) -> (B, ceil(gh / 2), ceil(gw / 2), C')."""
    from timm.models.swin_transformer import PatchMerging

    if isinstance(module, torch.nn.Identity):
        return x
    if type(module) is not PatchMerging:
        return module(x)
    B, H, W, C = x.shape
    x = torch.nn.functional.pad(x, (0, 0, 0, W % 2, 0, H % 2))
    _, H, W, _ = x.shape
    x = x.reshape(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3)
    return module.reduction(common.norm(hooks, module.norm, x))


@register_adapter
class TimmSwin(Adapter):
    name = "timm-swin"
    library = "timm"
    scope = "window"
    families = "Swin Transformers (timm SwinTransformer, window attention)"

    def claims(self, model) -> bool:
        from timm.models.swin_transformer import SwinTransformer

        return isinstance(model, SwinTransformer)

    def why_unsupported(self, model) -> str | None:
        """Every block must be timm's ``SwinTransformerBlock`` with ``WindowAttention`` (Swin V1)."""
        from timm.layers import PatchEmbed
        from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention

        if type(model.patch_embed) is not PatchEmbed:
            return f"its patch embedding is a {type(model.patch_embed).__name__}"
        for s, stage in enumerate(model.layers):
            for b, blk in enumerate(stage.blocks):
                if why := common.block_mismatch(f"stage {s + 1} block {b + 1}", blk, (SwinTransformerBlock,),
                                                (WindowAttention,)):
                    return why
        return None

    def label(self, model) -> str:
        return "Swin Transformer"

    def _blocks(self, model) -> list:
        return [blk for stage in model.layers for blk in stage.blocks]

    def num_layers(self, model) -> int:
        return len(self._blocks(model))

    def num_heads(self, model, layer: int = 0) -> int:
        return int(self._blocks(model)[layer].attn.num_heads)

    def layout(self, model, input_hw=None) -> TokenLayout:
        """The patch grid of the input: stage 1's tokens, ``patch_size`` pixels each, no prefix tokens."""
        patch_embed = model.patch_embed
        grid = patch_embed.grid_size if input_hw is None else patch_embed.dynamic_feat_size(tuple(input_hw))
        return TokenLayout(prefix_tokens=(), grid_size=(int(grid[0]), int(grid[1])),
                           patch_size=tuple(int(p) for p in patch_embed.patch_size),
                           global_pool=str(model.global_pool), pos_embed_prefix_rows=0)

    def num_classes(self, model) -> int:
        return int(getattr(model, "num_classes", 0))

    def geometry(self, model, input_hw: tuple[int, int]) -> list[windows.WindowGeometry]:
        """One :class:`~vitviz.adapters.windows.WindowGeometry` per block for an input of ``input_hw`` pixels."""
        grid = self.layout(model, input_hw).grid_size
        stride = tuple(int(p) for p in model.patch_embed.patch_size)
        out = []
        for s, stage in enumerate(model.layers):
            if not isinstance(stage.downsample, torch.nn.Identity):
                grid = ((grid[0] + 1) // 2, (grid[1] + 1) // 2)  # patch merging pads to even, then halves
                stride = (stride[0] * 2, stride[1] * 2)
            for b, blk in enumerate(stage.blocks):
                out.append(windows.WindowGeometry.build(len(out), s, b, grid, blk.window_size, blk.shift_size, stride))
        return out

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        geometry = iter(self.geometry(model, tuple(x.shape[-2:])))
        h = hooks("embed", _patch_embed(model.patch_embed, x, hooks))  # (B, gh, gw, D): timm's Swin keeps NHWC
        for stage in model.layers:
            h = _downsample(stage.downsample, h, hooks)
            for blk in stage.blocks:
                h = windows.block(hooks, next(geometry), _parts(blk), h)
        features = hooks("final_norm", common.norm(hooks, model.norm, h))
        if hooks.wants("pooled") or (self.num_classes(model) and hooks.wants("logits")):
            pooled = hooks("pooled", model.forward_head(features, pre_logits=True))
            if self.num_classes(model) and hooks.wants("logits"):
                hooks("logits", model.head.fc(pooled).flatten(1))

    def why_not(self, model, view: str) -> str | None:
        return WHY_NOT.get(view)

    def position_encoding(self, model) -> str:
        return POSITION_ENCODING

    def patch_filters(self, model) -> torch.Tensor:
        return model.patch_embed.proj.weight

    def pooled_text(self, model) -> str:
        return "the mean of the last stage's tokens after the final norm"

    def architecture(self, model):
        """What fixes the window-attention size (works on the meta device). The window of each stage is the one
        the model was built with (timm keeps it at other input sizes and shrinks it only where a stage's grid
        is smaller)."""
        from ..types import WindowArchitecture

        sizes = getattr(model, "_ref_window_sizes", None) or [s.blocks[0].window_size for s in model.layers]
        stages = tuple((len(s.blocks), int(s.blocks[0].attn.num_heads), int(w[0])) for s, w in zip(model.layers, sizes))
        return WindowArchitecture(depth=sum(b for b, _, _ in stages), heads=sum(h * b for b, h, _ in stages),
                                  patch=tuple(int(p) for p in model.patch_embed.patch_size), prefix_tokens=0,
                                  default_size=int(model.patch_embed.img_size[0]), stages=stages)

    def card(self, model) -> dict:
        heads = [stage.blocks[0].attn.num_heads for stage in model.layers]
        arch = model.pretrained_cfg.get("architecture", type(model).__name__)
        return {
            "library": "timm", "family": type(model).__name__, "architecture": arch, "timm_architecture": arch,
            "layers": self.num_layers(model),
            "heads": ", ".join(str(h) for h in heads) + " (per stage)",
            "embed_dim": ", ".join(str(stage.blocks[0].dim) for stage in model.layers) + " (per stage)",
            "attention": "shifted windows: " + ", ".join(f"stage {i + 1} {s.blocks[0].window_size[0]}x"
                                                         f"{s.blocks[0].window_size[1]}"
                                                         for i, s in enumerate(model.layers)),
            "stage_depths": [len(stage.blocks) for stage in model.layers],
        }
