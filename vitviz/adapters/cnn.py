"""Convolutional networks as the other side of a representation comparison (:func:`vitviz.similarity` only).

timm's ResNets, ConvNeXts and their kin give their stages' outputs through ``forward_intermediates``; nothing else in
vitviz reads a CNN (the attention views refuse them with a sentence): this is not an adapter, and no family registers
here.
"""
from __future__ import annotations

import torch


def is_cnn(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a timm network whose stages :func:`cnn_stages` reads (a feature map per stage)."""
    return hasattr(model, "forward_intermediates") and bool(getattr(model, "feature_info", None)) \
        and not hasattr(model, "patch_embed")


def stage_names(model: torch.nn.Module) -> list[str]:
    """The modules whose outputs :func:`cnn_stages` returns, in forward order (``["act1", "layer1", ...]``)."""
    return [info["module"] for info in model.feature_info]


def cnn_stages(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every stage's feature map for a normalised batch: (B, 3, H, W) -> [(B, C_s, H_s, W_s), ...] in forward order."""
    return model.forward_intermediates(x, intermediates_only=True)
