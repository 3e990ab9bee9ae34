"""transformers ViT and DeiT (``vit``, ``deit``): CLS (and DeiT's distillation token) + patches with a learned
absolute position embedding, pre-norm layers, spelled out from each layer's own modules."""
from __future__ import annotations

import torch

from ..types import HFModelType
from .base import Hooks
from .hf_common import NO_TERMS, BlockSpec, HFAdapter, interpolates
from .registry import register_adapter


@register_adapter
class HFViT(HFAdapter):
    name = "hf-vit"
    families = "transformers ViT and DeiT models (a save_pretrained folder or hf:owner/name)"
    hf_model_types = {
        "vit": HFModelType("ViT", "ViTModel", ("ViTForImageClassification",)),
        "deit": HFModelType("DeiT", "DeiTModel", ("DeiTForImageClassification",
                                                  "DeiTForImageClassificationWithTeacher")),
    }
    block = BlockSpec(norm1="layernorm_before", attention="attention", norm2="layernorm_after")

    def prefix_tokens(self, config) -> tuple[str, ...]:
        return ("cls", "dist") if config.model_type == "deit" else ("cls",)

    def layers(self, model):
        return self.base(model).layers

    def embed(self, model, x: torch.Tensor):
        tokens = self.base(model).embeddings(x, interpolate_pos_encoding=interpolates(model, x))
        return tokens, [NO_TERMS] * len(self.layers(model))

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        """``pooled``: the CLS token after the final layernorm (what the classifier reads); DeiT with teacher's
        logits are the mean of its CLS and distillation classifiers, as its own forward returns them."""
        pooled = hooks("pooled", features[:, 0])
        if not self.num_classes(model) or not hooks.wants("logits"):
            return
        if hasattr(model, "distillation_classifier"):
            hooks("logits", (model.cls_classifier(pooled) + model.distillation_classifier(features[:, 1])) / 2)
        else:
            hooks("logits", model.classifier(pooled))

    def pooled_text(self, model) -> str:
        return "the CLS token after the final layernorm"
