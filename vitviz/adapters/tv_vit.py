"""torchvision's ``VisionTransformer`` (``vit_b_16`` and friends) spelled out block by block.

torchvision runs attention in ``nn.MultiheadAttention`` with ``need_weights=False`` (fused, no
probabilities); this forward computes the same function from the module's own parameters with the
named points of :mod:`vitviz.adapters.base`: CLS + patches in raster order, a learned absolute
position embedding at the model's one input size, pre-norm blocks, the head reading CLS.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ModelNotSupported
from ..layout import TokenLayout
from . import common
from .base import Adapter, HeadWrite, Hooks, point_name
from .registry import register_adapter


def _is_tv_vit(model) -> bool:
    try:
        from torchvision.models.vision_transformer import VisionTransformer
    except ImportError:  # torchvision is optional for this family
        return False
    return isinstance(model, VisionTransformer)


def _mlp(hooks: Hooks, layer: int, mlp, x: torch.Tensor) -> torch.Tensor:
    """torchvision ``MLPBlock``: Linear, GELU, Dropout, Linear, Dropout (eval: dropout is the identity)."""
    h = hooks(point_name("mlp_hidden", layer), hooks.rules.act(mlp[1], mlp[0](x)))
    return mlp[3](h)


def _attention(hooks: Hooks, layer: int, mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention(x, x, x)`` spelled out: packed in-projection, per-head softmax(q kᵀ / √d) v, out_proj."""
    B, N, D = x.shape
    H = mha.num_heads
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.reshape(B, N, H, D // H).transpose(1, 2) for t in (q, k, v))
    z = common.attention(hooks, layer, q, k, v, (D // H) ** -0.5)
    return mha.out_proj(z)


@register_adapter
class TorchvisionViT(Adapter):
    """torchvision ``VisionTransformer`` (ViT-B/16, B/32, L/16, L/32, H/14)."""

    name = "torchvision-vit"
    library = "torchvision"
    families = ("torchvision VisionTransformer (torchvision:vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14, with a "
                "state-dict file or torchvision's weights)")

    def claims(self, model) -> bool:
        return _is_tv_vit(model)

    def why_unsupported(self, model) -> str | None:
        if not isinstance(model.conv_proj, torch.nn.Conv2d):
            return "its patch embedding is a convolutional stem"
        mha = model.encoder.layers[0].self_attention
        if not mha._qkv_same_embed_dim or mha.in_proj_bias is None:
            return "its attention has separate or bias-free q/k/v projections"
        return None

    def label(self, model) -> str:
        return "ViT (torchvision)"

    def num_layers(self, model) -> int:
        return len(model.encoder.layers)

    def num_heads(self, model, layer: int = 0) -> int:
        return int(model.encoder.layers[layer].num_heads)

    def layout(self, model, input_hw=None) -> TokenLayout:
        g = model.image_size // model.patch_size
        return TokenLayout(prefix_tokens=("cls",), grid_size=(g, g), patch_size=(model.patch_size,) * 2,
                           global_pool="token", pos_embed_prefix_rows=1)

    def num_classes(self, model) -> int:
        return int(model.num_classes)

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        if tuple(x.shape[-2:]) != (model.image_size,) * 2:
            raise ModelNotSupported(f"torchvision's ViT runs at {model.image_size}x{model.image_size} pixels only; "
                                    f"the input is {x.shape[-1]}x{x.shape[-2]}.")
        h = model._process_input(x)
        h = torch.cat([model.class_token.expand(h.shape[0], -1, -1), h], dim=1)
        h = hooks("embed", h + model.encoder.pos_embedding)
        for i, blk in enumerate(model.encoder.layers):
            h = hooks(point_name("resid_pre", i), h)
            a = hooks(point_name("ln1", i), common.norm(hooks, blk.ln_1, h))
            a = hooks(point_name("attn_out", i), _attention(hooks, i, blk.self_attention, a))
            h = hooks(point_name("resid_mid", i), h + a)
            m = hooks(point_name("ln2", i), common.norm(hooks, blk.ln_2, h))
            h = hooks(point_name("resid_post", i), h + hooks(point_name("mlp_out", i), _mlp(hooks, i, blk.mlp, m)))
        if any(hooks.wants(p) for p in ("final_norm", "pooled", "logits")):
            self.readout(model, h, hooks)

    def readout(self, model, tokens: torch.Tensor, hooks: Hooks) -> None:
        features = hooks("final_norm", common.norm(hooks, model.encoder.ln, tokens))
        pooled = hooks("pooled", features[:, 0])
        if hooks.wants("logits"):
            hooks("logits", model.heads(pooled))

    def head_write(self, model, layer: int) -> HeadWrite:
        mha = model.encoder.layers[layer].self_attention
        return HeadWrite(mha.out_proj.weight, mha.out_proj.bias, None, int(mha.num_heads))

    def position_encoding(self, model) -> str:
        return "learned absolute position embedding"

    def position_table(self, model):
        return model.encoder.pos_embedding

    def patch_filters(self, model) -> torch.Tensor:
        return model.conv_proj.weight

    def pooled_text(self, model) -> str:
        return "the final norm's CLS token"

    def card(self, model) -> dict:
        return {"library": "torchvision", "family": type(model).__name__, "family_label": self.label(model),
                "layers": self.num_layers(model), "heads": self.num_heads(model), "embed_dim": model.hidden_dim}
