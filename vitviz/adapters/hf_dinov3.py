"""transformers DINOv3 ViT (``dinov3_vit``): CLS + register tokens + patches, no learned absolute position
table but rotary embeddings (RoPE) of each patch's centre rotating the patch tokens' q and k in every
layer (CLS and registers are not rotated), layer scale on both branches, spelled out from each layer's
own modules."""
from __future__ import annotations

from functools import partial

import torch

from ..types import HFModelType
from . import common
from .base import Hooks
from .hf_common import BlockSpec, HFAdapter, Terms, layer_scale_modules
from .registry import register_adapter

_ROPE = "rotary position embedding (RoPE) of the patch centres on the patch tokens' q and k"


@register_adapter
class HFDinov3(HFAdapter):
    name = "hf-dinov3"
    families = "transformers DINOv3 ViT models (a save_pretrained folder or hf:owner/name)"
    hf_model_types = {"dinov3_vit": HFModelType("DINOv3", "DINOv3ViTModel")}
    block = BlockSpec(norm1="norm1", attention="attention", norm2="norm2", scales=layer_scale_modules)

    def prefix_tokens(self, config) -> tuple[str, ...]:
        return ("cls", *(f"reg{i}" for i in range(config.num_register_tokens)))

    def pos_embed_prefix_rows(self, config) -> int:
        return 0

    def base(self, model):
        return model  # its base_model is the encoder alone (base_model_prefix "model")

    def layers(self, model):
        return model.model.layer

    def embed(self, model, x: torch.Tensor):
        """``DINOv3ViTModel.forward`` up to the layers: the tokens, and the rotation every layer applies to the
        patch tokens' q and k (the library's ``apply_rotary_pos_emb`` with its ``rope_embeddings``' cos, sin)."""
        from transformers.models.dinov3_vit.modeling_dinov3_vit import apply_rotary_pos_emb

        cos, sin = model.rope_embeddings(x)
        rotary = partial(apply_rotary_pos_emb, cos=cos, sin=sin)
        return model.embeddings(x), [Terms(rotary=rotary)] * len(self.layers(model))

    def final_norm(self, model, h: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        return common.norm(hooks, model.norm, h)

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        hooks("pooled", features[:, 0])

    def position_encoding(self, model) -> str:
        return _ROPE

    def position_table(self, model):
        return None

    def extra_steps(self, model, layer: int) -> list[str]:
        return ["the patch tokens' q and k are rotated by the rotary position embedding (RoPE) of their patch's "
                "centre before the dot product (CLS and register tokens are not rotated)"]

    def pooled_text(self, model) -> str:
        return "the CLS token after the final layernorm (pooler_output)"
