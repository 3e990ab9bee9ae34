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

from ..capture import capture
from ..analyses.distance import mean_attention_distance
from ..sources.preprocess import preprocess
from ..layout import TokenLayout
from ..analyses.maps import cls_focus, head_entropy
from ..tensors import to_host
from ..analyses.tokens import AttentionSinks, artifact_tokens, attention_sinks
from ..types import Capture, ModelInput


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
        entropy: (b, L, H) mean entropy of the patch queries over patch keys (:func:`vitviz.analyses.maps.head_entropy`).
        cls_focus: (b, L, H) the readout's concentration (:func:`vitviz.analyses.maps.cls_focus`).
    """

    batch: ModelInput
    capture: Capture
    token_norms: np.ndarray
    artifacts: list[np.ndarray]
    sinks: list[AttentionSinks]
    distance: np.ndarray
    entropy: np.ndarray
    cls_focus: np.ndarray

    @property
    def layout(self) -> TokenLayout:
        return self.capture.layout

    def head_scores(self, i: int) -> dict[str, np.ndarray]:
        """Image ``i``'s per-head scores for ranking (as :func:`vitviz.analyses.maps.head_scores`), each (L, H)."""
        return {"entropy": self.entropy[i], "cls_focus": self.cls_focus[i], "distance": self.distance[i]}


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


def forward(loaded, images: list[Image.Image], edit=None, layout: TokenLayout | None = None) -> GlobalForward | WindowForward:
    """Preprocess ``images`` with the model's own rules and run them through it once (one batch).

    ``edit``, ``layout``: a repair run in the same forward (global attention only) and the token layout it
    makes (:mod:`vitviz.analyses.registers`); default the model as it is."""
    batch = preprocess(images, loaded.data_config)
    if loaded.attention_scope == "window":
        from .. import swin

        out = swin.capture(loaded.model, batch.tensor)
        return WindowForward(batch=batch, capture=out,
                             distance=[swin.mean_window_attention_distance(a, g)
                                       for a, g in zip(out.attention, out.geometry)],
                             uniform_distance=np.array([swin.uniform_window_distance(g) for g in out.geometry]))
    # The analyses read the whole (b, L, H, N, N) array after the forward, where the model ran. Reducing each
    # layer inside the forward instead was measured slower on the CPU (benchmarks/README.md, issue 18).
    out = capture(loaded.model, batch.tensor, edit=edit, layout=layout)
    layout = out.layout
    norms = to_host(out.token_norms)
    return GlobalForward(batch=batch, capture=out, token_norms=norms,
                         artifacts=[artifact_tokens(n[-1], layout) for n in norms],
                         sinks=[attention_sinks(a, layout) for a in out.attention],
                         distance=mean_attention_distance(out.attention, layout),
                         entropy=np.stack([head_entropy(a, layout) for a in out.attention]),
                         cls_focus=np.stack([cls_focus(a, layout) for a in out.attention]))


def forward_repaired(loaded, images: list[Image.Image], repair, sinks: list[AttentionSinks] | None = None) -> GlobalForward:
    """``images`` through the model with ``repair`` (:class:`vitviz.analyses.registers.Repair`) run in the forward; the
    result's layout is the repaired one (the test-time register is one more prefix token).

    ``sinks``: per image, the sinks of the unrepaired forward (sink masking drops them); found here with one
    plain forward when not given."""
    if loaded.attention_scope == "window":
        raise ValueError("a repair needs global attention; this model attends within windows")
    why = repair.why_not(loaded.model, loaded.layout)
    if why:
        raise ValueError(why)
    if repair.kind == "sinks" and sinks is None:
        sinks = forward(loaded, images).sinks
    layout, device = loaded.layout, next(loaded.model.parameters()).device  # the layout of the model's own input size
    return forward(loaded, images, edit=repair.edit(loaded.model, layout, sinks, device), layout=repair.layout(layout))
