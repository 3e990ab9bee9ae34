"""Hugging Face Swin Transformer (transformers ``swin``): ``SwinModel`` / ``SwinForImageClassification``
spelled out block by block.

As timm's Swin (:mod:`vitviz.adapters.timm_swin`), each block attends inside windows of its stage's grid,
with a relative position bias per head and the shift mask in the scores, and runs through
:mod:`vitviz.adapters.windows` with the named points in window shapes. transformers differs from timm in
three places the geometry follows: it pads the grid to whole windows *before* the cyclic roll, it pads
the image to whole patches, and it shrinks the window to the grid (and drops the shift) at run time where
a stage's grid is no larger than the window. Patch merging is spelled out as transformers computes it (its norm
through the run's rules, as the patch embedding's). Weights come
from a ``save_pretrained`` folder or the hub (``hf:owner/name``); the image processor is the model's own
(:func:`vitviz.sources.hf.data_config`).
"""
from __future__ import annotations

import torch

from ..layout import TokenLayout
from ..types import HFModelType
from . import common, windows
from .base import Adapter, Hooks
from .registry import register_adapter


def _base(model):
    """The backbone (``SwinModel``) of a model with or without a classifier head."""
    return getattr(model, "swin", None) or getattr(model, "swinv2", None) or model


def _side(value) -> int:
    return int(value if isinstance(value, int) else value[0])


def _merge(module, h: torch.Tensor, hooks: Hooks, norm_last: bool) -> torch.Tensor:
    """transformers ``SwinPatchMerging`` (norm, then reduction) or ``Swinv2PatchMerging`` (reduction, then norm),
    the norm through the run's rules: (B, gh, gw, C) -> (B, ceil(gh / 2), ceil(gw / 2), C')."""
    B, gh, gw, C = h.shape
    x = torch.nn.functional.pad(h, (0, 0, 0, gw % 2, 0, gh % 2))
    x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
    if norm_last:
        return common.norm(hooks, module.norm, module.reduction(x))
    return module.reduction(common.norm(hooks, module.norm, x))


@register_adapter
class HFSwin(Adapter):
    """transformers Swin V1; :mod:`vitviz.adapters.hf_swinv2` overrides the attention and the block layout."""

    name = "hf-swin"
    library = "transformers"
    scope = "window"
    families = "transformers Swin models (window attention; a save_pretrained folder or hf:owner/name)"
    hf_model_types = {"swin": HFModelType("Swin", "SwinModel", ("SwinForImageClassification",))}
    model_type = "swin"
    version = "Swin"
    merge_norm_last = False  # patch merging: norm, then reduction (Swin V2: reduction, then norm)

    def claims(self, model) -> bool:
        return type(model).__module__.startswith("transformers.") and \
            getattr(getattr(model, "config", None), "model_type", None) == self.model_type

    def why_unsupported(self, model) -> str | None:
        blk = _base(model).encoder.layers[0].blocks[0]
        if not hasattr(blk.attention, "q_proj"):
            return (f"its {type(blk.attention).__name__} is laid out as in transformers before 5.0 (no q_proj); "
                    "vitviz reads Hugging Face Swin with transformers 5")
        return None

    def label(self, model) -> str:
        return f"{self.version} Transformer"

    def _blocks(self, model) -> list:
        return [blk for stage in _base(model).encoder.layers for blk in stage.blocks]

    def num_layers(self, model) -> int:
        return len(self._blocks(model))

    def num_heads(self, model, layer: int = 0) -> int:
        return int(model.config.num_heads[[s for s, stage in enumerate(_base(model).encoder.layers)
                                           for _ in stage.blocks][layer]])

    def _patch(self, model) -> int:
        return _side(model.config.patch_size)

    def layout(self, model, input_hw=None) -> TokenLayout:
        """Stage 1's grid: the image padded to whole patches (as transformers pads it), no prefix tokens."""
        p = self._patch(model)
        h, w = input_hw or (_side(model.config.image_size),) * 2
        return TokenLayout(prefix_tokens=(), grid_size=(-(-int(h) // p), -(-int(w) // p)), patch_size=(p, p),
                           global_pool="avg", pos_embed_prefix_rows=0)

    def num_classes(self, model) -> int:
        return len(model.config.id2label) if getattr(model, "classifier", None) is not None else 0

    def class_labels(self, model):
        n = self.num_classes(model)
        return tuple(str(model.config.id2label[i]) for i in range(n)) if n else None

    # --- windows -----------------------------------------------------------------------------------
    def window_and_shift(self, model, blk, b: int, grid: tuple[int, int]) -> tuple[int, int]:
        """The window side and shift a block runs with on ``grid``: transformers' ``SwinLayer`` shrinks the window
        to the grid and drops the shift where the grid is no larger than the window (at run time)."""
        window = int(model.config.window_size)
        shift = 0 if b % 2 == 0 else window // 2
        return (min(grid), 0) if min(grid) <= window else (window, shift)

    def geometry(self, model, input_hw: tuple[int, int]) -> list[windows.WindowGeometry]:
        grid, p = self.layout(model, input_hw).grid_size, self._patch(model)
        stride, out = (p, p), []
        for s, stage in enumerate(_base(model).encoder.layers):
            for b, blk in enumerate(stage.blocks):
                window, shift = self.window_and_shift(model, blk, b, grid)
                out.append(windows.WindowGeometry.build(len(out), s, b, grid, (window, window), (shift, shift), stride,
                                                        pad_first=True))
            if stage.downsample is not None:
                grid, stride = ((grid[0] + 1) // 2, (grid[1] + 1) // 2), (stride[0] * 2, stride[1] * 2)
        return out

    def parts(self, blk) -> windows.BlockParts:
        """transformers ``SwinLayer``: pre-norm, ``SwinAttention`` (q/k/v projections, relative position bias
        table), ``SwinMLP``."""
        attn = blk.attention
        heads = attn.num_attention_heads

        def qkv(x: torch.Tensor) -> windows.WindowHeads:
            q, k, v = (windows.split_heads(proj(x), heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            return windows.WindowHeads(q, k, v, float(attn.scaling), attn.relative_position_bias())
        return windows.BlockParts(norm1=blk.layernorm_before, norm2=blk.layernorm_after, heads=qkv, proj=attn.o_proj,
                                  mlp=windows.linear_mlp(blk.mlp.fc1, blk.mlp.activation_fn, blk.mlp.fc2))

    # --- the forward -------------------------------------------------------------------------------
    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        base = _base(model)
        geometry = iter(self.geometry(model, tuple(x.shape[-2:])))
        emb = base.embeddings
        tokens, (gh, gw) = emb.patch_embeddings(x)  # pads the image to whole patches: (B, gh * gw, D)
        tokens = common.norm(hooks, emb.norm, tokens)
        if emb.position_embeddings is not None:
            table = emb.position_embeddings if emb.position_embeddings.shape[1] == tokens.shape[1] else \
                emb.interpolate_pos_encoding(tokens, *x.shape[-2:])
            tokens = tokens + table
        h = hooks("embed", tokens.view(x.shape[0], gh, gw, -1))
        for stage in base.encoder.layers:
            for blk in stage.blocks:
                h = windows.block(hooks, next(geometry), self.parts(blk), h)
            if stage.downsample is not None:
                h = _merge(stage.downsample, h, hooks, self.merge_norm_last)
        features = hooks("final_norm", common.norm(hooks, base.layernorm, h))
        if base.pooler is not None and (hooks.wants("pooled") or hooks.wants("logits")):
            pooled = hooks("pooled", base.pooler(features.flatten(1, 2).transpose(1, 2)).flatten(1))
            if self.num_classes(model) and hooks.wants("logits"):
                hooks("logits", model.classifier(pooled))

    # --- what the views read -----------------------------------------------------------------------
    def why_not(self, model, view: str) -> str | None:
        if view == "attribution" or (view == "position" and self.position_table(model) is not None):
            return None
        return windows.why_not_views(f"{self.version}, transformers").get(view)

    def why_no_extra_token(self, model) -> str | None:
        return ("it attends within shifted windows of the patch grid and has no prefix tokens: a token outside the "
                "grid belongs to no window")

    def position_encoding(self, model) -> str:
        bias = "relative position bias per window" if self.version == "Swin" else \
            "continuous relative position bias per window (an MLP of log-spaced coordinates)"
        return ("learned absolute position embedding + " if self.position_table(model) is not None else "") + bias

    def position_table(self, model):
        return _base(model).embeddings.position_embeddings

    def patch_filters(self, model) -> torch.Tensor:
        return _base(model).embeddings.patch_embeddings.projection.weight

    def pooled_text(self, model) -> str:
        return "the mean of the last stage's tokens after the final norm (the pooler)"

    def architecture(self, model):
        return self.config_architecture(model.config)

    def config_architecture(self, config):
        """What fixes the window-attention size, from the config alone (the memory budget reads it before
        loading)."""
        from ..types import WindowArchitecture

        window = int(config.window_size)
        stages = tuple((int(d), int(h), window) for d, h in zip(config.depths, config.num_heads))
        return WindowArchitecture(depth=sum(d for d, _, _ in stages), heads=sum(d * h for d, h, _ in stages),
                                  patch=(_side(config.patch_size),) * 2, prefix_tokens=0,
                                  default_size=_side(config.image_size), stages=stages)

    def card(self, model) -> dict:
        config = model.config
        return {"library": "transformers", "family": self.version, "architecture": type(model).__name__,
                "model_type": config.model_type, "attn_implementation": config._attn_implementation,
                "layers": self.num_layers(model), "heads": ", ".join(str(h) for h in config.num_heads) + " (per stage)",
                "embed_dim": ", ".join(str(int(config.embed_dim * 2 ** i)) for i in range(len(config.depths)))
                + " (per stage)", "attention": f"shifted windows {config.window_size}x{config.window_size}",
                "stage_depths": [int(d) for d in config.depths],
                "source": getattr(model, "name_or_path", "") or ""}
