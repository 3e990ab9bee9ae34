"""Hugging Face ``transformers`` families (ViT, DeiT, DINOv2 (+ registers), CLIP and SigLIP vision towers,
BEiT), read through :mod:`vitviz.hf`.

Interim: the forward is the library's eager forward with ``output_attentions``; its hidden states and
attention probabilities are passed through the named points ``embed``, ``blocks.i.resid_pre``,
``blocks.i.attn`` and ``blocks.i.resid_post`` (read, not changed: edits there do not reach later layers), and ``final_norm``,
``pooled`` and ``logits``.
"""
from __future__ import annotations

import torch

from .. import hf
from ..layout import TokenLayout
from .base import Adapter, Hooks, point_name
from .registry import register_adapter


@register_adapter
class HuggingFace(Adapter):
    name = "transformers"
    library = "transformers"
    families = ("transformers " + ", ".join(sorted({f.label for f in hf.FAMILIES.values()})) +
                " models (a save_pretrained folder or hf:owner/name)")

    def claims(self, model) -> bool:
        return type(model).__module__.startswith("transformers.") and \
            getattr(getattr(model, "config", None), "model_type", None) in hf.FAMILIES

    def label(self, model) -> str:
        return hf.family_of(model).label

    def num_layers(self, model) -> int:
        return int(hf.vision_config(model.config).num_hidden_layers)

    def num_heads(self, model, layer: int = 0) -> int:
        return int(hf.vision_config(model.config).num_attention_heads)

    def layout(self, model, input_hw=None) -> TokenLayout:
        return hf.token_layout(model, input_hw)

    def num_classes(self, model) -> int:
        return hf.num_classes(model)

    def class_labels(self, model):
        return hf.class_labels(model)

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        out = hf._forward(model, x)
        hooks("embed", out.hidden_states[0])
        for i, probs in enumerate(out.attentions):
            hooks(point_name("resid_pre", i), out.hidden_states[i])
            hooks(point_name("attn", i), probs.float())
            hooks(point_name("resid_post", i), out.hidden_states[i + 1])
        if hooks.wants("final_norm"):
            hooks("final_norm", hf._final_features(model, out))
        if hooks.wants("pooled"):
            hooks("pooled", hf.pre_logits(model, x))
        if self.num_classes(model) and hooks.wants("logits"):
            hooks("logits", out.logits)

    def position_encoding(self, model) -> str:
        return hf.position_encoding(model)

    def position_table(self, model):
        try:
            return hf.position_embedding(model)
        except ValueError:
            return None

    def native_pos_embed(self, model, layout):
        """The stored grid; other grids are resampled as the family's own ``interpolate_pos_encoding`` does."""
        return hf.native_pos_embed(model, layout)

    def patch_filters(self, model) -> torch.Tensor:
        return hf.patch_filter_weight(model)

    def layer_qkv(self, model, x, layer):
        return hf.layer_qkv(model, x, layer)

    def attention_steps(self, model, layer: int) -> list[str]:
        return list(hf.attention_parts(model, layer).steps)

    def pooled_text(self, model) -> str:
        return hf.pre_logits_text(model)

    def card(self, model) -> dict:
        source = getattr(model, "name_or_path", "") or ""
        return hf.card(model, hf.family_of(model), source)
