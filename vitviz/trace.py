"""The one record of what a forward saw: :class:`Trace`, and :func:`trace_model` that runs a model to fill one.

A Trace holds the named points a forward kept (the adapters' vocabulary, :mod:`vitviz.adapters.base`), indexed as
TransformerLens's ``ActivationCache`` is: by name (``trace["blocks.3.attn"]``), by (kind, layer)
(``trace["attn", 3]``), stacked over layers (``trace.stack("attn")``), and sliced to one image (``trace.image(0)`` or
``trace[0]``: the batch axis dropped, as ``cache.apply_slice_to_batch_dim(0)``). Window models (Swin) keep their
window shapes and carry their windows' geometry (:attr:`Trace.geometry`).

Two things a cache of TransformerLens does not do, because vision models hold N x N per head:

- a kind kept at every layer is written, as the forward reaches each layer, into one (B, L, ...) tensor whose
  slices are the per-layer points (``stack`` returns it without a copy; peak memory is the stack plus one layer);
- ``"<kind>.norm"`` keeps only the L2 norm of a point over its last axis, float32 (``"resid_post.norm"``:
  (B, N) per block, the token norms), never the point itself.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import io
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch

from .adapters import BLOCK_POINTS, MODEL_POINTS, Observer, Rules, adapter_for, point_name, run
from .adapters.buffers import stack_buffer
from .adapters.windows import WindowGeometry
from .errors import VitvizError
from .io.atomic import atomic_write_bytes
from .layout import TokenLayout
from .types import ModelInput

__all__ = ["NORM", "PointNotKept", "Trace", "analysis_points", "load_trace", "trace_for_analysis", "trace_model"]

TRACE_ARRAYS, TRACE_INFO = "trace.npz", "trace.json"

NORM = ".norm"  # suffix of a kept reduction: "<point>.norm" is the point's L2 norm over its last axis


class PointNotKept(VitvizError, KeyError):
    """A point read from a :class:`Trace` that the forward did not keep (or that the model does not have)."""

    def __str__(self) -> str:  # KeyError would print the sentence in quotes
        return str(self.args[0])


class Trace(Mapping):
    """What one forward saw: the kept points by name, on the model's device.

    Index by name (``trace["blocks.3.attn"]``) or by (kind, layer) as TransformerLens's cache is
    (``trace["attn", 3]``; 0-based, negative from the end); an int picks one image (``trace[0]``, :meth:`image`).
    Shapes are the adapters' (:mod:`vitviz.adapters.base`): ``attn`` (B, H, N, N) float32, rows sum to 1;
    ``q``/``k``/``v``/``z`` (B, H, N, d); ``resid_*``, ``ln*``, ``attn_out``, ``mlp_out`` (B, N, D); ``pooled`` (B, D);
    ``logits`` (B, C); ``<kind>.norm`` the point's shape without its last axis, float32. Window models (Swin) keep
    their window shapes (``attn`` (B, nW, H, T, T)). A trace of one image has no batch axis.

    Attributes:
        layout: the token layout of the traced input (N = layout.num_tokens).
        num_layers: blocks of the model (L).
        inputs: the model input (normalised tensor and exact model-input images) the forward ran on, or None.
        geometry: window models: one :class:`vitviz.adapters.windows.WindowGeometry` per block; else None.
        batched: whether the values have a leading batch axis (False after :meth:`image`).
        edited: whether the forward ran with an ``edit=`` (its values are not the model's own).
        lens: the :class:`vitviz.Lens` that ran it (:meth:`vitviz.Lens.trace`), or None; :func:`vitviz.save` needs it.
        saved: read back from a folder (:func:`vitviz.load`): the folder's other arrays by name (rollout,
            mean_distance, ...) and its settings.json, as ``{"arrays": ..., "settings": ...}``; else None.
    """

    def __init__(self, points: dict[str, torch.Tensor], layout: TokenLayout | Callable[[], TokenLayout],
                 num_layers: int | Callable[[], int],
                 inputs: ModelInput | None = None, geometry: list | None = None,
                 stacked: dict[str, torch.Tensor] | None = None, batched: bool = True, edited: bool = False,
                 lens=None, saved: dict | None = None):
        self._points = dict(points)
        self._stacked = dict(stacked or {})  # kind -> (B, L, ...) whose layer slices are the points
        self._layout, self._num_layers = layout, num_layers  # or a function giving it, called on first read
        self.inputs = inputs
        self.geometry = geometry
        self.batched = batched
        self.edited = edited
        self.lens = lens
        self.saved = saved

    @property
    def layout(self) -> TokenLayout:
        if callable(self._layout):
            self._layout = self._layout()
        return self._layout

    @property
    def num_layers(self) -> int:
        if callable(self._num_layers):
            self._num_layers = self._num_layers()
        return self._num_layers

    # --- Mapping -------------------------------------------------------------------------------
    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.image(int(key))
        name = self._name(key)
        try:
            return self._points[name]
        except KeyError:
            kept = ", ".join(self._points) or "nothing"
            raise PointNotKept(f"{name!r} was not kept by this trace (kept: {kept}); pass it in keep=.") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in list(self._points.items())[:6])
        more = f", ... ({len(self) - 6} more)" if len(self) > 6 else ""
        return f"Trace({shapes}{more})"

    def _name(self, key) -> str:
        if isinstance(key, tuple):
            kind, layer = key
            return point_name(kind, layer_index(layer, self.num_layers, kind))
        return key

    # --- reading -------------------------------------------------------------------------------
    def layers(self, kind: str) -> list[int]:
        """The 0-based layers at which ``kind`` was kept, in order."""
        return sorted(int(n.split(".")[1]) for n in self._points if fnmatch.fnmatchcase(n, f"blocks.*.{kind}"))

    def each(self, kind: str) -> list[torch.Tensor]:
        """Every kept layer of ``kind`` in layer order, as a list (window stages differ in shape)."""
        layers = self.layers(kind)
        if not layers:
            raise PointNotKept(f"no layer of {kind!r} was kept by this trace; pass {kind!r} in keep=.")
        return [self._points[point_name(kind, i)] for i in layers]

    def stack(self, kind: str) -> torch.Tensor:
        """Every kept layer of ``kind`` on a new layer axis after the batch axis: ``stack("attn")`` -> (B, L, H, N, N)
        ((L, H, N, N) for one image). A kind the forward kept at every layer is returned as kept, without a copy.

        Raises:
            PointNotKept: no layer of ``kind`` was kept; VitvizError: the layers differ in shape (window stages).
        """
        values = self.each(kind)
        stacked = self._stacked.get(kind)
        if stacked is not None and len(values) == stacked.shape[int(self.batched)]:
            return stacked
        if len({tuple(v.shape) for v in values}) > 1:
            raise VitvizError(f"the layers of {kind!r} differ in shape (window stages): read them with each().")
        return torch.stack(values, dim=int(self.batched))

    @property
    def logits(self) -> torch.Tensor | None:
        """(B, C), or None when not kept (or the model has no head)."""
        return self._points.get("logits")

    @property
    def pooled(self) -> torch.Tensor | None:
        """(B, D) the vector the head reads, or None when not kept."""
        return self._points.get("pooled")

    def numpy(self, key) -> np.ndarray:
        """One point as a numpy array on the host (float32 kept float32)."""
        return self[key].detach().cpu().numpy()

    # --- slicing and moving --------------------------------------------------------------------
    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor], batched: bool, **changes) -> "Trace":
        """A trace with ``fn`` applied to every value; points that were layer slices of a stack stay slices of it."""
        stacked = {kind: fn(s) for kind, s in self._stacked.items()}
        points = {}
        for name, value in self._points.items():
            kind = name.split(".", 2)[2] if name.startswith("blocks.") else None
            if kind in stacked and _is_layer_of(value, self._stacked[kind], self.batched):
                layer = int(name.split(".")[1])
                points[name] = stacked[kind][:, layer] if batched else stacked[kind][layer]
            else:
                points[name] = fn(value)
        fields = {"inputs": self.inputs, "geometry": self.geometry, "edited": self.edited, "lens": self.lens} | changes
        return Trace(points, self._layout, self._num_layers, stacked=stacked, batched=batched, **fields)

    def image(self, i: int) -> "Trace":
        """Image ``i`` of the batch (0-based, negative from the end) as a trace without the batch axis: views of
        this trace's values, as TransformerLens's ``apply_slice_to_batch_dim(i)``."""
        if not self.batched:
            raise VitvizError("this trace is already one image's; image() slices a batch.")
        one = slice(i, i + 1 or None)
        inputs = None if self.inputs is None else ModelInput(
            tensor=self.inputs.tensor[one], images=self.inputs.images[one],
            sources=None if self.inputs.sources is None else self.inputs.sources[one])
        return self._map(lambda v: v[i], batched=False, inputs=inputs)

    def to(self, device: str | torch.device) -> "Trace":
        """The same trace with every value on ``device`` (e.g. ``"cpu"`` before keeping it)."""
        return self._map(lambda v: v.to(device), self.batched)

    @property
    def nbytes(self) -> int:
        """Bytes the kept values hold (a stack and its layer slices counted once)."""
        storages = {}
        for value in [*self._stacked.values(), *self._points.values()]:
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    # --- files ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write the kept points (``trace.npz``, names as keys) and the layout (``trace.json``; a window model's
        geometry too) into ``folder``, each file whole or not at all. Read back with :func:`vitviz.load_trace`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, **{k: v.detach().cpu().numpy() for k, v in self._points.items()})
        atomic_write_bytes(folder / TRACE_ARRAYS, buffer.getvalue())
        info = {"points": list(self._points), "num_layers": self.num_layers, "token_layout": self.layout.to_dict(),
                "layers": "0-based in the point names (blocks.0 is layer 1 on screen)"}
        if self.geometry is not None:
            info["window_geometry"] = [g.to_dict() for g in self.geometry]
        atomic_write_bytes(folder / TRACE_INFO, (json.dumps(info, indent=2) + "\n").encode())
        return folder


def _is_layer_of(value: torch.Tensor, stacked: torch.Tensor, batched: bool) -> bool:
    """Whether ``value`` is one layer's slice of ``stacked`` (shares its memory)."""
    return value.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr() and (
        value.shape == (stacked.shape[:1] + stacked.shape[2:] if batched else stacked.shape[1:]))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def layer_index(layer: int, num_layers: int, kind: str = "") -> int:
    """A 0-based layer index (negative counts from the end) checked against ``num_layers``."""
    if not -num_layers <= int(layer) < num_layers:
        raise VitvizError(f"layer index {layer} is out of range for {kind or 'a point'}: the model has {num_layers} "
                          f"blocks, indices 0 to {num_layers - 1} (or -{num_layers} to -1); on screen they are "
                          f"layers 1 to {num_layers}.")
    return int(layer) % num_layers


def check_kind(kind: str) -> None:
    """A point kind (``"attn"``, ``"logits"``) or a kept norm of one (``"resid_post.norm"``)."""
    base = kind[:-len(NORM)] if kind.endswith(NORM) else kind
    if base not in BLOCK_POINTS and base not in MODEL_POINTS:
        raise VitvizError(f"unknown point {kind!r}: the points are {', '.join(MODEL_POINTS)} and, per block, "
                          f"{', '.join(BLOCK_POINTS)} (any of them with {NORM!r} keeps only its norm).")


class _Layers(Observer):
    """Keeps one kind at every layer as the forward reaches it: in one (B, L, ...) tensor when ``stack`` (no list of
    copies stacked at the end; a forward may compute a layer straight into its slot), else one value per layer;
    ``norm``: only the L2 norm."""

    def __init__(self, kind: str, num_layers: int, stack: bool, norm: bool):
        self.kind, self.num_layers, self.stack, self.norm = kind, num_layers, stack, norm
        self.buffer: torch.Tensor | None = None
        self.values: dict[str, torch.Tensor] = {}
        self.filled: set[int] = set()

    def slot(self, point, shape, dtype, device) -> torch.Tensor | None:
        if not self.stack or self.norm:
            return None
        if self.buffer is None:
            self.buffer = stack_buffer((shape[0], self.num_layers, *shape[1:]), dtype, device)
        slot = self.buffer[:, point.layer]
        return slot if slot.shape == shape and slot.dtype == dtype else None

    def __call__(self, value: torch.Tensor, point) -> None:
        kept = value.float().norm(dim=-1) if self.norm else value
        if self.stack and self.buffer is None:
            self.buffer = stack_buffer((kept.shape[0], self.num_layers, *kept.shape[1:]), kept.dtype, kept.device)
        if self.stack and kept.shape == self.buffer[:, 0].shape:
            slot = self.buffer[:, point.layer]
            if not _same_memory(kept, slot):  # else the forward computed it there
                slot.copy_(kept)
            self.filled.add(point.layer)
        else:
            self.values[point_name(self.kind, point.layer)] = kept

    def points(self) -> dict[str, torch.Tensor]:
        return {point_name(self.kind, i): self.buffer[:, i] for i in sorted(self.filled)} | self.values

    def stacked(self) -> torch.Tensor | None:
        """The (B, L, ...) tensor when every layer was written into it."""
        return self.buffer if len(self.filled) == self.num_layers else None


def trace_model(model: torch.nn.Module, x: torch.Tensor | ModelInput, keep: Iterable[str] = (),
                edit: Mapping[str, Callable] | None = None, stop_after: str | None = None, grad: bool | None = False,
                rules: Rules | None = None, layout: TokenLayout | None = None, adapter=None,
                fast: bool = False) -> Trace:
    """Run ``model`` once on ``x`` and keep the named points (what :meth:`vitviz.Lens.trace` runs).

    Args:
        model: a model an adapter reads, in eval mode (never mutated).
        x: (B, 3, H, W) normalised input, or a :class:`ModelInput`; moved to the model's device and dtype.
        keep: point names or fnmatch patterns (``"blocks.*.attn"``: every layer, kept in one stack), each optionally
            ending in ``".norm"`` (keep only its L2 norm).
        edit: point name or pattern -> ``fn(value, point) -> value``, applied before a value is kept.
        stop_after: end the forward after this point (a name).
        grad: keep the autograd graph (else inference mode; only then are layers written into one stack); None: run
            in the caller's autograd context as it is (an explainer's ``no_grad`` reference, ``enable_grad`` backward).
        rules: how norms, activations and attention products are computed; default the model's own.
        layout: the token layout of the forward (an edit that adds a token makes another); default the model's.
        adapter: the model's adapter when the caller has it resolved.
        fast: allow the library's fused forward where nothing inside the blocks is read or changed (a perturbed
            copy's score: :class:`vitviz.adapters.base.Hooks`).
    """
    adapter = adapter or adapter_for(model)
    inputs = x if isinstance(x, ModelInput) else ModelInput(tensor=x, images=[])
    param = next(model.parameters())
    tensor = inputs.tensor.to(device=param.device, dtype=param.dtype)
    depth = functools.cache(lambda: adapter.num_layers(model))  # read only where needed: a scoring forward never does
    graph = torch.is_grad_enabled() and not torch.is_inference_mode_enabled() if grad is None else grad
    plain, collectors = [], {}
    for name in keep:
        parts = name.split(".", 2)
        every_layer = len(parts) == 3 and parts[0] == "blocks" and parts[1] == "*" and "*" not in parts[2]
        if name.endswith(NORM) or (every_layer and not graph and adapter.scope == "global"):
            kind = parts[2] if len(parts) == 3 else name
            collectors[name] = _Layers(kind, depth(), stack=every_layer and not graph and adapter.scope == "global",
                                       norm=name.endswith(NORM))
        else:
            plain.append(name)
    observe = [(name[:-len(NORM)] if name.endswith(NORM) else name, c) for name, c in collectors.items()]
    context = contextlib.nullcontext() if grad is None else torch.enable_grad() if grad else torch.inference_mode()
    with context:
        kept = run(model, tensor, keep=plain, edit=edit, stop_after=stop_after, fast=fast, observe=observe,
                   **({} if rules is None else {"rules": rules}))
    for c in collectors.values():
        kept |= c.points()
    stacked = {c.kind: c.stacked() for c in collectors.values() if c.stacked() is not None}
    input_hw = tuple(tensor.shape[-2:])
    return Trace(kept, layout=layout or (lambda: adapter.layout(model, input_hw)), num_layers=depth, inputs=inputs,
                 geometry=adapter.geometry(model, input_hw) if adapter.scope == "window" else None, stacked=stacked,
                 edited=edit is not None)


def analysis_points(model, adapter=None) -> list[str]:
    """The points every per-image analysis reads (``analyze``, ``stats``, the app's pages): ``attn`` of every layer,
    ``final_norm``, the token norms ``resid_post.norm`` (global attention) and ``logits`` (a model with a head)."""
    adapter = adapter or adapter_for(model)
    keep = ["blocks.*.attn", "final_norm"] + (["blocks.*.resid_post.norm"] if adapter.scope == "global" else [])
    return keep + (["logits"] if adapter.num_classes(model) > 0 else [])


def trace_for_analysis(model, x: torch.Tensor | ModelInput, edit=None, layout: TokenLayout | None = None) -> Trace:
    """:func:`trace_model` keeping :func:`analysis_points`, in one forward.

    Args:
        model: a model an adapter reads (:mod:`vitviz.adapters`), in eval mode.
        x: (B, 3, H, W) normalised model input, or the :class:`ModelInput` of :meth:`vitviz.Lens.preprocess`.
        edit: the adapters' ``edit=`` applied in the same forward, before a point is read (a repair,
            :mod:`vitviz.analyses.registers`).
        layout: the token layout the edited forward runs (an extra token: one more prefix token); default the
            model's own.

    Returns:
        Trace on the model's device. Global attention: ``attn`` of every layer in one (B, L, H, N, N) float32 stack
        (``trace.stack("attn")``), the token norms ``resid_post.norm`` (B, N) per layer, ``final_norm`` (B, N, D)
        and ``logits`` (B, C) for a model with a head. Window attention (Swin): ``attn`` per block (B, nW, H, T, T),
        ``final_norm`` (B, gh, gw, D), ``logits``, and ``trace.geometry``.
    """
    adapter = adapter_for(model)
    return trace_model(model, x, analysis_points(model, adapter), edit=edit, layout=layout, adapter=adapter)


def load_trace(folder: str | Path) -> Trace:
    """A :class:`Trace` written by :meth:`Trace.save` (numpy arrays read without pickle).

    Raises:
        VitvizError: the folder has no trace, or its files do not agree.
    """
    folder = Path(folder)
    try:
        info = json.loads((folder / TRACE_INFO).read_text())
        with np.load(folder / TRACE_ARRAYS, allow_pickle=False) as arrays:
            points = {k: torch.from_numpy(arrays[k]) for k in info["points"]}
        geometry = [WindowGeometry.from_dict(g) for g in info["window_geometry"]] if "window_geometry" in info else None
    except (OSError, KeyError, ValueError) as exc:
        raise VitvizError(f"{folder}: not a vitviz trace folder ({type(exc).__name__}: {exc}).") from exc
    layout = TokenLayout.from_dict(info["token_layout"])
    return Trace(points, layout=layout, num_layers=int(info["num_layers"]), geometry=geometry)
