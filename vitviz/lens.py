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

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from .adapters import BLOCK_POINTS, MODEL_POINTS, Adapter, Rules, adapter_for, point_name
from .errors import ImageError, VitvizError
from .io.images import LoadedImage, load_image
from .sources.preprocess import preprocess
from .layout import TokenLayout
from .sources.models import LoadedModel, ModelSpec, load_model
from .trace import NORM, PointNotKept, Trace, check_kind, layer_index, load_trace, trace_model
from .types import ModelInput

__all__ = ["Lens", "Trace", "PointNotKept", "open", "load_trace"]


@dataclass(frozen=True)
class Lens:
    """A loaded model with everything needed to run and read it, resolved once.

    Build one with :func:`vitviz.open`. Read-only and shared safely between threads.

    Attributes:
        loaded: the loaded model with its spec, layout, preprocessing and device (:class:`vitviz.sources.models.LoadedModel`).
    """

    loaded: LoadedModel

    @classmethod
    def around(cls, model: torch.nn.Module) -> "Lens":
        """A Lens over a model built elsewhere (a module some adapter reads, in eval mode), for the library's functions
        that are given the model itself: its forward is :meth:`trace` like any Lens's.

        It has no spec of its own (``spec.name`` is the model's class name) and no preprocessing: give :meth:`trace`
        normalised tensors or a :class:`ModelInput`; :func:`vitviz.open` makes a Lens that reads image files.
        """
        adapter, param = adapter_for(model), next(model.parameters())
        return cls(LoadedModel(model=model, spec=ModelSpec(name=type(model).__name__), layout=adapter.layout(model),
                               data_config={}, weights_source="given in memory", label=adapter.label(model),
                               device=param.device, dtype=param.dtype))

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

    # --- text (CLIP) ----------------------------------------------------------------------------
    @property
    def has_text(self) -> bool:
        """Whether the model came with a text tower (a whole CLIP model): :meth:`encode_text` applies."""
        return self.loaded.text is not None

    @property
    def text_tower(self):
        """The text encoder and projections (:class:`vitviz.sources.text.TextTower`).

        Raises:
            TextNotAvailable: a vision-only model (the sentence says what to open instead).
        """
        from .sources.text import TextNotAvailable, why_no_text

        why = why_no_text(self.loaded.text, self.label, self.model)
        if why:
            raise TextNotAvailable(why)
        return self.loaded.text

    def encode_text(self, texts: str | Sequence[str]) -> torch.Tensor:
        """(T, P) unit-norm text embeddings in the joint space (transformers' ``get_text_features``, normalised),
        float32 on the model's device. The image–text score is ``text_scale · cos(visual_projection(pooled), ·)``.

        Raises:
            TextNotAvailable: no text tower, or no tokenizer saved with the model.
        """
        return self.text_tower.encode(texts)

    @property
    def text_scale(self) -> float:
        """CLIP's ``logit_scale.exp()``: the image–text score is this times the cosine (100 for OpenAI's models)."""
        return self.text_tower.scale

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
        sources = [_as_rgb(item, i) for i, item in enumerate(images)]
        return replace(preprocess([s.image for s in sources], self.loaded.data_config), sources=sources)

    def as_input(self, x) -> ModelInput:
        """``x`` as :meth:`trace` takes it (a :class:`ModelInput`, a normalised tensor (B, 3, H, W), or images as
        :meth:`preprocess` takes them) as a :class:`ModelInput`."""
        if isinstance(x, ModelInput):
            return x
        if isinstance(x, torch.Tensor):
            return ModelInput(tensor=x, images=[])
        return self.preprocess(x)

    # --- a forward -----------------------------------------------------------------------------
    def trace(self, x, keep: str | Iterable = ("attn",), edit: Mapping[str, Callable] | None = None,
              stop_after: str | None = None, grad: bool | None = False, rules: Rules | None = None,
              layout: TokenLayout | None = None, fast: bool = False) -> "Trace":
        """Run the model once and keep the named points.

        Args:
            x: a :class:`ModelInput` (from :meth:`preprocess`), a normalised tensor (B, 3, H, W), or images as
                :meth:`preprocess` takes them.
            keep: what to keep: a kind (``"attn"``, ``"resid_post"``, ``"q"``, ... every layer), a model-level
                point (``"logits"``, ``"pooled"``, ``"final_norm"``, ``"embed"``), a ``(kind, layer)`` pair
                (0-based, negative allowed), a full name (``"blocks.3.attn"``) or an fnmatch pattern
                (``"blocks.1?.q"``); any of them ending in ``".norm"`` keeps only the point's L2 norm over its last
                axis (``"resid_post.norm"``: the token norms, (B, N) per block).
            edit: point name or pattern -> ``fn(value, point) -> value`` applied in the forward (ablations, patching,
                repairs); the model is never mutated.
            stop_after: end the forward after this point (a kind with its layer, e.g. ``("resid_post", 5)``, or a
                name): later points are not computed.
            grad: keep the autograd graph (the values stay attached; default: no graph, inference mode); None: run in
                the caller's autograd context as it is (an explainer's ``no_grad`` reference, its ``enable_grad``
                backward).
            rules: how norms, activations and attention products are computed (relevance propagation); default the
                model's own.
            layout: the token layout the forward runs when an ``edit=`` adds a token (a test-time register: one more
                prefix token); default the input's own (:meth:`layout_for`).
            fast: allow the family's fused forward where nothing inside the blocks is kept or edited (scoring
                perturbed copies: :class:`vitviz.adapters.base.Hooks`).

        Returns:
            Trace of the kept points, on the model's device.

        Raises:
            VitvizError: an unknown point or layer (the sentence lists the points).
        """
        inputs = self.as_input(x)
        stop = None if stop_after is None else self._names([stop_after])[0]
        trace = trace_model(self.model, inputs, keep=self._names(keep), edit=edit, stop_after=stop, grad=grad,
                            rules=rules, layout=layout or self.layout_for(inputs), adapter=self.adapter, fast=fast)
        trace.lens = self
        return trace

    def _names(self, keep: str | Iterable) -> list[str]:
        """``keep=`` as the adapters' names and patterns, checked against this model's points."""
        items = [keep] if isinstance(keep, (str, tuple)) and not (
            isinstance(keep, tuple) and keep and not isinstance(keep[-1], int)) else list(keep)
        L = self.num_layers
        names = []
        for item in items:
            if isinstance(item, tuple):
                kind, layer = item
                names.append(point_name(kind, layer_index(layer, L, kind)))
                check_kind(kind)
            elif item.removesuffix(NORM) in BLOCK_POINTS:
                names.append(f"blocks.*.{item}")
            elif item.removesuffix(NORM) in MODEL_POINTS or any(c in item for c in "*?["):
                names.append(item)
            elif item.startswith("blocks."):
                parts = item.split(".", 2)
                if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
                    raise VitvizError(f"{item!r} is not a point name: write blocks.<layer>.<kind>, e.g. blocks.3.attn.")
                check_kind(parts[2])
                names.append(point_name(parts[2], layer_index(int(parts[1]), L, parts[2])))
            else:
                check_kind(item)
        if "logits" in names and not self.has_head:
            raise VitvizError(f"{self.label} has no classifier head, so it has no logits: keep 'pooled' instead "
                              "(or give it a head).")
        return names


def _as_rgb(item, index: int) -> LoadedImage:
    """One item of :meth:`Lens.preprocess` decoded; an image given in memory is named ``image <index + 1>`` and its
    SHA-256 is that of its RGB pixels (marked ``:pixels``; a file's is of its bytes)."""
    if isinstance(item, (str, Path)):
        return load_image(item)
    image = _as_rgb_image(item, index)
    return LoadedImage(f"image {index + 1}", image, hashlib.sha256(image.tobytes()).hexdigest() + ":pixels")


def _as_rgb_image(item, index: int) -> Image.Image:
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
