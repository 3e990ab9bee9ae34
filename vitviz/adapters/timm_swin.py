"""timm Swin Transformer (V1): window attention per block, read through :mod:`vitviz.swin`.

Interim: the named points are ``blocks.i.attn`` ((B, nW, H, T, T), the window probabilities with
relative position bias and shift mask) and ``blocks.i.resid_post`` ((B, gh, gw, D)), then
``final_norm`` and ``logits``; edits at them are not yet carried into the next block.
"""
from __future__ import annotations

import torch

from .. import swin
from ..layout import TokenLayout
from .base import Adapter, Hooks, point_name
from .registry import register_adapter

_GLOBAL_ONLY = ("{view} needs attention over the whole image: a Swin Transformer attends only within local "
                "windows (shifted every second block), with no CLS token, so it does not apply; the heads and "
                "distance pages show the window attention instead.")


@register_adapter
class TimmSwin(Adapter):
    name = "timm-swin"
    library = "timm"
    scope = "window"
    families = "Swin Transformers (timm SwinTransformer, window attention)"

    def claims(self, model) -> bool:
        return swin.is_swin(model)

    def label(self, model) -> str:
        return "Swin Transformer"

    def num_layers(self, model) -> int:
        return sum(len(stage.blocks) for stage in model.layers)

    def num_heads(self, model, layer: int = 0) -> int:
        blocks = [blk for stage in model.layers for blk in stage.blocks]
        return int(blocks[layer].attn.num_heads)

    def layout(self, model, input_hw=None) -> TokenLayout:
        return swin.input_layout(model, input_hw)

    def num_classes(self, model) -> int:
        return int(getattr(model, "num_classes", 0))

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        h = None
        for g, h, probs in swin.iter_blocks(model, x):
            hooks(point_name("attn", g.index), probs)
            hooks(point_name("resid_post", g.index), h)
        features = hooks("final_norm", model.norm(h))
        if self.num_classes(model) and (hooks.wants("logits") or hooks.wants("pooled")):
            hooks("pooled", model.forward_head(features, pre_logits=True))
            hooks("logits", model.forward_head(features))

    def position_encoding(self, model) -> str:
        return swin.POSITION_ENCODING

    def patch_filters(self, model) -> torch.Tensor:
        return model.patch_embed.proj.weight

    def card(self, model) -> dict:
        return swin.card(model)
