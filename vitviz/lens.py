"""The front door: a model opened once (:class:`Lens`), images prepared its way, and one :class:`Trace` of
what a forward saw.

```python
import vitviz
lens = vitviz.open("bundled")                     # any --model spelling
x = lens.preprocess(["assets/chelsea.jpg"])       # paths, PIL images or arrays
trace = lens.trace(x, keep=("attn", "resid_post", "logits"))
trace["attn", 11]                                 # (B, H, N, N), layer 12 (0-based index, negative allowed)
trace.stack("attn")                               # (B, L, H, N, N)
```

A :class:`Lens` holds the loaded model, its family adapter (:mod:`vitviz.adapters`), token layout,
preprocessing and parsed spec, resolved once: nothing below it parses a model name or looks an adapter up
again. :meth:`Lens.trace` reads any of the adapters' named points (the table in
:mod:`vitviz.adapters.base`, TransformerLens's vocabulary) and changes any of them (``edit=``) in one
forward, without mutating the shared model: two threads with different edits on one Lens keep their own
results. A Trace keeps exactly the points asked for (no N x N copy nobody asked for).
"""
from __future__ import annotations

import fnmatch
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from .adapters import BLOCK_POINTS, MODEL_POINTS, Adapter, Rules, point_name, run
from .errors import ImageError, VitvizError
from .io.images import load_image
from .sources.preprocess import preprocess
from .io.atomic import atomic_write_bytes
from .layout import TokenLayout
from .sources.models import LoadedModel, ModelSpec, load_model
from .types import ModelInput

__all__ = ["Lens", "Trace", "PointNotKept", "open", "load_trace"]

TRACE_ARRAYS, TRACE_INFO = "trace.npz", "trace.json"


class PointNotKept(VitvizError, KeyError):
    """A point read from a :class:`Trace` that the forward did not keep (or that the model does not have)."""

    def __str__(self) -> str:  # KeyError would print the sentence in quotes
        return str(self.args[0])


@dataclass(frozen=True)
class Lens:
    """A loaded model with everything needed to run and read it, resolved once.

    Build one with :func:`vitviz.open`. Read-only and shared safely between threads.

    Attributes:
        loaded: the loaded model with its spec, layout, preprocessing and device (:class:`vitviz.sources.models.LoadedModel`).
    """

    loaded: LoadedModel

    # --- what it is ------------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The built model (eval mode, weights frozen); shared, never mutated by vitviz."""
        return self.loaded.model

    @property
    def adapter(self) -> Adapter:
        """The family adapter that runs and reads the model."""
        return self.loaded.adapter

    @property
    def spec(self) -> ModelSpec:
        """What was opened (name, checkpoint, img_size, device, dtype, labels)."""
        return self.loaded.spec

    @property
    def layout(self) -> TokenLayout:
        """The token layout at the model's input size (prefix tokens, grid, patch size in px)."""
        return self.loaded.layout

    @property
    def label(self) -> str:
        """The model in words (family, weights)."""
        return self.loaded.label

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    @property
    def num_layers(self) -> int:
        """Blocks (L); layers are 0-based in arrays and 1-based on screen and on the command line."""
        return self.adapter.num_layers(self.model)

    @property
    def num_heads(self) -> int:
        """Attention heads of the first block (H)."""
        return self.adapter.num_heads(self.model)

    @property
    def num_classes(self) -> int:
        """Classes of the classifier head; 0 for a headless backbone."""
        return self.loaded.num_classes

    @property
    def has_head(self) -> bool:
        return self.loaded.has_head

    @property
    def class_labels(self) -> tuple[str, ...] | None:
        return self.loaded.class_labels

    @property
    def scope(self) -> str:
        """``"global"`` (attention (B, H, N, N) per block) or ``"window"`` (Swin: (B, nW, H, T, T))."""
        return self.adapter.scope

    def points(self) -> list[str]:
        """Every named point of this model's forward, in forward order (``"blocks.3.attn"``, ...).

        ``logits`` is listed only for models with a classifier head."""
        names = ["embed"] + [point_name(p, i) for i in range(self.num_layers) for p in BLOCK_POINTS]
        return names + ["final_norm", "pooled"] + (["logits"] if self.has_head else [])

    def layout_for(self, x: torch.Tensor | ModelInput) -> TokenLayout:
        """The token layout of a batch (its input size may differ from the model's default)."""
        tensor = x.tensor if isinstance(x, ModelInput) else x
        return self.adapter.layout(self.model, tuple(tensor.shape[-2:]))

    # --- images --------------------------------------------------------------------------------
    def preprocess(self, images: str | Path | Image.Image | np.ndarray | Sequence) -> ModelInput:
        """Images prepared exactly as the model expects (its own resize, crop and mean/std).

        Args:
            images: one or a list of: a file path (str or Path, decoded with the app's limits), a PIL image, or an
                array (H, W, 3) — uint8 0..255, or float 0..1.

        Returns:
            ModelInput: ``tensor`` (B, 3, H, W) float32, normalised; ``images`` the exact model-input images
            (after resize and crop): maps are drawn over these.

        Raises:
            ImageError: a file that cannot be used (the sentence names it), or an array of the wrong shape.
        """
        if isinstance(images, (str, Path, Image.Image, np.ndarray)):
            images = [images]
        return preprocess([_as_rgb(item, i) for i, item in enumerate(images)], self.loaded.data_config)

    # --- a forward -----------------------------------------------------------------------------
    def trace(self, x, keep: str | Iterable = ("attn",), edit: Mapping[str, Callable] | None = None,
              stop_after: str | None = None, grad: bool = False, rules: Rules | None = None) -> "Trace":
        """Run the model once and keep the named points.

        Args:
            x: a :class:`ModelInput` (from :meth:`preprocess`), a normalised tensor (B, 3, H, W), or images as
                :meth:`preprocess` takes them.
            keep: what to keep: a kind (``"attn"``, ``"resid_post"``, ``"q"``, ... every layer), a model-level
                point (``"logits"``, ``"pooled"``, ``"final_norm"``, ``"embed"``), a ``(kind, layer)`` pair
                (0-based, negative allowed), a full name (``"blocks.3.attn"``) or an fnmatch pattern
                (``"blocks.1?.q"``).
            edit: point name or pattern -> ``fn(value, point) -> value`` applied in the forward (ablations, patching,
                repairs); the model is never mutated.
            stop_after: end the forward after this point (a kind with its layer, e.g. ``("resid_post", 5)``, or a
                name): later points are not computed.
            grad: keep the autograd graph (the values stay attached; default: no graph, inference mode).
            rules: how norms, activations and attention products are computed (relevance propagation); default the
                model's own.

        Returns:
            Trace of the kept points, on the model's device.

        Raises:
            VitvizError: an unknown point or layer (the sentence lists the points).
        """
        inputs = x if isinstance(x, ModelInput) else (
            ModelInput(tensor=x, images=[]) if isinstance(x, torch.Tensor) else self.preprocess(x))
        tensor = inputs.tensor
        param = next(self.model.parameters())
        tensor = tensor.to(device=param.device, dtype=param.dtype)
        names = self._names(keep)
        stop = None if stop_after is None else self._names([stop_after])[0]
        context = torch.enable_grad() if grad else torch.inference_mode()
        with context:
            kept = run(self.model, tensor, keep=names, edit=edit, stop_after=stop, rules=rules)
        return Trace(kept, layout=self.layout_for(tensor), num_layers=self.num_layers, inputs=inputs)

    def _names(self, keep: str | Iterable) -> list[str]:
        """``keep=`` as the adapters' names and patterns, checked against this model's points."""
        items = [keep] if isinstance(keep, (str, tuple)) and not (
            isinstance(keep, tuple) and keep and not isinstance(keep[-1], int)) else list(keep)
        L = self.num_layers
        names = []
        for item in items:
            if isinstance(item, tuple):
                kind, layer = item
                names.append(point_name(kind, _layer_index(layer, L, kind)))
                _check_kind(kind)
            elif item in BLOCK_POINTS:
                names.append(f"blocks.*.{item}")
            elif item in MODEL_POINTS or any(c in item for c in "*?["):
                names.append(item)
            elif item.startswith("blocks."):
                parts = item.split(".", 2)
                if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
                    raise VitvizError(f"{item!r} is not a point name: write blocks.<layer>.<kind>, e.g. blocks.3.attn.")
                _check_kind(parts[2])
                names.append(point_name(parts[2], _layer_index(int(parts[1]), L, parts[2])))
            else:
                _check_kind(item)
        if "logits" in names and not self.has_head:
            raise VitvizError(f"{self.label} has no classifier head, so it has no logits: keep 'pooled' instead "
                              "(or give it a head).")
        return names


def _check_kind(kind: str) -> None:
    if kind not in BLOCK_POINTS and kind not in MODEL_POINTS:
        raise VitvizError(f"unknown point {kind!r}: the points are {', '.join(MODEL_POINTS)} and, per block, "
                          f"{', '.join(BLOCK_POINTS)}.")


def _layer_index(layer: int, num_layers: int, kind: str = "") -> int:
    """A 0-based layer index (negative counts from the end) checked against ``num_layers``."""
    if not -num_layers <= int(layer) < num_layers:
        raise VitvizError(f"layer index {layer} is out of range for {kind or 'a point'}: the model has {num_layers} "
                          f"blocks, indices 0 to {num_layers - 1} (or -{num_layers} to -1); on screen they are "
                          f"layers 1 to {num_layers}.")
    return int(layer) % num_layers


def _as_rgb(item, index: int) -> Image.Image:
    if isinstance(item, (str, Path)):
        return load_image(item).image
    if isinstance(item, Image.Image):
        return item.convert("RGB")
    if isinstance(item, np.ndarray):
        if item.ndim != 3 or item.shape[-1] != 3:
            raise ImageError(f"array {index}", f"has shape {item.shape}; an image array is (H, W, 3)")
        if item.dtype != np.uint8:
            if item.min() < 0 or item.max() > 1:
                raise ImageError(f"array {index}", "is a float array outside 0..1; give uint8 0..255 or float 0..1")
            item = np.round(item * 255).astype(np.uint8)
        return Image.fromarray(item, "RGB")
    raise ImageError(f"item {index}", f"is a {type(item).__name__}; give a path, a PIL image or an (H, W, 3) array")


def open(model: str = "bundled", *, checkpoint: str | None = None, device: str = "auto", dtype: str = "float32",
         img_size: int | None = None, labels=None, head: str | Path | None = None) -> Lens:
    """Open a model: load it once, on its device, in eval mode, with its adapter and preprocessing resolved.

    Args:
        model: ``"bundled"`` (offline default), a timm name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``), a
            transformers ``save_pretrained`` folder or ``"hf:org/name"``, or ``"torchvision:vit_b_16"`` — any
            spelling ``--model`` takes.
        checkpoint: local weights for a timm or torchvision architecture (.safetensors, .pth, ...).
        device: ``"auto"`` (CUDA, else MPS, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        dtype: ``"float32"``, or ``"float16"`` / ``"bfloat16"`` on a GPU.
        img_size: input resolution in pixels (square); default the model's own.
        labels: class names (:class:`vitviz.sources.labels.ClassNames`), one per classifier output.
        head: a probe file (``probe.safetensors``, :mod:`vitviz.probes`) that becomes the classifier: the model is then
            the backbone up to the probe's layer and the probe, with the probe's classes.

    Raises:
        ModelError: a model, file or setting that cannot be used (a sentence naming it and why).
    """
    return Lens(load_model(ModelSpec(name=model, checkpoint=checkpoint, img_size=img_size, device=device,
                                     dtype=dtype, labels=labels, head=None if head is None else str(head))))


class Trace(Mapping):
    """What one forward saw: the kept points by name, on the model's device.

    Index by name (``trace["blocks.3.attn"]``) or by (kind, layer) as TransformerLens's cache is
    (``trace["attn", 3]``; 0-based, negative from the end). Shapes are the adapters' (:mod:`vitviz.adapters.base`):
    ``attn`` (B, H, N, N) float32, rows sum to 1; ``q``/``k``/``v``/``z`` (B, H, N, d); ``resid_*``, ``ln*``,
    ``attn_out``, ``mlp_out`` (B, N, D); ``pooled`` (B, D); ``logits`` (B, C). Window models (Swin) keep their window
    shapes (B, nW, H, T, T).

    Attributes:
        layout: the token layout of the traced batch (N = layout.num_tokens).
        num_layers: blocks of the model (L).
        inputs: the model input (normalised tensor and exact model-input images) the forward ran on.
    """

    def __init__(self, points: dict[str, torch.Tensor], layout: TokenLayout, num_layers: int,
                 inputs: ModelInput | None = None):
        self._points = dict(points)
        self.layout = layout
        self.num_layers = num_layers
        self.inputs = inputs

    # --- Mapping -------------------------------------------------------------------------------
    def __getitem__(self, key) -> torch.Tensor:
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
            return point_name(kind, _layer_index(layer, self.num_layers, kind))
        return key

    # --- reading -------------------------------------------------------------------------------
    def layers(self, kind: str) -> list[int]:
        """The 0-based layers at which ``kind`` was kept, in order."""
        return sorted(int(n.split(".")[1]) for n in self._points if fnmatch.fnmatchcase(n, f"blocks.*.{kind}"))

    def stack(self, kind: str) -> torch.Tensor:
        """Every kept layer of ``kind`` stacked on a new axis 1: ``stack("attn")`` -> (B, L, H, N, N).

        Raises:
            PointNotKept: no layer of ``kind`` was kept; VitvizError: the layers differ in shape (window stages).
        """
        layers = self.layers(kind)
        if not layers:
            raise PointNotKept(f"no layer of {kind!r} was kept by this trace; pass {kind!r} in keep=.")
        values = [self._points[point_name(kind, i)] for i in layers]
        if len({tuple(v.shape) for v in values}) > 1:
            raise VitvizError(f"the layers of {kind!r} differ in shape (window stages): read them one at a time.")
        return torch.stack(values, dim=1)

    @property
    def logits(self) -> torch.Tensor | None:
        """(B, C), or None when not kept (or the model has no head)."""
        return self._points.get("logits")

    @property
    def pooled(self) -> torch.Tensor | None:
        """(B, D) the vector the head reads, or None when not kept."""
        return self._points.get("pooled")

    def to(self, device: str | torch.device) -> "Trace":
        """The same trace with every value on ``device`` (e.g. ``"cpu"`` before keeping it)."""
        return Trace({k: v.to(device) for k, v in self._points.items()}, self.layout, self.num_layers, self.inputs)

    def numpy(self, key) -> np.ndarray:
        """One point as a numpy array on the host (float32 kept float32)."""
        return self[key].detach().cpu().numpy()

    # --- files ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write the kept points (``trace.npz``, names as keys) and the layout (``trace.json``) into ``folder``,
        each file whole or not at all. Read back with :func:`vitviz.load_trace`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, **{k: v.detach().cpu().numpy() for k, v in self._points.items()})
        atomic_write_bytes(folder / TRACE_ARRAYS, buffer.getvalue())
        info = {"points": list(self._points), "num_layers": self.num_layers, "token_layout": self.layout.to_dict(),
                "layers": "0-based in the point names (blocks.0 is layer 1 on screen)"}
        atomic_write_bytes(folder / TRACE_INFO, (json.dumps(info, indent=2) + "\n").encode())
        return folder


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
    except (OSError, KeyError, ValueError) as exc:
        raise VitvizError(f"{folder}: not a vitviz trace folder ({type(exc).__name__}: {exc}).") from exc
    layout = TokenLayout.from_dict(info["token_layout"])
    return Trace(points, layout=layout, num_layers=int(info["num_layers"]))

