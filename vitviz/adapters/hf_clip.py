"""transformers CLIP and SigLIP vision towers (``clip``, ``clip_vision_model``, ``siglip``,
``siglip_vision_model``), spelled out from each layer's own modules.

CLIP: CLS + patches, a layernorm before the first layer (``pre_layrnorm``, part of ``embed``); its
``last_hidden_state`` is the last layer's output itself and ``pooled`` the CLS token after
``post_layernorm`` (what the projection reads). SigLIP: patches only, ``post_layernorm`` on every token,
and ``pooled`` its attention-pooling head (a learned probe attending to the tokens, then an MLP), spelled
out here too; without the head, the mean token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..types import HFModelType
from . import common
from .base import Hooks, Rules
from .hf_common import NO_TERMS, BlockSpec, HFAdapter, interpolates
from .registry import register_adapter

_CLIP = HFModelType("CLIP vision tower", "CLIPVisionModel")
_SIGLIP = HFModelType("SigLIP vision tower", "SiglipVisionModel")


def _is_siglip(model_or_config) -> bool:
    config = getattr(model_or_config, "config", model_or_config)
    return config.model_type.startswith("siglip")


def attention_pool(head, x: torch.Tensor, rules: Rules) -> torch.Tensor:
    """SigLIP's ``SiglipMultiheadAttentionPoolingHead``: the probe attends to the tokens x (B, N, D) with the
    head's ``nn.MultiheadAttention`` (its packed projections, q scaled before the product as torch does),
    then a residual MLP after a layernorm: (B, D)."""
    B, N, D = x.shape
    mha = head.attention
    H = mha.num_heads
    d = D // H
    wq, wk, wv = mha.in_proj_weight.chunk(3)
    bq, bk, bv = mha.in_proj_bias.chunk(3)
    q = F.linear(head.probe.expand(B, -1, -1), wq, bq).view(B, 1, H, d).transpose(1, 2)
    k = F.linear(x, wk, bk).view(B, N, H, d).transpose(1, 2)
    v = F.linear(x, wv, bv).view(B, N, H, d).transpose(1, 2)
    qs, kt = rules.bilinear(q * d ** -0.5, k.transpose(-2, -1))
    probs, vv = rules.bilinear(rules.softmax(qs @ kt).to(v.dtype), v)
    h = mha.out_proj((probs @ vv).transpose(1, 2).reshape(B, 1, D))
    m = rules.norm(head.layernorm, h)
    h = h + head.mlp.fc2(rules.act(head.mlp.activation_fn, head.mlp.fc1(m)))
    return h[:, 0]


@register_adapter
class HFClip(HFAdapter):
    name = "hf-clip"
    families = "transformers CLIP and SigLIP vision towers (a save_pretrained folder or hf:owner/name)"
    hf_model_types = {"clip": _CLIP, "clip_vision_model": _CLIP, "siglip": _SIGLIP, "siglip_vision_model": _SIGLIP}
    block = BlockSpec(norm1="layer_norm1", attention="self_attn", norm2="layer_norm2", output="out_proj",
                      scale="scale")

    def prefix_tokens(self, config) -> tuple[str, ...]:
        return () if _is_siglip(config) else ("cls",)

    def global_pool(self, config) -> str:
        return "map" if _is_siglip(config) else "token"

    def base(self, model):
        return model

    def layers(self, model):
        return model.encoder.layers

    def embed(self, model, x: torch.Tensor):
        tokens = model.embeddings(x, interpolate_pos_encoding=interpolates(model, x))
        return tokens, [NO_TERMS] * len(self.layers(model))

    def embed_norm(self, model, h: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        """CLIP: ``pre_layrnorm`` (part of ``embed``); SigLIP has none."""
        return h if _is_siglip(model) else common.norm(hooks, model.pre_layrnorm, h)

    def final_norm(self, model, h: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        return common.norm(hooks, model.post_layernorm, h) if _is_siglip(model) else h

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        if not _is_siglip(model):
            hooks("pooled", common.norm(hooks, model.post_layernorm, features[:, 0]))
        elif getattr(model, "head", None) is not None:
            hooks("pooled", attention_pool(model.head, features, hooks.rules))
        else:
            hooks("pooled", features.mean(dim=1))

    def why_not(self, model, view: str) -> str | None:
        if view == "readout" and _is_siglip(model) and getattr(model, "head", None) is not None:
            return ("SigLIP pools its tokens with an attention head, which is not linear in the tokens: the direct "
                    "readout does not apply to it yet (the logit lens and the maps do).")
        return None

    def why_no_extra_token(self, model) -> str | None:
        if _is_siglip(model):
            return "its pooling head (attention pooling or the mean) reads every token and would read the extra one"
        return None

    def pooled_text(self, model) -> str:
        if _is_siglip(model):
            return "pooler_output (the attention-pooling head; the mean token without it)"
        return "pooler_output (the CLS token after post_layernorm)"
