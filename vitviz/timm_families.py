"""How to run each timm ViT family and read its attention: the one place that knows their modules.

timm computes attention with fused ``scaled_dot_product_attention`` by default, so the
probabilities never exist as a tensor, and flipping ``fused_attn`` would mutate a model every
session shares. :mod:`vitviz.capture` therefore runs the model's own submodules in a forward that
spells attention out (no hooks, nothing written to the model: thread-safe). What differs between
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
# Blocks: forward(blk, x, attend) with attend(attention input) -> attention output


def _layer_scale_block(blk, x: torch.Tensor, attend: Callable) -> torch.Tensor:
    """vision_transformer ``Block``: pre-norm, layer scale as modules ``ls1``/``ls2``."""
    x = x + blk.ls1(attend(blk.norm1(x)))
    return x + blk.ls2(blk.mlp(blk.norm2(x)))


def _gamma_block(blk, x: torch.Tensor, attend: Callable) -> torch.Tensor:
    """``EvaBlock`` and BEiT ``Block``: pre-norm, layer scale as parameters ``gamma_1``/``gamma_2`` (or None)."""
    a = attend(blk.norm1(x))
    x = x + (a if blk.gamma_1 is None else blk.gamma_1 * a)
    m = blk.mlp(blk.norm2(x))
    return x + (m if blk.gamma_2 is None else blk.gamma_2 * m)


def _post_norm_block(blk, x: torch.Tensor, attend: Callable) -> torch.Tensor:
    """``ResPostBlock`` and ``EvaBlockPostNorm``: attention reads the block input; norms after each branch."""
    x = x + blk.norm1(attend(x))
    return x + blk.norm2(blk.mlp(x))


@dataclass(frozen=True)
class BlockReader:
    """How one block class runs around its attention.

    Args:
        forward: (blk, x, attend) -> the block's output; ``attend`` maps the attention input to its output.
        pre_norm: whether the attention reads ``norm1(x)`` (else the block input itself).
    """

    forward: Callable[..., torch.Tensor]
    pre_norm: bool = True

    def attention_input(self, blk, x: torch.Tensor) -> torch.Tensor:
        return blk.norm1(x) if self.pre_norm else x


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


@dataclass(frozen=True)
class ModelReader:
    """How one model class makes its tokens.

    Args:
        label: what a reader of the papers calls the family.
        embed: (model, x) -> (tokens entering block 1 (B, N, D), one :class:`PositionTerms` per layer).
        position: model -> how it encodes position, in words (model card, settings.json).
    """

    label: str
    embed: Callable[..., tuple[torch.Tensor, list[PositionTerms]]]
    position: Callable[..., str]


def _registries():
    from timm.layers import Attention, AttentionRope
    from timm.models import beit, eva
    from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer

    models = {
        VisionTransformer: ModelReader("ViT", _vit_embed, _vit_position),
        eva.Eva: ModelReader("EVA / EVA-02 / rotary ViT", _eva_embed, _eva_position),
        beit.Beit: ModelReader("BEiT", _beit_embed, _beit_position),
    }
    blocks = {
        Block: BlockReader(_layer_scale_block),
        ResPostBlock: BlockReader(_post_norm_block, pre_norm=False),
        eva.EvaBlock: BlockReader(_gamma_block),
        eva.EvaBlockPostNorm: BlockReader(_post_norm_block, pre_norm=False),
        beit.Block: BlockReader(_gamma_block),
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


def why_unsupported(model) -> str | None:
    """Why capture cannot read this model's attention exactly, as a sentence fragment; None when it can.

    Blocks and attention modules are matched by exact class: a subclass may change the forward.
    """
    from timm.layers import HybridEmbed, PatchEmbed

    if model_reader(model) is None:
        return f"it is a {type(model).__name__}, not a timm VisionTransformer, Eva or Beit"
    if not isinstance(getattr(model, "patch_embed", None), (PatchEmbed, HybridEmbed)):
        return f"its patch embedding is a {type(getattr(model, 'patch_embed', None)).__name__}"
    for i, blk in enumerate(model.blocks):
        attn = getattr(blk, "attn", None)
        if type(blk) not in BLOCKS or type(attn) not in ATTENTIONS:
            inside = f" with {type(attn).__name__} attention" if attn is not None else " without one attention module"
            return f"block {i} is a {type(blk).__name__}{inside}"
    return None


def supported_families() -> str:
    """The families capture reads, in words (the "not supported yet" sentence names them)."""
    return ("timm VisionTransformer (ViT, DeiT, DINO, DINOv2, CLIP, SigLIP, hybrid ResNet+ViT), Eva (EVA, EVA-02 "
            "and rotary-embedding ViTs) and Beit (BEiT, BEiT v2) models with their standard blocks, and Swin "
            "Transformers (window attention, vitviz.swin)")


def attend(attn, x: torch.Tensor, terms: PositionTerms = NO_TERMS) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention module's unfused forward that also returns the probabilities.

    x: (B, N, C) -> (output (B, N, C), probabilities (B, H, N, N) float32).
    """
    B, N, _ = x.shape
    h = ATTENTIONS[type(attn)].heads(attn, x, terms)
    scores = (h.q * h.scale) @ h.k.transpose(-2, -1)
    if h.bias is not None:
        scores = scores + h.bias
    # Softmax in float32 so half-precision models still give rows that sum to 1.
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    out = (probs.to(h.v.dtype) @ h.v).transpose(1, 2).reshape(B, N, -1)
    if getattr(attn, "norm", None) is not None:
        out = attn.norm(out)
    if getattr(attn, "gate", None) is not None:
        out = out * attn.gate(x).sigmoid()
    return attn.proj(out), probs


def block_forward(blk, x: torch.Tensor, terms: PositionTerms = NO_TERMS) -> tuple[torch.Tensor, torch.Tensor]:
    """One block (eval mode) returning its attention too: (B, N, D) -> ((B, N, D), (B, H, N, N))."""
    seen = []

    def attention(y):
        out, probs = attend(blk.attn, y, terms)
        seen.append(probs)
        return out

    return BLOCKS[type(blk)].forward(blk, x, attention), seen[0]


def embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """Tokens entering block 1 (B, N, D) and each layer's position terms, as ``forward_features`` makes them."""
    return model_reader(model).embed(model, x)


def layer_heads(model, x: torch.Tensor, layer: int) -> tuple[Heads, list[str]]:
    """q, k, v (and bias) of block ``layer`` (0-based) from the images ``x`` (B, 3, H, W), with the block's
    extra steps in words; softmax(q kᵀ · scale + bias) is the attention capture returns."""
    h, terms = embed(model, x)
    for blk, t in zip(model.blocks[:layer], terms):
        h, _ = block_forward(blk, h, t)
    blk, reader = model.blocks[layer], BLOCKS[type(model.blocks[layer])]
    attention = ATTENTIONS[type(blk.attn)]
    steps = [f"the block's input goes through norm1 ({type(blk.norm1).__name__})"] if reader.pre_norm else []
    steps += attention.steps(blk.attn, terms[layer])
    return attention.heads(blk.attn, reader.attention_input(blk, h), terms[layer]), steps
