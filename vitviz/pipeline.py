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

import torch

from .capture import capture
from .distance import _query_sums, patch_distances
from .images import preprocess
from .layout import TokenLayout
from .maps import _entropy, cls_focus_rows
from .tensors import to_host
from .tokens import AttentionSinks, artifact_tokens, received_share, sinks_from_received
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
        entropy: (b, L, H) mean entropy of the patch queries over patch keys (:func:`vitviz.maps.head_entropy`).
        cls_focus: (b, L, H) the readout's concentration (:func:`vitviz.maps.cls_focus`).
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
        """Image ``i``'s per-head scores for ranking (as :func:`vitviz.maps.head_scores`), each (L, H)."""
        return {"entropy": self.entropy[i], "cls_focus": self.cls_focus[i], "distance": self.distance[i]}


class _LayerReductions:
    """What the analyses reduce from each layer's attention, computed as the forward runs (one layer's
    contiguous (b, H, N, N) at a time, on the model's device): the sums of the mean attention distance,
    the shares each token receives (sinks), the entropy and the readout's focus per head."""

    def __init__(self, layout: TokenLayout):
        self.layout = layout
        self.distances = torch.as_tensor(patch_distances(layout))
        self.by_layer: dict[int, tuple[torch.Tensor, ...]] = {}

    def __call__(self, layer: int, attention: torch.Tensor) -> None:
        ps = self.layout.patch_slice
        weighted, mass = _query_sums(attention, self.layout, self.distances.to(attention.device))
        self.by_layer[layer] = ((weighted / mass).mean(-1), received_share(attention),
                                _entropy(attention[..., ps, ps]).mean(dim=-1),
                                cls_focus_rows(attention, self.layout))

    def stacked(self, k: int) -> np.ndarray:
        """Reduction ``k`` of every layer, (b, L, ...) on the host."""
        return to_host(torch.stack([self.by_layer[layer][k] for layer in sorted(self.by_layer)], dim=1))


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
    makes (:mod:`vitviz.registers`); default the model as it is."""
    batch = preprocess(images, loaded.data_config)
    if loaded.attention_scope == "window":
        from . import swin

        out = swin.capture(loaded.model, batch.tensor)
        return WindowForward(batch=batch, capture=out,
                             distance=[swin.mean_window_attention_distance(a, g)
                                       for a, g in zip(out.attention, out.geometry)],
                             uniform_distance=np.array([swin.uniform_window_distance(g) for g in out.geometry]))
    layout = layout or loaded.adapter.layout(loaded.model, tuple(batch.tensor.shape[-2:]))
    reduce = _LayerReductions(layout)
    out = capture(loaded.model, batch.tensor, edit=edit, layout=layout, each_layer=reduce)
    layout = out.layout
    norms = to_host(out.token_norms)
    return GlobalForward(batch=batch, capture=out, token_norms=norms,
                         artifacts=[artifact_tokens(n[-1], layout) for n in norms],
                         sinks=[sinks_from_received(r, layout) for r in reduce.stacked(1)],
                         distance=reduce.stacked(0), entropy=reduce.stacked(2), cls_focus=reduce.stacked(3))
