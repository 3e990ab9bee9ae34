"""timm ``VisionTransformerRelPos`` (``vit_relpos_*``, ``vit_srelpos_*``): global attention with a relative
position bias, read by the timm ViT adapter.

The model is a ViT without an absolute position table: each block's attention adds a learned bias per head
and pair of positions to the scaled scores (``RelPosMlp``: an MLP of the log-spaced relative coordinates;
``RelPosBias``: a table), or one bias shared by all blocks (``vit_srelpos_*``); prefix tokens get a zero
bias. This module registers its model, block and attention classes in :mod:`vitviz.adapters.timm_vit`'s
registries (keyed by class), so the ViT adapter's spelled-out forward, named points and views read it.
"""
from __future__ import annotations

import torch

from . import timm_vit
from .timm_attention import AttentionReader, Heads, PositionTerms, plain_steps
from .timm_vit import BlockReader, ModelReader


def _embed(model, x: torch.Tensor) -> tuple[torch.Tensor, list[PositionTerms]]:
    """``VisionTransformerRelPos.forward_features`` up to the blocks: patches, the optional CLS token and the
    shared bias (``vit_srelpos_*``) every block adds."""
    x = model.patch_embed(x)
    if model.cls_token is not None:
        x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
    shared = model.shared_rel_pos.get_bias() if model.shared_rel_pos is not None else None
    return x, [PositionTerms(bias=shared)] * len(model.blocks)


def _position(model) -> str:
    own = model.blocks[0].attn.rel_pos
    kind = type(own if own is not None else model.shared_rel_pos).__name__
    where = "shared by all blocks" if model.shared_rel_pos is not None else "per block"
    return f"relative position bias {where} ({kind})"


def _heads(attn, x: torch.Tensor, terms: PositionTerms) -> Heads:
    """timm ``RelPosAttention``: fused qkv, q/k norm, the block's own bias or the shared one."""
    B, N, _ = x.shape
    q, k, v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    bias = attn.rel_pos.get_bias() if attn.rel_pos is not None else terms.bias
    return Heads(attn.q_norm(q), attn.k_norm(k), v, float(attn.scale), bias)


def _steps(attn, terms: PositionTerms) -> list[str]:
    which = "this block's own" if attn.rel_pos is not None else "the model's shared"
    return plain_steps(attn, PositionTerms()) + [
        f"a learned relative position bias ({which}, one value per head and pair of positions; zero for prefix "
        "tokens) is added to the scaled scores before the softmax"]


def _register() -> None:
    from timm.models import vision_transformer_relpos as relpos

    timm_vit.MODELS[relpos.VisionTransformerRelPos] = ModelReader("ViT with relative position bias", _embed, _position)
    timm_vit.BLOCKS[relpos.RelPosBlock] = BlockReader(scales=timm_vit._ls_scales)
    timm_vit.BLOCKS[relpos.ResPostRelPosBlock] = BlockReader(post_norm=True)
    timm_vit.ATTENTIONS[relpos.RelPosAttention] = AttentionReader(_heads, _steps)


_register()
