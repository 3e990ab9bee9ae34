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
  and rotary embedding) and any bias added to the scaled scores.

The probabilities are softmax(q kᵀ · scale + bias) with exactly the terms the model's own unfused
path uses: rotary embeddings applied to the patch tokens' q and k (prefix tokens unrotated), BEiT's
relative position bias (per block, plus the shared one) added to the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import ViewNotApplicable
from ..layout import TokenLayout
from . import common
from .base import Adapter, HeadWrite, Hooks, branch_scale, point_name, run
from .registry import register_adapter


@dataclass(frozen=True)
class PositionTerms:
    """What one layer's attention adds for position, besides what the tokens carry.

    Attributes:
        rope: the rotary embedding of the patch tokens as the model's ``_pos_embed`` gives it for
            this layer (``apply_rot_embed_cat`` layout), or None.
        bias: (H, N, N) or (1, H, N, N) added to the scaled scores (BEiT's shared relative position
            bias; a block's own bias is read from its attention module), or None.
    """

    rope: torch.Tensor | None = None
    bias: torch.Tensor | None = None


NO_TERMS = PositionTerms()


@dataclass
class Heads:
    """One layer's attention inputs, as the dot product sees them.

    Attributes:
        q, k, v: (B, H, N, d_head); q and k after any per-head norm and rotary embedding.
        scale: the factor the scores q·k are multiplied by.
        bias: (1, H, N, N) added to the scaled scores (relative position bias), or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    bias: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Attention modules: (attn, x (B, N, C), terms) -> Heads


def _plain_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm ``Attention`` (vision_transformer): fused qkv, optional q/k norm."""
    B, N, _ = x.shape
    q, k, v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return Heads(attn.q_norm(q), attn.k_norm(k), v, float(attn.scale))


def _qkv_with_bias(attn, x: torch.Tensor) -> torch.Tensor:
    """EVA and BEiT keep the qkv bias apart (``q_bias``, a zero ``k_bias``, ``v_bias``): (B, N, 3 * H * d)."""
    if getattr(attn, "q_bias", None) is None:
        return attn.qkv(x)
    bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    return attn.qkv(x) + bias if attn.qkv_bias_separate else F.linear(x, weight=attn.qkv.weight, bias=bias)


def _rope_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm ``EvaAttention`` and ``AttentionRope``: fused or separate projections, q/k norm, rotary
    embedding on the patch tokens, grouped key/value heads."""
    from timm.layers import apply_rot_embed_cat

    B, N, _ = x.shape
    if attn.qkv is not None:
        q, k, v = _qkv_with_bias(attn, x).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
        q = attn.q_proj(x).reshape(B, N, attn.num_heads, -1).transpose(1, 2)
        k = attn.k_proj(x).reshape(B, N, kv_heads, -1).transpose(1, 2)
        v = attn.v_proj(x).reshape(B, N, kv_heads, -1).transpose(1, 2)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if terms.rope is not None:
        npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], terms.rope, half=half)], dim=2).type_as(v)
        k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], terms.rope, half=half)], dim=2).type_as(v)
    groups = getattr(attn, "num_kv_groups", 1)
    if groups > 1:  # head h reads key/value head h // groups, as timm tiles them
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return Heads(q, k, v, float(attn.scale))


def _beit_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm BEiT ``Attention``: qkv with separate q/v bias; its own relative position bias plus the shared one."""
    B, N, _ = x.shape
    q, k, v = _qkv_with_bias(attn, x).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    bias = attn._get_rel_pos_bias() if attn.relative_position_bias_table is not None else None
    if terms.bias is not None:
        bias = terms.bias if bias is None else bias + terms.bias
    return Heads(q, k, v, float(attn.scale), None if bias is None else bias.reshape(1, *bias.shape[-3:]))


_NONE = torch.nn.Identity()  # what a module that an attention class lacks counts as


def _plain_steps(attn, terms: PositionTerms) -> list[str]:
    steps = []
    if not isinstance(getattr(attn, "q_norm", _NONE), torch.nn.Identity):
        steps.append(f"q and k are normalised per head ({type(attn.q_norm).__name__}) before the dot product")
    if terms.rope is not None:
        steps.append("the patch tokens' q and k are rotated by the rotary position embedding (RoPE) of their "
                     "patch's row and column before the dot product (prefix tokens are not rotated)")
    if getattr(attn, "num_kv_groups", 1) > 1:
        steps.append(f"{attn.num_heads} query heads share {attn.num_kv_heads} key/value heads (grouped-query attention)")
    if not isinstance(getattr(attn, "norm", _NONE), torch.nn.Identity):
        steps.append(f"the heads' output goes through {type(attn.norm).__name__} before the projection")
    if getattr(attn, "gate", None) is not None:
        steps.append("the output is gated (sigmoid) before the projection")
    return steps


def _beit_steps(attn, terms: PositionTerms) -> list[str]:
    own = attn.relative_position_bias_table is not None
    if not own and terms.bias is None:
        return []
    which = " and ".join(w for w, on in (("this block's own", own), ("the model's shared", terms.bias is not None)) if on)
    return [f"a learned relative position bias ({which}, one value per head and pair of positions) is added to the "
            "scaled scores before the softmax"]


@dataclass(frozen=True)
class AttentionReader:
    """How one attention class is read.

    Args:
        heads: (attn, x, terms) -> :class:`Heads`.
        steps: (attn, terms) -> its extra steps in words, in order (the anatomy page shows them).
    """

    heads: Callable[..., Heads]
    steps: Callable[..., list[str]] = _plain_steps


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
        Attention: AttentionReader(_plain_heads),
        eva.EvaAttention: AttentionReader(_rope_heads),
        AttentionRope: AttentionReader(_rope_heads),
        beit.Attention: AttentionReader(_beit_heads, _beit_steps),
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
            attn = getattr(blk, "attn", None)
            if type(blk) not in BLOCKS or type(attn) not in ATTENTIONS:
                inside = f" with {type(attn).__name__} attention" if attn is not None else " without one attention module"
                return f"block {i} is a {type(blk).__name__}{inside}"
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
        if reader.post_norm or not isinstance(getattr(attn, "norm", _NONE), torch.nn.Identity) \
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
