"""The one per-image pipeline: preprocess, one forward through the family's adapter, and the
per-image results every consumer reads (the CLI's ``analyze`` and ``stats``, the app's pages, the
faithfulness runs). What follows it (rollout settings, flow, faithfulness) is the consumer's choice.

Which results apply depends on the attention's scope (:attr:`vitviz.adapters.Adapter.scope`), never
on the family: global attention gives (L, H, N, N) per image; window attention (Swin) gives one
(nW, H, T, T) per block with its geometry.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .capture import capture
from .distance import mean_attention_distance
from .images import preprocess
from .layout import TokenLayout
from .tensors import to_host
from .tokens import AttentionSinks, artifact_tokens, attention_sinks
from .types import Capture, ModelInput


@dataclass
class GlobalForward:
    """b images through a model whose tokens attend to every token.

    Attributes:
        batch: the model input (normalised tensor, exact model-input images).
        capture: attention (b, L, H, N, N) and token norms on the model's device; features, logits on the host.
        token_norms: (b, L, N) on the host.
        artifacts: per image, the high-norm token indices of the last layer (>10x the median).
        sinks: per image, the tokens receiving a disproportionate share of attention, per layer.
        distance: (b, L, H) mean attention distance in pixels.
    """

    batch: ModelInput
    capture: Capture
    token_norms: np.ndarray
    artifacts: list[np.ndarray]
    sinks: list[AttentionSinks]
    distance: np.ndarray

    @property
    def layout(self) -> TokenLayout:
        return self.capture.layout


@dataclass
class WindowForward:
    """b images through a window-attention model (Swin).

    Attributes:
        batch: the model input.
        capture: :class:`vitviz.swin.WindowCapture` (per block (b, nW, H, T, T) and its geometry).
        distance: per block (b, H) mean attention distance within windows, pixels.
        uniform_distance: (blocks,) the same for uniform attention over each query's window.
    """

    batch: ModelInput
    capture: object
    distance: list[np.ndarray]
    uniform_distance: np.ndarray

    @property
    def layout(self) -> TokenLayout:
        return self.capture.layout


def forward(loaded, images: list[Image.Image]) -> GlobalForward | WindowForward:
    """Preprocess ``images`` with the model's own rules and run them through it once (one batch)."""
    batch = preprocess(images, loaded.data_config)
    if loaded.attention_scope == "window":
        from . import swin

        out = swin.capture(loaded.model, batch.tensor)
        return WindowForward(batch=batch, capture=out,
                             distance=[swin.mean_window_attention_distance(a, g)
                                       for a, g in zip(out.attention, out.geometry)],
                             uniform_distance=np.array([swin.uniform_window_distance(g) for g in out.geometry]))
    out = capture(loaded.model, batch.tensor)
    layout = out.layout
    norms = to_host(out.token_norms)
    return GlobalForward(batch=batch, capture=out, token_norms=norms,
                         artifacts=[artifact_tokens(n[-1], layout) for n in norms],
                         sinks=[attention_sinks(a, layout) for a in out.attention],
                         distance=mean_attention_distance(out.attention, layout))
