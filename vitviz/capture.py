"""One forward pass that returns the attention probabilities of every layer.

timm computes attention with fused ``scaled_dot_product_attention`` by default, so the
probabilities never exist as a tensor and hooks on ``attn_drop`` see nothing. Flipping
``blk.attn.fused_attn`` would mutate a model that every session shares. Instead each family's
adapter (:mod:`vitviz.adapters`) runs the model's own submodules in a forward that spells attention
out, with named activation points: no hooks, no state, nothing written to the model, so any number
of threads can capture from one model at once. This module reads the points every analysis needs.
"""
from __future__ import annotations

from typing import Callable

import torch

from .adapters import adapter_for, compose_edits, run
from .types import Capture, to_model_input

__all__ = ["Capture", "attention_and_logits", "capture", "for_each_layer", "num_classes", "to_model_input"]


def for_each_layer(model, x: torch.Tensor, fn: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
    """Run the forward once, calling ``fn(layer index, tokens after it (B, N, D), attention (B, H, N, N))``
    as each block finishes: streaming analyses keep one layer's attention at a time."""
    seen: dict[int, torch.Tensor] = {}

    def attention(value, point):
        seen[point.layer] = value
        return value

    def done(value, point):
        fn(point.layer, value, seen.pop(point.layer))
        return value

    run(model, x, edit={"blocks.*.attn": attention, "blocks.*.resid_post": done})


def num_classes(model) -> int:
    """Classes of the model's classifier head; 0 without one."""
    return adapter_for(model).num_classes(model)


def attention_and_logits(model, x: torch.Tensor, edit=None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The attention of every layer [(B, H, N, N)] and the logits (B, C) of one forward, in one graph
    (gradients of the logits reach each layer's attention); ``edit``: the adapters' ``edit=`` (a repair)."""
    out = run(model, x, keep=("blocks.*.attn", "logits"), edit=edit)
    layers = [out[f"blocks.{i}.attn"] for i in range(adapter_for(model).num_layers(model))]
    return layers, out["logits"]


@torch.inference_mode()
def capture(model, images: torch.Tensor, edit=None, layout=None) -> Capture:
    """Attention of every layer and head, the final features and the logits, in one pass.

    Args:
        model: a model an adapter reads (:mod:`vitviz.adapters`), in eval mode.
        images: (B, 3, H, W) normalised model input (see :func:`vitviz.sources.preprocess.preprocess`).
        edit: the adapters' ``edit=`` applied in the same forward, before capture reads a point (a repair,
            :mod:`vitviz.analyses.registers`).
        layout: the token layout the edited forward runs (an extra token: one more prefix token);
            default the model's own.

    Returns:
        Capture with attention (B, L, H, N, N) and token norms on the model's device, features
        (B, N, D) and logits on the CPU, all float32.
    """
    adapter = adapter_for(model)
    x = to_model_input(model, images)
    layout = layout or adapter.layout(model, tuple(images.shape[-2:]))
    B, L, N = x.shape[0], adapter.num_layers(model), layout.num_tokens
    # Written in place layer by layer: no list of per-layer copies stacked at the end.
    attention = torch.empty(B, L, adapter.num_heads(model), N, N, dtype=torch.float32, device=x.device)
    norms = torch.empty(B, L, N, dtype=torch.float32, device=x.device)

    def keep_attention(value, point):
        attention[:, point.layer] = value
        return value

    def keep_norm(value, point):
        norms[:, point.layer] = value.float().norm(dim=-1)
        return value

    keep = ("final_norm", "logits") if adapter.num_classes(model) > 0 else ("final_norm",)
    out = run(model, x, keep=keep, edit=compose_edits(edit, {"blocks.*.attn": keep_attention,
                                                            "blocks.*.resid_post": keep_norm}))
    logits = out.get("logits")
    return Capture(
        attention=attention,
        features=out["final_norm"].float().cpu(),
        logits=None if logits is None else logits.float().cpu(),
        token_norms=norms,
        layout=layout,
    )
