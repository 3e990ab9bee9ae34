"""Hugging Face Swin V2 (transformers ``swinv2``): the Swin adapter (:mod:`vitviz.adapters.hf_swin`) with V2's
block.

Swin V2 changes three things inside a block: cosine attention (q and k L2-normalised per head, the dot
product multiplied by a learned per-head logit scale, clamped at log 100 and exponentiated), a continuous
relative position bias (an MLP of log-spaced relative coordinates, 16 · sigmoid), and post-norm (the norms
follow the attention and the MLP branches). Windows are sized when the model is built (shrunk to a
stage's grid where it is smaller), not at run time. The ``q``/``k`` points are the normalised vectors,
``scores`` the logit-scaled cosines plus bias and mask. transformers 5 adds the shift mask to V2's scores
twice (-200 instead of -100); the probabilities of masked pairs are 0 in float32 either way (exp(-100) is
below 4e-44), and the forward here adds it once, as the paper and V1 do.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..types import HFModelType
from . import windows
from .hf_swin import HFSwin
from .registry import register_adapter


@register_adapter
class HFSwinV2(HFSwin):
    name = "hf-swinv2"
    families = "transformers Swin V2 models (cosine window attention; a save_pretrained folder or hf:owner/name)"
    hf_model_types = {"swinv2": HFModelType("Swin V2", "Swinv2Model", ("Swinv2ForImageClassification",))}
    model_type = "swinv2"
    version = "Swin V2"
    merge_norm_last = True

    def why_unsupported(self, model) -> str | None:
        return None

    def window_and_shift(self, model, blk, b: int, grid: tuple[int, int]) -> tuple[int, int]:
        """As the block was built (``Swinv2Layer._compute_window_shift`` on the config's grid)."""
        return int(blk.window_size), int(blk.shift_size)

    def parts(self, blk) -> windows.BlockParts:
        """transformers ``Swinv2Layer``: post-norm, ``Swinv2SelfAttention`` (cosine attention, continuous position
        bias), ``Swinv2Intermediate`` / ``Swinv2Output``."""
        attn = blk.attention.self
        heads, (wh, ww) = attn.num_attention_heads, attn.window_size

        def qkv(x: torch.Tensor) -> windows.WindowHeads:
            q, k, v = (windows.split_heads(proj(x), heads) for proj in (attn.query, attn.key, attn.value))
            scale = torch.clamp(attn.logit_scale, max=math.log(1.0 / 0.01)).exp()  # (H, 1, 1)
            table = attn.continuous_position_bias_mlp(attn.relative_coords_table).view(-1, heads)
            bias = table[attn.relative_position_index.view(-1)].view(wh * ww, wh * ww, -1).permute(2, 0, 1)
            return windows.WindowHeads(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, scale,
                                       16 * torch.sigmoid(bias))
        return windows.BlockParts(norm1=blk.layernorm_before, norm2=blk.layernorm_after, heads=qkv,
                                  proj=blk.attention.output.dense, post_norm=True,
                                  mlp=windows.linear_mlp(blk.intermediate.dense, blk.intermediate.intermediate_act_fn,
                                                         blk.output.dense))
