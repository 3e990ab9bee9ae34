"""How the timm ViT adapter (:mod:`vitviz.adapters.timm_vit`) reads one attention module: its q, k and v as the dot
product sees them (after q/k norm and the rotary embedding, grouped key/value heads tiled), the bias added to the
scaled scores, and its extra steps in words. One :class:`AttentionReader` per attention class, registered in
``timm_vit.ATTENTIONS``; what a layer adds for position arrives as :class:`PositionTerms`.
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


def plain_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm ``Attention`` (vision_transformer): fused qkv, optional q/k norm."""
    B, N, _ = x.shape
    q, k, v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return Heads(attn.q_norm(q), attn.k_norm(k), v, float(attn.scale))


def qkv_with_bias(attn, x: torch.Tensor) -> torch.Tensor:
    """EVA and BEiT keep the qkv bias apart (``q_bias``, a zero ``k_bias``, ``v_bias``): (B, N, 3 * H * d)."""
    if getattr(attn, "q_bias", None) is None:
        return attn.qkv(x)
    bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    return attn.qkv(x) + bias if attn.qkv_bias_separate else F.linear(x, weight=attn.qkv.weight, bias=bias)


def rope_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm ``EvaAttention`` and ``AttentionRope``: fused or separate projections, q/k norm, rotary
    embedding on the patch tokens, grouped key/value heads."""
    from timm.layers import apply_rot_embed_cat

    B, N, _ = x.shape
    if attn.qkv is not None:
        q, k, v = qkv_with_bias(attn, x).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
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


def beit_heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm BEiT ``Attention``: qkv with separate q/v bias; its own relative position bias plus the shared one."""
    B, N, _ = x.shape
    q, k, v = qkv_with_bias(attn, x).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    bias = attn._get_rel_pos_bias() if attn.relative_position_bias_table is not None else None
    if terms.bias is not None:
        bias = terms.bias if bias is None else bias + terms.bias
    return Heads(q, k, v, float(attn.scale), None if bias is None else bias.reshape(1, *bias.shape[-3:]))


ABSENT = torch.nn.Identity()  # what a module that an attention class lacks counts as


def plain_steps(attn, terms: PositionTerms) -> list[str]:
    steps = []
    if not isinstance(getattr(attn, "q_norm", ABSENT), torch.nn.Identity):
        steps.append(f"q and k are normalised per head ({type(attn.q_norm).__name__}) before the dot product")
    if terms.rope is not None:
        steps.append("the patch tokens' q and k are rotated by the rotary position embedding (RoPE) of their "
                     "patch's row and column before the dot product (prefix tokens are not rotated)")
    if getattr(attn, "num_kv_groups", 1) > 1:
        steps.append(f"{attn.num_heads} query heads share {attn.num_kv_heads} key/value heads (grouped-query attention)")
    if not isinstance(getattr(attn, "norm", ABSENT), torch.nn.Identity):
        steps.append(f"the heads' output goes through {type(attn.norm).__name__} before the projection")
    if getattr(attn, "gate", None) is not None:
        steps.append("the output is gated (sigmoid) before the projection")
    return steps


def beit_steps(attn, terms: PositionTerms) -> list[str]:
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
    steps: Callable[..., list[str]] = plain_steps
