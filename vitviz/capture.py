"""One forward pass that returns the attention probabilities of every layer.

timm computes attention with fused ``scaled_dot_product_attention`` by default, so the
probabilities never exist as a tensor and hooks on ``attn_drop`` see nothing. Flipping
``blk.attn.fused_attn`` would mutate a model that every session shares. Instead the model's own
submodules run in a forward that spells attention out: no hooks, no state, nothing written to the
model, so any number of threads can capture from one model at once. How each family is run lives
in its adapter: :mod:`vitviz.timm_families` for timm (ViT, EVA, BEiT), :mod:`vitviz.hf` for
transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from .layout import TokenLayout


@dataclass
class Capture:
    """What one forward pass saw.

    Attributes:
        attention: (B, L, H, N, N) float32 on the model's device (a GPU's attention stays there:
            the analyses read it in place; move it to the host only to keep it); rows (last axis) sum to 1.
        features: (B, N, D) float32 on the CPU, the final-norm token features (``forward_features``).
        logits: (B, C) float32 on the CPU, or None when the model has no classifier head.
        token_norms: (B, L, N) float32 on the model's device, the L2 norm of every token's output
            after each block (before the final norm).
        layout: the token layout of the sequence of length N.
    """

    attention: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor | None
    token_norms: torch.Tensor
    layout: TokenLayout


def iter_layers(model, x: torch.Tensor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Run the blocks one by one: yields (layer index, tokens after it (B, N, D), attention (B, H, N, N)).

    Streaming analyses consume this directly, so memory does not grow with the depth.
    transformers models are read by their adapter, :func:`vitviz.hf.iter_layers`.
    """
    if is_hf_model(model):
        from . import hf

        yield from hf.iter_layers(model, x)
        return
    from .timm_families import block_forward, embed

    h, terms = embed(model, x)
    for i, (blk, t) in enumerate(zip(model.blocks, terms)):
        h, probs = block_forward(blk, h, t)
        yield i, h, probs


def is_hf_model(model) -> bool:
    """Whether ``model`` is a Hugging Face transformers model (read by :mod:`vitviz.hf`)."""
    return type(model).__module__.startswith("transformers.")


def num_classes(model) -> int:
    """Classes of the model's classifier head; 0 without one."""
    if is_hf_model(model):
        from . import hf

        return hf.num_classes(model)
    return int(getattr(model, "num_classes", 0))


def attention_and_logits(model, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The attention of every layer [(B, H, N, N)] and the logits (B, C) of one forward, in one graph
    (gradients of the logits reach each layer's attention)."""
    if is_hf_model(model):
        from . import hf

        return hf.attention_and_logits(model, x)
    layers, h = [], None
    for _, h, probs in iter_layers(model, x):
        layers.append(probs)
    return layers, model.forward_head(model.norm(h))


def to_model_input(model, images: torch.Tensor) -> torch.Tensor:
    """The batch on the model's device and in its dtype."""
    param = next(model.parameters())
    return images.to(device=param.device, dtype=param.dtype)


@torch.inference_mode()
def capture(model, images: torch.Tensor) -> Capture:
    """Attention of every layer and head, the final features and the logits, in one pass.

    Args:
        model: a timm model accepted by :func:`vitviz.models.check_supported`, or a
            transformers model loaded by :func:`vitviz.hf.load`, in eval mode.
        images: (B, 3, H, W) normalised model input (see :func:`vitviz.images.preprocess`).

    Returns:
        Capture with attention (B, L, H, N, N) and token norms on the model's device, features
        (B, N, D) and logits on the CPU, all float32.
    """
    if is_hf_model(model):
        from . import hf

        return hf.capture(model, images)
    x = to_model_input(model, images)
    layout = TokenLayout.from_model(model, tuple(images.shape[-2:]))
    B, L, N = x.shape[0], len(model.blocks), layout.num_tokens
    # Written in place layer by layer: no list of per-layer copies stacked at the end.
    attention = torch.empty(B, L, model.blocks[0].attn.num_heads, N, N, dtype=torch.float32, device=x.device)
    norms = torch.empty(B, L, N, dtype=torch.float32, device=x.device)
    for i, h, probs in iter_layers(model, x):
        attention[:, i] = probs
        norms[:, i] = h.float().norm(dim=-1)
    features = model.norm(h)
    logits = model.forward_head(features) if num_classes(model) > 0 else None
    return Capture(
        attention=attention,
        features=features.float().cpu(),
        logits=None if logits is None else logits.float().cpu(),
        token_norms=norms,
        layout=layout,
    )
