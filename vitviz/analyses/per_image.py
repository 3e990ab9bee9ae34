"""The per-image analyses every consumer reads (the CLI's ``analyze``, the app's pages), as functions of one
:class:`vitviz.trace.Trace` of the points :func:`vitviz.trace.analysis_points` names.

Which results apply depends on the attention's scope (:attr:`vitviz.adapters.Adapter.scope`), never on the family:
global attention gives the high-norm artifact tokens, the attention sinks and the mean attention distance (L, H) per
image; window attention (Swin) gives the mean distance within windows per block and the uniform-attention reference.
:func:`analyse` reads a batch's trace (:class:`Analysed`, per image of the batch); :meth:`Analysed.image` is one
image's (:class:`ImageAnalyses`, on the host), what the app's pages keep.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from PIL import Image

from .distance import mean_attention_distance
from .maps import cls_focus, head_entropy
from .tokens import AttentionSinks, artifact_tokens, attention_sinks
from ..layout import TokenLayout
from ..tensors import to_host
from ..trace import Trace, analysis_points
from ..types import ModelInput

__all__ = ["Analysed", "GlobalFindings", "ImageAnalyses", "WindowFindings", "analyse", "analyse_images",
           "analysis_trace"]


@dataclass
class _OfTrace:
    """A trace and what was found in it: the layout and model input are the trace's."""

    trace: Trace

    @property
    def layout(self) -> TokenLayout:
        return self.trace.layout

    @property
    def batch(self) -> ModelInput:
        """The model input (normalised tensor, exact model-input images)."""
        return self.trace.inputs


@dataclass
class Analysed(_OfTrace):
    """A batch's trace and, per image of the batch, what its analyses found.

    Attributes:
        trace: the batch's :func:`analysis_trace`, where the model ran.
        artifacts: global attention: per image the high-norm token indices of the last layer (>10x the median);
            empty for window attention.
        sinks: global attention: per image the tokens receiving a disproportionate share of attention, per layer;
            empty for window attention.
        distance: global attention: (b, L, H) mean attention distance in pixels; None for window attention.
        window_distance: window attention: per block (b, H) mean distance within windows in pixels; empty for global.
        uniform_distance: window attention: (blocks,) the distance of uniform attention over each query's window;
            None for global attention.
    """

    artifacts: list[np.ndarray] = field(default_factory=list)
    sinks: list[AttentionSinks] = field(default_factory=list)
    distance: np.ndarray | None = None
    window_distance: list[np.ndarray] = field(default_factory=list)
    uniform_distance: np.ndarray | None = None

    def image(self, i: int) -> ImageAnalyses:
        """Image ``i`` alone, on the host: the trace sliced (:meth:`vitviz.trace.Trace.image`) and its findings."""
        one = self.trace.image(i).to("cpu")
        if self.trace.geometry is not None:
            return ImageAnalyses(one, WindowFindings([d[i] for d in self.window_distance], self.uniform_distance))
        return ImageAnalyses(one, GlobalFindings(self.artifacts[i], self.sinks[i], self.distance[i]))


@dataclass(frozen=True)
class GlobalFindings:
    """What global attention (every token attends to every token) shows of one image.

    Attributes:
        artifacts: the high-norm token indices of the last layer (>10x the median norm).
        sinks: the tokens receiving a disproportionate share of attention, per layer.
        distance: (L, H) mean attention distance in pixels.
    """

    artifacts: np.ndarray
    sinks: AttentionSinks
    distance: np.ndarray


@dataclass(frozen=True)
class WindowFindings:
    """What window attention (Swin: attention inside local windows) shows of one image.

    Attributes:
        window_distance: per block (H,) mean attention distance within windows in pixels.
        uniform_distance: (blocks,) the distance of uniform attention over each query's window, in pixels.
    """

    window_distance: list[np.ndarray]
    uniform_distance: np.ndarray


@dataclass
class ImageAnalyses(_OfTrace):
    """One image's trace (on the host, no batch axis) and what its analyses found: what the app's pages draw from.

    Which findings there are depends on the attention's scope, and :attr:`findings`' type says it. The attributes
    named after each finding read it from there, None (empty for ``window_distance``) where the scope has no such
    finding.

    Attributes:
        trace: one image's trace (:meth:`vitviz.trace.Trace.image`).
        findings: :class:`GlobalFindings` (global attention) or :class:`WindowFindings` (window attention).
    """

    findings: GlobalFindings | WindowFindings

    @property
    def artifacts(self) -> np.ndarray | None:
        """Global attention: :attr:`GlobalFindings.artifacts`; None for window attention."""
        return getattr(self.findings, "artifacts", None)

    @property
    def sinks(self) -> AttentionSinks | None:
        """Global attention: :attr:`GlobalFindings.sinks`; None for window attention."""
        return getattr(self.findings, "sinks", None)

    @property
    def artifact_patches(self) -> np.ndarray:
        """The high-norm artifact tokens as patches (raster indices, 0-based); empty for window attention."""
        from .rollout import token_patches

        return np.asarray(token_patches(self.layout, () if self.artifacts is None else self.artifacts), dtype=int)

    def norm_map(self, layer: int) -> np.ndarray:
        """(1, gh, gw) the patch tokens' output norms leaving ``layer`` (0-based), over the grid."""
        return self.layout.patch_grid(self.token_norms[layer])[None]

    @property
    def distance(self) -> np.ndarray | None:
        """Global attention: (L, H) :attr:`GlobalFindings.distance`; None for window attention."""
        return getattr(self.findings, "distance", None)

    @property
    def window_distance(self) -> list[np.ndarray]:
        """Window attention: :attr:`WindowFindings.window_distance`; empty for global attention."""
        return getattr(self.findings, "window_distance", [])

    @property
    def uniform_distance(self) -> np.ndarray | None:
        """Window attention: :attr:`WindowFindings.uniform_distance`; None for global attention."""
        return getattr(self.findings, "uniform_distance", None)

    @property
    def model_input(self) -> Image.Image:
        """The image as the model saw it, after resize and crop."""
        return self.trace.inputs.images[0]

    @property
    def geometry(self) -> list | None:
        """Window models: one :class:`vitviz.adapters.windows.WindowGeometry` per block."""
        return self.trace.geometry

    @property
    def attention(self) -> np.ndarray | list[np.ndarray]:
        """Global: (L, H, N, N); window: per block (nW, H, T, T); float32 on the host."""
        if self.trace.geometry is not None:
            return [to_host(a) for a in self.trace.each("attn")]
        return to_host(self.trace.stack("attn"))

    @property
    def token_norms(self) -> np.ndarray:
        """(L, N) the L2 norm of every token leaving each block, float32 on the host."""
        return to_host(self.trace.stack("resid_post.norm"))

    @property
    def features(self) -> np.ndarray:
        """(N, D) the final-norm features (window models: (gh, gw, D)), float32 on the host."""
        return to_host(self.trace["final_norm"].float())

    @property
    def logits(self) -> np.ndarray | None:
        """(C,) float32 on the host, or None without a classifier head."""
        return None if self.trace.logits is None else to_host(self.trace.logits.float())

    @cached_property
    def head_scores(self) -> dict[str, np.ndarray]:
        """The per-head scores for ranking (:func:`vitviz.analyses.maps.head_scores`), each (L, H): computed on first
        read (the heads page), not for every forward (``analyze`` never reads them)."""
        attention = self.trace.stack("attn")
        return {"entropy": head_entropy(attention, self.layout), "cls_focus": cls_focus(attention, self.layout),
                "distance": self.distance}


def analyse(trace: Trace) -> Analysed:
    """The per-image analyses of a batch's trace (the points :func:`vitviz.trace.analysis_points` names), computed
    where it was run."""
    if trace.geometry is not None:
        from .. import swin

        return Analysed(trace, window_distance=[swin.mean_window_attention_distance(to_host(a), g)
                                                for a, g in zip(trace.each("attn"), trace.geometry)],
                        uniform_distance=np.array([swin.uniform_window_distance(g) for g in trace.geometry]))
    # The analyses read the whole (b, L, H, N, N) stack after the forward, where the model ran: reducing each layer
    # inside the forward was measured slower on the CPU (benchmarks/README.md).
    attention, layout = trace.stack("attn"), trace.layout
    norms = to_host(trace.stack("resid_post.norm"))
    return Analysed(trace, artifacts=[artifact_tokens(n[-1], layout) for n in norms],
                    sinks=[attention_sinks(a, layout) for a in attention],
                    distance=mean_attention_distance(attention, layout))


def analysis_trace(lens, x: torch.Tensor | ModelInput, edit=None, layout: TokenLayout | None = None) -> Trace:
    """One forward of ``x`` through ``lens`` (:meth:`vitviz.Lens.trace`) keeping what :func:`analyse` reads
    (:func:`vitviz.trace.analysis_points`).

    Args:
        lens: a :class:`vitviz.Lens`.
        x: (B, 3, H, W) normalised model input, or the :class:`ModelInput` of :meth:`vitviz.Lens.preprocess`.
        edit: the adapters' ``edit=`` run in the same forward (a repair, :mod:`vitviz.analyses.registers`).
        layout: the token layout the edited forward runs (an extra token: one more prefix token); default the input's.

    Returns:
        Trace on the model's device. Global attention: ``attn`` of every layer in one (B, L, H, N, N) float32 stack,
        the token norms ``resid_post.norm`` (B, N) per layer, ``final_norm`` (B, N, D) and ``logits`` (B, C) for a
        model with a head. Window attention (Swin): ``attn`` per block (B, nW, H, T, T), ``final_norm``
        (B, gh, gw, D), ``logits``, and ``trace.geometry``.
    """
    return lens.trace(x, keep=analysis_points(lens.model, lens.adapter), edit=edit, layout=layout)


def analyse_images(loaded, images: list[Image.Image], edit=None, layout: TokenLayout | None = None) -> Analysed:
    """``images`` prepared with the model's own rules (:func:`vitviz.sources.preprocess.preprocess`), traced once
    (:func:`analysis_trace`, one batch) and analysed (:func:`analyse`).

    Args:
        loaded: a :class:`vitviz.sources.models.LoadedModel`.
        edit, layout: a repair run in the same forward (global attention only) and the token layout it makes
            (:mod:`vitviz.analyses.registers`); default the model as it is.
    """
    from ..lens import Lens
    from ..sources.preprocess import preprocess

    return analyse(analysis_trace(Lens(loaded), preprocess(images, loaded.data_config), edit=edit, layout=layout))
