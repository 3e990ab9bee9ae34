"""transformers BEiT (``beit``): CLS + patches, an optional absolute position embedding, relative position
biases (each layer's own and/or one shared by all layers) added to the scaled scores, layer scale
(``lambda_1``, ``lambda_2``), spelled out from each layer's own modules."""
from __future__ import annotations

import torch

from ..types import HFModelType
from . import common
from .base import Hooks
from .hf_common import BlockSpec, HFAdapter, Terms, interpolates
from .registry import register_adapter


def _lambda_scales(layer):
    """``BeitLayer``: ``lambda_1``/``lambda_2`` are parameters, or the float 1.0 without layer scale."""
    g1, g2 = layer.lambda_1, layer.lambda_2
    return ((lambda a: g1 * a) if isinstance(g1, torch.Tensor) else None,
            (lambda m: g2 * m) if isinstance(g2, torch.Tensor) else None)


@register_adapter
class HFBeit(HFAdapter):
    name = "hf-beit"
    families = "transformers BEiT models (a save_pretrained folder or hf:owner/name)"
    hf_model_types = {"beit": HFModelType("BEiT", "BeitModel", ("BeitForImageClassification",))}
    block = BlockSpec(norm1="layernorm_before", attention="attention", norm2="layernorm_after",
                      scales=_lambda_scales)

    def global_pool(self, config) -> str:
        return "avg" if getattr(config, "use_mean_pooling", False) else "token"

    def layers(self, model):
        return self.base(model).layers

    def embed(self, model, x: torch.Tensor):
        """``BeitModel.forward`` up to the layers, with each layer's bias as ``BeitLayer.forward`` adds it to
        the scaled scores: its own (if any) plus the shared one (if any)."""
        base, patch = self.base(model), model.config.patch_size
        tokens = base.embeddings(x)
        window = (x.shape[-2] // patch, x.shape[-1] // patch)
        n, fit = tokens.shape[1], interpolates(model, x)
        shared = (base.shared_position_bias(window, interpolate_pos_encoding=fit, dim_size=n)
                  if base.shared_position_bias is not None else None)
        terms = []
        for layer in base.layers:
            own = layer.relative_position_bias
            bias = shared if own is None else own(window, fit, dim_size=n)
            if own is not None and shared is not None:
                bias = bias + shared
            terms.append(Terms(bias=bias))
        return tokens, terms

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        """``pooled``: ``BeitPooler`` (the mean patch token after its layernorm with mean pooling, else CLS)."""
        pooler = getattr(self.base(model), "pooler", None)
        if pooler is not None and pooler.layernorm is not None:
            pooled = common.norm(hooks, pooler.layernorm, features[:, 1:].mean(1))
        else:
            pooled = features[:, 0]
        pooled = hooks("pooled", pooled)
        if self.num_classes(model) and hooks.wants("logits"):
            hooks("logits", model.classifier(pooled))

    def position_encoding(self, model) -> str:
        config = model.config
        kinds = [k for k, on in (("learned absolute position embedding", self.position_table(model) is not None),
                                 ("relative position bias per layer", config.use_relative_position_bias),
                                 ("shared relative position bias", config.use_shared_relative_position_bias)) if on]
        return " + ".join(kinds) or "none"

    def extra_steps(self, model, layer: int) -> list[str]:
        config = model.config
        own, shared = config.use_relative_position_bias, config.use_shared_relative_position_bias
        if not own and not shared:
            return []
        which = " and ".join(w for w, on in (("this layer's own", own), ("the model's shared", shared)) if on)
        return [f"a learned relative position bias ({which}, one value per head and pair of positions) is added "
                "to the scaled scores before the softmax"]

    def why_no_extra_token(self, model) -> str | None:
        config = model.config
        if config.use_relative_position_bias or config.use_shared_relative_position_bias:
            return "its relative position bias is sized for the model's own tokens"
        if getattr(config, "use_mean_pooling", False):
            return "its pooler takes the mean of the patch tokens and would count the extra token"
        return None

    def pooled_text(self, model) -> str:
        return "pooler_output (the mean patch token after layernorm with mean pooling, else the CLS token)"
