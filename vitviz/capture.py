"""One forward pass that returns the attention probabilities of every layer.

timm computes attention with fused ``scaled_dot_product_attention`` by default, so the
probabilities never exist as a tensor and hooks on ``attn_drop`` see nothing. Flipping
``blk.attn.fused_attn`` would mutate a model that every session shares. Instead each family's
adapter (:mod:`vitviz.adapters`) runs the model's own submodules in a forward that spells attention
out, with named activation points: no hooks, no state, nothing written to the model, so any number
of threads can capture from one model at once. This module reads the points every analysis needs, as a
:class:`vitviz.trace.Trace` (the one record of a forward).
"""
from __future__ import annotations

from typing import Callable

import torch

from .adapters import adapter_for, run
from .trace import Trace, trace_model
from .types import ModelInput, to_model_input

__all__ = ["attention_and_logits", "capture", "for_each_layer", "num_classes", "to_model_input"]


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


def capture(model, images: torch.Tensor | ModelInput, edit=None, layout=None) -> Trace:
    """The trace every per-image analysis reads, in one forward (:func:`vitviz.trace.trace_model`).

    Args:
        model: a model an adapter reads (:mod:`vitviz.adapters`), in eval mode.
        images: (B, 3, H, W) normalised model input, or the :class:`ModelInput` of
            :func:`vitviz.sources.preprocess.preprocess`.
        edit: the adapters' ``edit=`` applied in the same forward, before a point is read (a repair,
            :mod:`vitviz.analyses.registers`).
        layout: the token layout the edited forward runs (an extra token: one more prefix token);
            default the model's own.

    Returns:
        Trace on the model's device. Global attention: ``attn`` of every layer in one (B, L, H, N, N) float32 stack
        (``trace.stack("attn")``), the token norms ``resid_post.norm`` (B, N) per layer, ``final_norm`` (B, N, D)
        and ``logits`` (B, C) for a model with a head. Window attention (Swin): ``attn`` per block (B, nW, H, T, T),
        ``final_norm`` (B, gh, gw, D), ``logits``, and ``trace.geometry``.
    """
    adapter = adapter_for(model)
    keep = ["blocks.*.attn", "final_norm"] + (["blocks.*.resid_post.norm"] if adapter.scope == "global" else [])
    keep += ["logits"] if adapter.num_classes(model) > 0 else []
    return trace_model(model, images, keep, edit=edit, layout=layout, adapter=adapter)
