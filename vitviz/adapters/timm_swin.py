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

# What each view that needs attention over the whole token sequence says for a window model.
WHY_NOT = {
    "overview": ("Token norms, attention sinks, feature PCA and token clusters are not supported yet for window "
                 "attention (Swin): they read one token sequence at one resolution, and Swin's tokens are merged "
                 "into coarser grids stage by stage. The heads and attention-distance pages show its window "
                 "attention."),
    "rollout": ("Rollout and attention flow do not apply to window attention (Swin): they chain one (N, N) attention "
                "matrix per layer and read the CLS token's row, but Swin has no CLS token and each block attends only "
                "inside local windows that shift between blocks and merge between stages, so there is no whole-image "
                "matrix to chain. The heads page shows each window's attention and the distance page how far each "
                "head looks."),
    "anatomy": ("The attention anatomy is not supported yet for window attention (Swin): its steps would also need "
                "the window partition, the relative position bias and the shift mask. The heads page shows each "
                "head's window attention exactly as the model computes it, bias and mask included."),
    "faithfulness": ("Faithfulness is not supported yet for window attention (Swin): the maps it scores (the last "
                     "layer's readout attention, rollout, attention flow, gradient rollout) are defined on attention "
                     "over the whole image, and Swin's blocks attend only inside local windows."),
    "stats": ("The per-head statistics are defined on attention over the whole image (layers x heads of one token "
              "sequence); the current model attends within windows (Swin): its distances per block are on the "
              "Attention distance page."),
    "attribution": ("Attribution (AttnLRP, LeGrad, Grad-CAM) is not supported yet for window attention (Swin): its "
                    "forward is not yet spelled out block by block in vitviz, so the relevance rules and the "
                    "per-layer gradients have nowhere to act."),
}
WHY_NOT["flow"] = WHY_NOT["rollout"]


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

    def why_not(self, model, view: str) -> str | None:
        return WHY_NOT.get(view)

    def position_encoding(self, model) -> str:
        return swin.POSITION_ENCODING

    def patch_filters(self, model) -> torch.Tensor:
        return model.patch_embed.proj.weight

    def architecture(self, model):
        return swin.architecture(model)

    def card(self, model) -> dict:
        return swin.card(model)
