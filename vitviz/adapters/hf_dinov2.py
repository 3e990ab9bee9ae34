"""transformers DINOv2 and DINOv2 with registers (``dinov2``, ``dinov2_with_registers``): CLS (+ registers,
which carry no position embedding) + patches, layer scale on both branches, spelled out from each layer's
own modules."""
from __future__ import annotations

import torch

from ..types import HFModelType
from .base import Hooks
from .hf_common import NO_TERMS, BlockSpec, HFAdapter, layer_scale_modules
from .registry import register_adapter


@register_adapter
class HFDinov2(HFAdapter):
    name = "hf-dinov2"
    families = "transformers DINOv2 and DINOv2 with registers models (a save_pretrained folder or hf:owner/name)"
    hf_model_types = {
        "dinov2": HFModelType("DINOv2", "Dinov2Model", ("Dinov2ForImageClassification",)),
        "dinov2_with_registers": HFModelType("DINOv2 with registers", "Dinov2WithRegistersModel",
                                             ("Dinov2WithRegistersForImageClassification",)),
    }
    block = BlockSpec(norm1="norm1", attention="attention", norm2="norm2", scales=layer_scale_modules)

    def pos_antialias(self, config) -> bool:
        """DINOv2 with registers antialiases in its own ``interpolate_pos_encoding``; DINOv2 does not."""
        return config.model_type == "dinov2_with_registers"

    def prefix_tokens(self, config) -> tuple[str, ...]:
        return ("cls", *(f"reg{i}" for i in range(getattr(config, "num_register_tokens", 0))))

    def pos_embed_prefix_rows(self, config) -> int:
        return 1

    def layers(self, model):
        return self.base(model).encoder.layer

    def embed(self, model, x: torch.Tensor):
        """The embeddings always fit the position table to the input (no ``interpolate_pos_encoding`` switch)."""
        return self.base(model).embeddings(x), [NO_TERMS] * len(self.layers(model))

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        """``pooled``: the CLS token after the final layernorm (``pooler_output``); the classifier reads it
        concatenated with the mean patch token (registers excluded)."""
        pooled = hooks("pooled", features[:, 0])
        if self.num_classes(model) and hooks.wants("logits"):
            patches = features[:, len(self.prefix_tokens(model.config)):]
            hooks("logits", model.classifier(torch.cat([pooled, patches.mean(dim=1)], dim=1)))

    def why_no_extra_token(self, model) -> str | None:
        if self.num_classes(model):
            return "its classifier reads the mean of the tokens after the model's own prefix tokens and would count the extra token"
        return None

    def pooled_text(self, model) -> str:
        return "the CLS token after the final layernorm"
