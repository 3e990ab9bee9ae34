"""The one per-image pipeline: preprocess, one forward through the family's adapter, and the
per-image results every consumer reads (the CLI's ``analyze`` and ``stats``, the app's pages, the
faithfulness runs). What follows it (rollout settings, flow, faithfulness) is the consumer's choice.

Which results apply depends on the attention's scope (:attr:`vitviz.adapters.Adapter.scope`), never
on the family: global attention gives (L, H, N, N) per image; window attention (Swin) gives one
(nW, H, T, T) per block with its geometry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from PIL import Image

from ..analyses.distance import mean_attention_distance
from ..analyses.maps import cls_focus, head_entropy
from ..analyses.tokens import AttentionSinks, artifact_tokens, attention_sinks
from ..errors import ViewNotApplicable
from ..sources.preprocess import preprocess
from ..layout import TokenLayout
from ..tensors import to_host
from ..trace import Trace, trace_for_analysis
from ..types import ModelInput


@dataclass
class Forward:
    """A forward (:class:`vitviz.trace.Trace`) and the per-image analyses every consumer reads.

    For a batch each analysis has a leading image axis (b); after :meth:`image` it is one image's, with the trace
    on the host and without its batch axis, as the app's pages keep it.

    Attributes:
        trace: global attention: ``attn`` of every layer (one stack, on the model's device), ``resid_post.norm``,
            ``final_norm`` and ``logits`` (models with a head); window attention (Swin): ``attn`` per block in window
            shapes, ``final_norm``, ``logits``, and the windows' geometry.
        artifacts: per image, the high-norm token indices of the last layer (>10x the median); global only.
        sinks: per image, the tokens receiving a disproportionate share of attention, per layer; global only.
        distance: global: (b, L, H) mean attention distance in pixels; window: per block (b, H) within windows.
        uniform_distance: window only: (blocks,) the distance of uniform attention over each query's window.
    """

    trace: Trace
    artifacts: list[np.ndarray] | np.ndarray | None = None
    sinks: list[AttentionSinks] | AttentionSinks | None = None
    distance: np.ndarray | list[np.ndarray] | None = None
    uniform_distance: np.ndarray | None = field(default=None)

    def image(self, i: int) -> Forward:
        """Image ``i`` alone, on the host: the trace sliced (:meth:`vitviz.trace.Trace.image`) and each analysis."""
        window = self.trace.geometry is not None
        return Forward(trace=self.trace.image(i).to("cpu"),
                       artifacts=None if window else self.artifacts[i], sinks=None if window else self.sinks[i],
                       distance=[d[i] for d in self.distance] if window else self.distance[i],
                       uniform_distance=self.uniform_distance)

    # --- what the pages read of one image (numpy on the host) ----------------------------------
    @property
    def layout(self) -> TokenLayout:
        return self.trace.layout

    @property
    def batch(self) -> ModelInput:
        """The model input (normalised tensor, exact model-input images)."""
        return self.trace.inputs

    @property
    def model_input(self) -> Image.Image:
        """The (first) image as the model saw it, after resize and crop."""
        return self.trace.inputs.images[0]

    @property
    def geometry(self) -> list | None:
        """Window models: one :class:`vitviz.adapters.windows.WindowGeometry` per block."""
        return self.trace.geometry

    @property
    def attention(self) -> np.ndarray | list[np.ndarray]:
        """Global: (L, H, N, N) ((b, L, H, N, N) for a batch); window: per block (nW, H, T, T); float32 on the host."""
        if self.trace.geometry is not None:
            return [to_host(a) for a in self.trace.each("attn")]
        return to_host(self.trace.stack("attn"))

    @property
    def token_norms(self) -> np.ndarray:
        """(L, N) ((b, L, N)) the L2 norm of every token leaving each block, float32 on the host."""
        return to_host(self.trace.stack("resid_post.norm"))

    @property
    def features(self) -> np.ndarray:
        """(N, D) ((b, N, D)) the final-norm features, float32 on the host."""
        return to_host(self.trace["final_norm"].float())

    @property
    def logits(self) -> np.ndarray | None:
        """(C,) ((b, C)) float32 on the host, or None without a classifier head."""
        return None if self.trace.logits is None else to_host(self.trace.logits.float())

    @cached_property
    def head_scores(self) -> dict[str, np.ndarray]:
        """One image's per-head scores for ranking (:func:`vitviz.analyses.maps.head_scores`), each (L, H): computed
        on first read (the heads page), not for every forward (``analyze`` never reads them)."""
        attention = self.trace.stack("attn")
        return {"entropy": head_entropy(attention, self.layout), "cls_focus": cls_focus(attention, self.layout),
                "distance": self.distance}


def forward(loaded, images: list[Image.Image], edit=None, layout: TokenLayout | None = None) -> Forward:
    """Preprocess ``images`` with the model's own rules and run them through it once (one batch).

    ``edit``, ``layout``: a repair run in the same forward (global attention only) and the token layout it
    makes (:mod:`vitviz.analyses.registers`); default the model as it is."""
    return read(trace_for_analysis(loaded.model, preprocess(images, loaded.data_config), edit=edit, layout=layout))


def read(trace: Trace) -> Forward:
    """The per-image analyses of a batch's trace (the points :func:`vitviz.trace.analysis_points`), where it was run."""
    if trace.geometry is not None:
        from .. import swin

        return Forward(trace, distance=[swin.mean_window_attention_distance(to_host(a), g)
                                        for a, g in zip(trace.each("attn"), trace.geometry)],
                       uniform_distance=np.array([swin.uniform_window_distance(g) for g in trace.geometry]))
    # The analyses read the whole (b, L, H, N, N) stack after the forward, where the model ran. Reducing each
    # layer inside the forward instead was measured slower on the CPU (benchmarks/README.md, issue 18).
    attention, layout = trace.stack("attn"), trace.layout
    norms = to_host(trace.stack("resid_post.norm"))
    return Forward(trace, artifacts=[artifact_tokens(n[-1], layout) for n in norms],
                   sinks=[attention_sinks(a, layout) for a in attention],
                   distance=mean_attention_distance(attention, layout))


def forward_repaired(loaded, images: list[Image.Image], repair, sinks: list[AttentionSinks] | None = None) -> Forward:
    """``images`` through the model with ``repair`` (:class:`vitviz.analyses.registers.Repair`) run in the forward; the
    result's layout is the repaired one (the test-time register is one more prefix token).

    ``sinks``: per image, the sinks of the unrepaired forward (sink masking drops them); found here with one
    plain forward when not given."""
    if loaded.attention_scope == "window":
        raise ViewNotApplicable("a repair needs global attention; this model attends within windows")
    why = repair.why_not(loaded.model, loaded.layout)
    if why:
        raise ViewNotApplicable(why)
    if repair.kind == "sinks" and sinks is None:
        sinks = forward(loaded, images).sinks
    layout, device = loaded.layout, next(loaded.model.parameters()).device  # the layout of the model's own input size
    return forward(loaded, images, edit=repair.edit(loaded.model, layout, sinks, device), layout=repair.layout(layout))
