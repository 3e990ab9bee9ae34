"""What the Hugging Face ``transformers`` adapters share: the pre-norm block spelled out from a layer's
own modules, the MLPs, the position table and the model card.

A family module (``hf_vit``, ``hf_dinov2``, ``hf_clip``, ``hf_beit``, ``hf_dinov3``) subclasses
:class:`HFAdapter` and says, for the ``model_type`` values it reads:

- :attr:`HFAdapter.hf_model_types`: model_type -> :class:`vitviz.types.HFModelType` (what the loader builds);
- :meth:`HFAdapter.embed`: the tokens entering layer 1 and each layer's position terms;
- :attr:`HFAdapter.block`: the names of a layer's modules (:class:`BlockSpec`);
- :meth:`HFAdapter.final_norm` and :meth:`HFAdapter.head`: ``final_norm``, ``pooled`` and ``logits``.

Attention is transformers' eager attention: softmax(q·kᵀ · scale + bias) with the scale applied after
the product, the softmax in float32, as ``eager_attention_forward`` computes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ViewNotApplicable
from ..sources.hf import vision_config
from ..layout import TokenLayout
from . import common
from .base import Adapter, HeadWrite, Hooks, branch_scale, point_name, run


@dataclass(frozen=True)
class Terms:
    """What one layer's attention adds for position besides what the tokens carry.

    Attributes:
        bias: (1, H, N, N) added to the scaled scores (BEiT's relative position biases), or None.
        rotary: (q, k) -> (q, k) with the patch tokens rotated by a rotary embedding (DINOv3), or None.
    """

    bias: torch.Tensor | None = None
    rotary: Callable | None = None


NO_TERMS = Terms()


def _no_scales(layer) -> tuple[None, None]:
    return None, None


@dataclass(frozen=True)
class BlockSpec:
    """The names of one pre-norm layer's modules.

    Args:
        norm1, attention, norm2: the layer's attributes: the norm before attention, the attention module
            (``q_proj``, ``k_proj``, ``v_proj``, ``head_dim``) and the norm before the MLP (``mlp``).
        output: the attention module's output projection.
        scale: the attention module's attribute holding the factor the scores are multiplied by.
        scales: layer -> (attention branch scale, MLP branch scale), functions or None (layer scale).
    """

    norm1: str
    attention: str
    norm2: str
    output: str = "o_proj"
    scale: str = "scaling"
    scales: Callable = _no_scales


def heads(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (each (B, H, N, d)) from an attention module's own projections of x (B, N, D)."""
    B, N, _ = x.shape

    def split(proj) -> torch.Tensor:
        return proj(x).view(B, N, -1, attn.head_dim).transpose(1, 2)

    return split(attn.q_proj), split(attn.k_proj), split(attn.v_proj)


def mlp(hooks: Hooks, layer: int, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A transformers MLP with the point ``mlp_hidden``: ``fc1``/``activation_fn``/``fc2`` (ViT, DeiT, DINOv2,
    CLIP, SigLIP, BEiT), ``up_proj``/``act_fn``/``down_proj`` (DINOv3) or gated with ``gate_proj`` (SwiGLU)."""
    rules = hooks.rules
    if hasattr(module, "fc1"):
        h, out = rules.act(module.activation_fn, module.fc1(x)), module.fc2
    elif hasattr(module, "gate_proj"):
        a, b = rules.bilinear(rules.act(module.act_fn, module.gate_proj(x)), module.up_proj(x))
        h, out = a * b, module.down_proj
    else:
        h, out = rules.act(module.act_fn, module.up_proj(x)), module.down_proj
    return out(hooks(point_name("mlp_hidden", layer), h))


def block(spec: BlockSpec, layer_module, layer: int, x: torch.Tensor, terms: Terms, hooks: Hooks) -> torch.Tensor:
    """One pre-norm transformers layer (eval mode) with every named point: (B, N, D) -> (B, N, D)."""
    s1, s2 = spec.scales(layer_module)
    x = hooks(point_name("resid_pre", layer), x)
    h = hooks(point_name("ln1", layer), common.norm(hooks, getattr(layer_module, spec.norm1), x))
    attn = getattr(layer_module, spec.attention)
    q, k, v = heads(attn, h)
    if terms.rotary is not None:
        q, k = terms.rotary(q, k)
    z = common.attention(hooks, layer, q, k, v, float(getattr(attn, spec.scale)), terms.bias, scale_after=True)
    a = getattr(attn, spec.output)(z)
    a = a if s1 is None else s1(a)
    x = hooks(point_name("resid_mid", layer), x + hooks(point_name("attn_out", layer), a))
    h = hooks(point_name("ln2", layer), common.norm(hooks, getattr(layer_module, spec.norm2), x))
    m = mlp(hooks, layer, layer_module.mlp, h)
    m = m if s2 is None else s2(m)
    return hooks(point_name("resid_post", layer), x + hooks(point_name("mlp_out", layer), m))


def layer_scale_modules(layer) -> tuple[Callable, Callable]:
    """DINOv2 and DINOv3: layer scale as modules ``layer_scale1``/``layer_scale2`` (x * lambda1)."""
    return layer.layer_scale1, layer.layer_scale2


def interpolates(model, x: torch.Tensor) -> bool:
    """Whether ``x`` is not the config's image size, so the position terms are fitted to it (the forward's
    ``interpolate_pos_encoding=True``, as the loader's models are run at their processor's size)."""
    config = vision_config(model.config)
    side = config.image_size if not isinstance(config.image_size, int) else (config.image_size, config.image_size)
    return tuple(x.shape[-2:]) != tuple(side)


def position_embedding(model) -> torch.Tensor | None:
    """The learned absolute position embedding as stored, (1, prefix rows + gh * gw, D), or None.

    ViT, DeiT, DINOv2 and BEiT keep a parameter ``position_embeddings``; CLIP and SigLIP an ``nn.Embedding``
    ``position_embedding``, one row per position.
    """
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, torch.Tensor) and table.ndim == 3:
            return table
        table = getattr(module, "position_embedding", None)
        if isinstance(table, torch.nn.Embedding):
            return table.weight[None]
    return None


class HFAdapter(Adapter):
    """A transformers vision model run layer by layer from its own modules (the base of every HF family).

    Attributes:
        block: the names of a layer's modules.
    """

    library = "transformers"
    block: BlockSpec

    # --- what it claims and how it is laid out -------------------------------------------------
    def claims(self, model) -> bool:
        return type(model).__module__.startswith("transformers.") and \
            getattr(getattr(model, "config", None), "model_type", None) in self.hf_model_types

    def label(self, model) -> str:
        return self.hf_model_types[model.config.model_type].label

    def num_layers(self, model) -> int:
        return len(self.layers(model))

    def num_heads(self, model, layer: int = 0) -> int:
        return int(vision_config(model.config).num_attention_heads)

    def prefix_tokens(self, config) -> tuple[str, ...]:
        """The tokens before the patches, in order, as the family's embeddings put them."""
        return ("cls",)

    def global_pool(self, config) -> str:
        return "token"

    def pos_embed_prefix_rows(self, config) -> int:
        """Rows of the position table before the grid (the prefix tokens that carry a position)."""
        return len(self.prefix_tokens(config))

    def config_layout(self, config, input_hw: tuple[int, int] | None = None) -> TokenLayout:
        """The token layout read from a config alone (the memory budget reads it before loading)."""
        vision = vision_config(config)
        patch = vision.patch_size if not isinstance(vision.patch_size, int) else (vision.patch_size,) * 2
        size = vision.image_size if not isinstance(vision.image_size, int) else (vision.image_size,) * 2
        h, w = input_hw or size
        return TokenLayout(prefix_tokens=self.prefix_tokens(config),
                           grid_size=(int(h) // int(patch[0]), int(w) // int(patch[1])),
                           patch_size=(int(patch[0]), int(patch[1])), global_pool=self.global_pool(config),
                           pos_embed_prefix_rows=self.pos_embed_prefix_rows(config))

    def layout(self, model, input_hw=None) -> TokenLayout:
        return self.config_layout(model.config, input_hw)

    def num_classes(self, model) -> int:
        heads = self.hf_model_types[model.config.model_type].heads
        return len(model.config.id2label) if type(model).__name__ in heads else 0

    def class_labels(self, model) -> tuple[str, ...] | None:
        n = self.num_classes(model)
        return tuple(str(model.config.id2label[i]) for i in range(n)) if n else None

    # --- the forward ---------------------------------------------------------------------------
    def base(self, model):
        """The vision model without its classifier."""
        return model.base_model

    def layers(self, model) -> torch.nn.ModuleList:
        raise NotImplementedError

    def embed(self, model, x: torch.Tensor) -> tuple[torch.Tensor, list[Terms]]:
        """(the embeddings' tokens (B, N, D), entering layer 1 after :meth:`embed_norm`; one :class:`Terms` per
        layer)."""
        raise NotImplementedError

    def embed_norm(self, model, h: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        """A norm between the embeddings and layer 1 (CLIP's ``pre_layrnorm``), through the run's rules; most
        families have none."""
        return h

    def final_norm(self, model, h: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        """The model's ``last_hidden_state`` from the last layer's tokens."""
        return common.norm(hooks, self.base(model).layernorm, h)

    def head(self, model, features: torch.Tensor, hooks: Hooks) -> None:
        """Call ``pooled`` (the family's pooled vector, :meth:`pooled_text`) and ``logits`` (with a head)."""
        raise NotImplementedError

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        h, terms = self.embed(model, x)
        h = hooks("embed", self.embed_norm(model, h, hooks))
        for i, (layer, t) in enumerate(zip(self.layers(model), terms)):
            h = block(self.block, layer, i, h, t, hooks)
        if any(hooks.wants(p) for p in ("final_norm", "pooled", "logits")):
            self.readout(model, h, hooks)

    def readout(self, model, tokens: torch.Tensor, hooks: Hooks) -> None:
        """The final norm and the family's head applied to any layer's tokens (B, N, D), through the run's rules:
        ``final_norm``, ``pooled`` and (with a classifier) ``logits``."""
        features = hooks("final_norm", self.final_norm(model, tokens, hooks))
        if hooks.wants("pooled") or hooks.wants("logits"):
            self.head(model, features, hooks)

    def head_write(self, model, layer: int) -> HeadWrite | None:
        """The attention module's output projection and the layer's layer scale (pre-norm layers write
        ``output(z) * scale`` into the residual stream)."""
        module = self.layers(model)[layer]
        attn = getattr(module, self.block.attention)
        proj = getattr(attn, self.block.output)
        if not isinstance(proj, torch.nn.Linear):
            return None
        weight = proj.weight
        return HeadWrite(weight, proj.bias, branch_scale(self.block.scales(module)[0], weight.shape[0], weight),
                         weight.shape[1] // attn.head_dim)

    def why_no_extra_token(self, model) -> str | None:
        """The embeddings add any position table before ``embed`` and attention is blind to token order after it
        (DINOv3's rotary embedding counts its patch tokens from the end), so a token inserted at ``embed`` after the
        prefix tokens runs as one more prefix token; families whose position enters the layers per token pair or
        whose head pools the patch tokens say why not."""
        return None

    # --- what the views read -------------------------------------------------------------------
    def position_encoding(self, model) -> str:
        return "learned absolute position embedding" if self.position_table(model) is not None else "none"

    def position_table(self, model):
        return position_embedding(model)

    def pos_antialias(self, config) -> bool:
        """Whether the family's ``interpolate_pos_encoding`` resamples its position table with antialiasing
        (bicubic, ``align_corners=False`` for every family)."""
        return False

    def native_pos_embed(self, model, layout: TokenLayout):
        """The stored grid (the config's ``image_size``); other grids are resampled as the family's own
        ``interpolate_pos_encoding`` does: bicubic to the exact grid, antialiased where :meth:`pos_antialias`."""
        from ..types import NativePosEmbed

        table = self.position_table(model)
        return None if table is None else NativePosEmbed.from_weights(table, layout.pos_embed_prefix_rows,
                                                                       antialias=self.pos_antialias(model.config))

    def patch_filters(self, model) -> torch.Tensor:
        """The linear patch-embedding filters (D, 3, P, P): the convolution with kernel = stride = patch size."""
        config = vision_config(model.config)
        patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d) and module.in_channels == 3 and \
                    module.kernel_size[0] == module.stride[0] == patch:
                return module.weight
        raise ViewNotApplicable(f"{type(model).__name__} has no linear RGB patch filters.")

    def extra_steps(self, model, layer: int) -> list[str]:
        """The layer's steps between its normed input and the scores besides the projections, in words."""
        return []

    def attention_steps(self, model, layer: int) -> list[str]:
        norm = getattr(self.layers(model)[layer], self.block.norm1)
        return [f"the block's input goes through {self.block.norm1} ({type(norm).__name__})"] + \
            self.extra_steps(model, layer)

    def layer_qkv(self, model, x: torch.Tensor, layer: int):
        name = point_name("ln1", layer)
        h = run(self, model, x, keep=(name,), stop_after=name)[name]
        _, terms = self.embed(model, x)
        attn = getattr(self.layers(model)[layer], self.block.attention)
        q, k, v = heads(attn, h)
        if terms[layer].rotary is not None:
            q, k = terms[layer].rotary(q, k)
        return (q, k, v, float(getattr(attn, self.block.scale)), self.attention_steps(model, layer),
                terms[layer].bias)

    def card(self, model) -> dict:
        config = vision_config(model.config)
        return {"library": self.library, "family": self.label(model), "architecture": type(model).__name__,
                "model_type": model.config.model_type, "attn_implementation": model.config._attn_implementation,
                "layers": int(config.num_hidden_layers), "heads": int(config.num_attention_heads),
                "embed_dim": int(config.hidden_size), "source": getattr(model, "name_or_path", "") or ""}


def config_layout(config, input_hw: tuple[int, int] | None = None) -> TokenLayout | None:
    """The token layout of a transformers config whose ``model_type`` an :class:`HFAdapter` reads, or None."""
    from .registry import ADAPTERS, load_all

    load_all()
    model_type = getattr(config, "model_type", None)
    found = next((a for a in ADAPTERS.values() if isinstance(a, HFAdapter) and model_type in a.hf_model_types), None)
    return None if found is None else found.config_layout(config, input_hw)
