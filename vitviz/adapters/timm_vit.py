"""The timm ViT adapter: ``VisionTransformer``, ``Eva`` and ``Beit`` spelled out block by block.

timm computes attention with fused ``scaled_dot_product_attention`` by default, so the
probabilities never exist as a tensor, and flipping ``fused_attn`` would mutate a model every
session shares. The adapter therefore runs the model's own submodules in a forward that spells
attention out with the named points of :mod:`vitviz.adapters.base` (no hooks, nothing written to
the model: thread-safe). What differs between
families is kept in three small registries keyed by module class, never by model name:

- :data:`MODELS`: model class -> how the tokens and each layer's position terms are made
  (``VisionTransformer``: absolute position embedding; ``Eva``: absolute and/or rotary (RoPE);
  ``Beit``: optional absolute embedding plus relative position biases);
- :data:`BLOCKS`: block class -> how the block runs around its attention (pre-norm with layer
  scale, or post-norm);
- :data:`ATTENTIONS`: attention class -> its q, k, v as the dot product sees them (after q/k norm
  and rotary embedding) and any bias added to the scaled scores (the readers: :mod:`vitviz.adapters.timm_attention`).

The probabilities are softmax(q kᵀ · scale + bias) with exactly the terms the model's own unfused
path uses: rotary embeddings applied to the patch tokens' q and k (prefix tokens unrotated), BEiT's
relative position bias (per block, plus the shared one) added to the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ViewNotApplicable
from ..layout import TokenLayout
from . import common
from .base import Adapter, HeadWrite, Hooks, branch_scale, point_name, run
from .registry import register_adapter
from .timm_attention import (ABSENT, NO_TERMS, AttentionReader, PositionTerms, beit_heads, beit_steps,
                             plain_heads, rope_heads)


# ---------------------------------------------------------------------------------------------
# Blocks: how each block class runs around its attention and MLP


@dataclass(frozen=True)
class BlockReader:
    """How one block class is laid out.

    Args:
        post_norm: norms after each branch (``ResPostBlock``, ``EvaBlockPostNorm``: the attention reads
            the block input itself) rather than before it.
        scales: blk -> (attention branch scale, MLP branch scale): the layer scale as functions, or
            None where the block has none.
    """

    post_norm: bool = False
    scales: Callable = lambda blk: (None, None)

    def attention_input(self, blk, x: torch.Tensor) -> torch.Tensor:
        return x if self.post_norm else blk.norm1(x)


def _ls_scales(blk):
    """vision_transformer ``Block``: layer scale as modules ``ls1``/``ls2`` (Identity without)."""
    return blk.ls1, blk.ls2


def _gamma_scales(blk):
    """``EvaBlock`` and BEiT ``Block``: layer scale as parameters ``gamma_1``/``gamma_2`` (or None)."""
    g1, g2 = blk.gamma_1, blk.gamma_2
    return (None if g1 is None else (lambda a: g1 * a)), (None if g2 is None else (lambda m: g2 * m))


def block(blk, layer: int, x: torch.Tensor, terms: PositionTerms, hooks: Hooks) -> torch.Tensor:
    """One timm block (eval mode), spelled out with every named point: (B, N, D) -> (B, N, D)."""
    reader = BLOCKS[type(blk)]
    s1, s2 = reader.scales(blk)
    x = hooks(point_name("resid_pre", layer), x)
    h = hooks(point_name("ln1", layer), x if reader.post_norm else common.norm(hooks, blk.norm1, x))
    a = _attention_branch(blk.attn, layer, h, terms, hooks)
    a = common.norm(hooks, blk.norm1, a) if reader.post_norm else (a if s1 is None else s1(a))
    x = hooks(point_name("resid_mid", layer), x + hooks(point_name("attn_out", layer), a))
    h = hooks(point_name("ln2", layer), x if reader.post_norm else common.norm(hooks, blk.norm2, x))
    m = common.mlp(hooks, layer, blk.mlp, h)
    m = common.norm(hooks, blk.norm2, m) if reader.post_norm else (m if s2 is None else s2(m))
    return hooks(point_name("resid_post", layer), x + hooks(point_name("mlp_out", layer), m))


def _attention_branch(attn, layer: int, x: torch.Tensor, terms: PositionTerms, hooks: Hooks) -> torch.Tensor:
    """One attention module spelled out: (B, N, C) -> its output projection's output (B, N, C)."""
    h = ATTENTIONS[type(attn)].heads(attn, x, terms)
    out = common.attention(hooks, layer, h.q, h.k, h.v, h.scale, h.bias)
    if getattr(attn, "norm", None) is not None:
        out = common.norm(hooks, attn.norm, out)
    if getattr(attn, "gate", None) is not None:
        out, gate = hooks.rules.bilinear(out, attn.gate(x).sigmoid())
        out = out * gate
    return attn.proj(out)



# ---------------------------------------------------------------------------------------------
# Models: embed(model, x (B, 3, H, W)) -> (tokens (B, N, D), PositionTerms per layer)


def _vit_embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """``VisionTransformer.forward_features`` up to the blocks."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    return x, [NO_TERMS] * len(model.blocks)


def _eva_embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """``Eva.forward_features`` up to the blocks: ``_pos_embed`` gives the rotary embedding too
    (per layer for mixed RoPE, whose frequencies are learned per depth)."""
    x, rope = model._pos_embed(model.patch_embed(x))
    x = model.norm_pre(x)
    depth = len(model.blocks)
    if rope is None:
        return x, [NO_TERMS] * depth
    if getattr(model, "rope_mixed", False):
        return x, [PositionTerms(rope=rope[i]) for i in range(depth)]
    return x, [PositionTerms(rope=rope)] * depth


def _beit_embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """``Beit.forward_features`` up to the blocks: CLS, optional absolute embedding, the shared bias."""
    x = model.patch_embed(x)
    x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
    if model.pos_embed is not None:
        x = x + model.pos_embed
    x = model.pos_drop(x)
    shared = model.rel_pos_bias() if model.rel_pos_bias is not None else None
    return x, [PositionTerms(bias=shared)] * len(model.blocks)


def _vit_position(model) -> str:
    return "learned absolute position embedding" if model.pos_embed is not None else "none"


def _eva_position(model) -> str:
    kinds = [k for k, on in (("learned absolute position embedding", model.pos_embed is not None),
                             ("rotary position embedding (RoPE) on q and k", model.rope is not None)) if on]
    return " + ".join(kinds) or "none"


def _beit_position(model) -> str:
    kinds = [k for k, on in (("learned absolute position embedding", model.pos_embed is not None),
                             ("relative position bias per block", model.blocks[0].attn.relative_position_bias_table
                              is not None),
                             ("shared relative position bias", model.rel_pos_bias is not None)) if on]
    return " + ".join(kinds) or "none"


def _pool(model, features: torch.Tensor) -> torch.Tensor:
    """``forward_head``'s pooling: ViT's and EVA's ``pool`` (CLS, the mean of the patch tokens, attention pooling),
    BEiT's own CLS or mean."""
    if hasattr(model, "pool"):
        return model.pool(features)
    if not model.global_pool:
        return features
    return features[:, model.num_prefix_tokens:].mean(dim=1) if model.global_pool == "avg" else features[:, 0]


def _standard_head(model, features: torch.Tensor, hooks: Hooks) -> None:
    """``forward_head`` of ViT, EVA and BEiT spelled out: pool, ``fc_norm`` (through the run's rules, as every
    norm of the forward), (dropout: none in eval), then ``head`` reads the pooled vector."""
    pooled = hooks("pooled", common.norm(hooks, model.fc_norm, _pool(model, features)))
    if model.num_classes > 0 and hooks.wants("logits"):
        hooks("logits", model.head(pooled))


def _distilled_head(model, features: torch.Tensor, hooks: Hooks) -> None:
    """DeiT distilled (eval): the mean of the class head on CLS and the distillation head on its token."""
    hooks("pooled", (features[:, 0] + features[:, 1]) / 2)
    if model.num_classes > 0 and hooks.wants("logits"):
        hooks("logits", (model.head(features[:, 0]) + model.head_dist(features[:, 1])) / 2)


@dataclass(frozen=True)
class ModelReader:
    """How one model class makes its tokens.

    Args:
        label: what a reader of the papers calls the family.
        embed: (model, x) -> (tokens entering block 1 (B, N, D), one :class:`PositionTerms` per layer).
        position: model -> how it encodes position, in words (model card, settings.json).
        head: (model, final-norm features, hooks) -> None, calling the points ``pooled`` and ``logits``.
    """

    label: str
    embed: Callable[..., tuple[torch.Tensor, list[PositionTerms]]]
    position: Callable[..., str]
    head: Callable[..., None] = _standard_head


def _registries():
    from timm.layers import Attention, AttentionRope
    from timm.models import beit, eva
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer

    models = {
        VisionTransformer: ModelReader("ViT", _vit_embed, _vit_position),
        VisionTransformerDistilled: ModelReader("ViT", _vit_embed, _vit_position, _distilled_head),
        eva.Eva: ModelReader("EVA / EVA-02 / rotary ViT", _eva_embed, _eva_position),
        beit.Beit: ModelReader("BEiT", _beit_embed, _beit_position),
    }
    blocks = {
        Block: BlockReader(scales=_ls_scales),
        ResPostBlock: BlockReader(post_norm=True),
        eva.EvaBlock: BlockReader(scales=_gamma_scales),
        eva.EvaBlockPostNorm: BlockReader(post_norm=True),
        beit.Block: BlockReader(scales=_gamma_scales),
    }
    attentions = {
        Attention: AttentionReader(plain_heads),
        eva.EvaAttention: AttentionReader(rope_heads),
        AttentionRope: AttentionReader(rope_heads),
        beit.Attention: AttentionReader(beit_heads, beit_steps),
    }
    return models, blocks, attentions


MODELS, BLOCKS, ATTENTIONS = _registries()


def model_reader(model) -> ModelReader | None:
    """The reader of the closest registered class of ``model`` (VisionTransformerDistilled reads as a ViT)."""
    return next((MODELS[c] for c in type(model).__mro__ if c in MODELS), None)


def embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """Tokens entering block 1 (B, N, D) and each layer's position terms, as ``forward_features`` makes them."""
    return model_reader(model).embed(model, x)


@register_adapter
class TimmViT(Adapter):
    """timm ``VisionTransformer`` (ViT, DeiT, DINO, DINOv2, CLIP, SigLIP, hybrid ResNet+ViT), ``Eva`` (EVA,
    EVA-02, rotary ViTs) and ``Beit`` with their standard blocks, spelled out block by block."""

    name = "timm-vit"
    library = "timm"
    families = ("timm VisionTransformer (ViT, DeiT, DINO, DINOv2, CLIP, SigLIP, hybrid ResNet+ViT), Eva (EVA, EVA-02 "
                "and rotary-embedding ViTs) and Beit (BEiT, BEiT v2) models with their standard blocks")

    def claims(self, model) -> bool:
        return model_reader(model) is not None

    def why_unsupported(self, model) -> str | None:
        """Blocks and attention modules are matched by exact class: a subclass may change the forward."""
        from timm.layers import HybridEmbed, PatchEmbed

        if not isinstance(getattr(model, "patch_embed", None), (PatchEmbed, HybridEmbed)):
            return f"its patch embedding is a {type(getattr(model, 'patch_embed', None)).__name__}"
        for i, blk in enumerate(model.blocks):
            if why := common.block_mismatch(f"block {i}", blk, tuple(BLOCKS), tuple(ATTENTIONS)):
                return why
        return None

    def label(self, model) -> str:
        return model_reader(model).label

    def num_layers(self, model) -> int:
        return len(model.blocks)

    def num_heads(self, model, layer: int = 0) -> int:
        return int(model.blocks[layer].attn.num_heads)

    def layout(self, model, input_hw=None) -> TokenLayout:
        return TokenLayout.from_model(model, input_hw)

    def num_classes(self, model) -> int:
        return int(getattr(model, "num_classes", 0))

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        if hooks.plain_blocks(len(model.blocks)):
            # Nothing inside the blocks is read or changed: the library's fused forward is the same function.
            h = model.forward_features(x)
            if hooks.wants("final_norm"):
                hooks("final_norm", h)
            reader = model_reader(model)
            reader.head(model, h, hooks)
            return
        h, terms = embed(model, x)
        h = hooks("embed", h)
        for i, (blk, t) in enumerate(zip(model.blocks, terms)):
            h = block(blk, i, h, t, hooks)
        if any(hooks.wants(p) for p in ("final_norm", "pooled", "logits")):
            self.readout(model, h, hooks)

    def readout(self, model, tokens: torch.Tensor, hooks: Hooks) -> None:
        features = hooks("final_norm", common.norm(hooks, model.norm, tokens))
        if hooks.wants("pooled") or hooks.wants("logits"):
            model_reader(model).head(model, features, hooks)

    def head_write(self, model, layer: int) -> HeadWrite | None:
        """The output projection and layer scale of a pre-norm block whose heads' context goes straight into
        ``attn.proj`` (no norm or gate between them)."""
        blk = model.blocks[layer]
        reader, attn = BLOCKS[type(blk)], blk.attn
        if reader.post_norm or not isinstance(getattr(attn, "norm", ABSENT), torch.nn.Identity) \
                or getattr(attn, "gate", None) is not None or not isinstance(getattr(attn, "proj", None), torch.nn.Linear):
            return None
        weight = attn.proj.weight
        return HeadWrite(weight, attn.proj.bias, branch_scale(reader.scales(blk)[0], weight.shape[0], weight),
                         int(attn.num_heads))

    def why_not(self, model, view: str) -> str | None:
        if view == "readout":
            if getattr(model, "attn_pool", None) is not None:
                return ("its head pools the tokens by attention (global_pool='map'), which is not linear in the "
                        "tokens: the direct readout does not apply to it yet.")
            if any(self.head_write(model, i) is None for i in range(len(model.blocks))):
                return ("its attention blocks put a norm or a gate between the heads and the output projection (or "
                        "norm after each branch), so a head's write is not its own: the direct readout does not apply.")
        return None

    def why_no_extra_token(self, model) -> str | None:
        """Attention is blind to token order once the position embedding is added at ``embed``, so a token
        inserted there runs as a prefix token, unless position enters inside the blocks or the head pools
        the patches."""
        if getattr(model, "rope", None) is not None:
            return "its rotary position embedding is laid out for the model's own prefix tokens"
        if getattr(model, "rel_pos_bias", None) is not None or getattr(
                model.blocks[0].attn, "relative_position_bias_table", None) is not None:
            return "its relative position bias is sized for the model's own tokens"
        if model_reader(model).head is _standard_head and model.global_pool != "token":
            return f"its head pools the patch tokens (global_pool={model.global_pool!r}) and would count the extra token"
        return None

    def position_encoding(self, model) -> str:
        return model_reader(model).position(model)

    def position_table(self, model):
        return getattr(model, "pos_embed", None)

    def patch_filters(self, model) -> torch.Tensor:
        proj = getattr(model.patch_embed, "proj", None)
        if getattr(model.patch_embed, "backbone", None) is not None or not isinstance(proj, torch.nn.Conv2d) \
                or proj.in_channels != 3:
            raise ViewNotApplicable(f"{type(model).__name__} has no linear RGB patch filters (its patch embedding "
                                    "reads a CNN's features).")
        return proj.weight

    def attention_steps(self, model, layer: int) -> list[str]:
        _, terms = embed_terms(model)
        blk, reader = model.blocks[layer], BLOCKS[type(model.blocks[layer])]
        steps = [] if reader.post_norm else [f"the block's input goes through norm1 ({type(blk.norm1).__name__})"]
        return steps + ATTENTIONS[type(blk.attn)].steps(blk.attn, terms[layer])

    def layer_qkv(self, model, x: torch.Tensor, layer: int):
        name = point_name("ln1", layer)
        h = run(self, model, x, keep=(name,), stop_after=name)[name]
        _, terms = embed(model, x)
        blk = model.blocks[layer]
        heads = ATTENTIONS[type(blk.attn)].heads(blk.attn, h, terms[layer])
        return heads.q, heads.k, heads.v, heads.scale, self.attention_steps(model, layer), heads.bias

    def pooled_text(self, model) -> str:
        return "forward_head(pre_logits=True)"

    def card(self, model) -> dict:
        return {"library": "timm", "family": type(model).__name__, "family_label": self.label(model),
                "architecture": model.pretrained_cfg.get("architecture", type(model).__name__),
                "timm_architecture": model.pretrained_cfg.get("architecture", type(model).__name__),
                "layers": len(model.blocks), "heads": model.blocks[0].attn.num_heads, "embed_dim": model.embed_dim}


def embed_terms(model) -> tuple[None, list[PositionTerms]]:
    """Each layer's position terms without running the patches (the anatomy's words need only which exist)."""
    depth = len(model.blocks)
    if getattr(model, "rope", None) is not None:
        return None, [PositionTerms(rope=torch.empty(0))] * depth
    shared = getattr(model, "rel_pos_bias", None)
    return None, [PositionTerms(bias=torch.empty(0) if shared is not None else None)] * depth
