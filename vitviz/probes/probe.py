"""A trained probe: the per-layer accuracy table, the head on the chosen layer, and its two files.

``probe.safetensors`` holds ``weight`` (K, F) and ``bias`` (K,) float32 — logits = pooled @ weight.T + bias,
classes in ``classes`` order — and, in its metadata under ``vitviz_probe``, the same description as
``probe.json`` (so the one file is enough to give a model its head, e.g. as an upload).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import VitvizError
from ..io.atomic import atomic_write_bytes
from .data import LabelledImages
from .features import POOLINGS, check_pooling, layer_features, weights_sha256
from .linear import CSearch, LayerScore, chance, export_head, fit_probe, score_layer

WEIGHTS, INFO = "probe.safetensors", "probe.json"
METADATA_KEY = "vitviz_probe"
FORMAT = 1


def model_identity(lens) -> dict:
    """What a probe records about the backbone it was trained on (and a head is checked against).

    ``lens``: a :class:`vitviz.Lens` or its :class:`vitviz.sources.models.LoadedModel`."""
    loaded = getattr(lens, "loaded", lens)
    spec, layout = loaded.spec, loaded.layout
    return {"name": spec.name, "checkpoint": Path(spec.checkpoint).name if spec.checkpoint else None,
            "label": loaded.label, "num_layers": loaded.adapter.num_layers(loaded.model),
            "input_size": [g * p for g, p in zip(layout.grid_size, layout.patch_size)],
            "dtype": str(loaded.dtype).removeprefix("torch."), "weights_sha256": weights_sha256(loaded.model)}


@dataclass
class ProbeResult:
    """Probes of every layer and the head of one.

    Attributes:
        model: the backbone's identity (:func:`model_identity`).
        pooling: one of :data:`vitviz.probes.features.POOLINGS`.
        classes: the class names in the head's order (sorted).
        layers: one :class:`LayerScore` per layer (1-based ``layer``), cross-validated.
        chance: the majority class's share of the images.
        layer: the head's layer, 1-based.
        weight, bias: the head, (K, F) and (K,) float64: logits = features @ weight.T + bias.
        C: the head's C (chosen by cross-validation on all images).
        images: per image ``{"name", "label", "sha256"}``.
        features: (L, n, F) the features the probes were fitted on (layer 0-based), not saved.
        C_search: the head's C search (:class:`vitviz.probes.linear.CSearch`: an end of the grid is reported).
    """

    model: dict
    pooling: str
    classes: tuple[str, ...]
    layers: list[LayerScore]
    chance: float
    layer: int
    weight: np.ndarray
    bias: np.ndarray
    C: float
    images: list[dict]
    features: np.ndarray | None = field(default=None, repr=False)
    C_search: CSearch | None = None

    @property
    def head(self) -> torch.nn.Linear:
        """The head as one linear layer on the pooled vector (F -> K), float32."""
        linear = torch.nn.Linear(self.weight.shape[1], self.weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(self.weight))
            linear.bias.copy_(torch.from_numpy(self.bias))
        return linear.requires_grad_(False)

    @property
    def table(self) -> list[dict]:
        """Accuracy per layer: ``[{"layer": 1, "accuracy", "low", "high", "folds", "C", "C_at_edge"}, ...]`` (layers
        1-based; C_at_edge: outer folds whose C search chose an end of its grid)."""
        return [s.to_dict() for s in self.layers]

    def info(self) -> dict:
        """probe.json's content."""
        import sklearn

        return {"format": FORMAT, "model": self.model, "layer": self.layer, "layer_base": 1,
                "pooling": self.pooling, "pooling_definition": POOLINGS[self.pooling], "classes": list(self.classes),
                "head": {"weight": list(self.weight.shape), "bias": list(self.bias.shape), "C": self.C,
                         "definition": "logits = pooled @ weight.T + bias; standardisation folded in",
                         **({"C_search": self.C_search.to_dict()} if self.C_search else {})},
                "layers": self.table, "chance": self.chance,
                "accuracy": "out-of-fold accuracy of a stratified K-fold over the images (C chosen by an inner "
                            "stratified K-fold on each fold's training images); low/high: 95% Wilson interval; "
                            "chance: the largest class's share",
                "sklearn": sklearn.__version__, "images": self.images}

    def files(self) -> dict[str, bytes]:
        """The two files' bytes: ``{"probe.safetensors": ..., "probe.json": ...}`` (downloads)."""
        from safetensors.torch import save

        info = self.info()
        tensors = {"weight": torch.from_numpy(self.weight).float().contiguous(),
                   "bias": torch.from_numpy(self.bias).float().contiguous()}
        return {WEIGHTS: save(tensors, metadata={METADATA_KEY: json.dumps(info)}),
                INFO: (json.dumps(info, indent=1) + "\n").encode()}

    def save(self, folder: str | Path) -> Path:
        """Write ``probe.safetensors`` then ``probe.json`` into ``folder`` (created), each whole or not at all.
        Returns the safetensors file."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        files = self.files()
        path = atomic_write_bytes(folder / WEIGHTS, files[WEIGHTS])
        atomic_write_bytes(folder / INFO, files[INFO])
        return path

    def at_layer(self, layer: int, seed: int = 0) -> "ProbeResult":
        """The same scores with the head refitted on ``layer`` (1-based) from the kept features."""
        if self.features is None:
            raise VitvizError("this probe result kept no features to refit its head on another layer.")
        layer = pick_layer(self.layers, layer, len(self.features))
        y = np.asarray([self.classes.index(im["label"]) for im in self.images])
        pipeline, search = fit_probe(self.features[layer - 1], y, seed)
        weight, bias = export_head(pipeline, len(self.classes))
        return dataclasses.replace(self, layer=layer, weight=weight, bias=bias, C=search.C, C_search=search)


def as_labelled(images, labels) -> LabelledImages:
    """``images`` as :class:`LabelledImages`: already one, or paths with one label each."""
    if isinstance(images, LabelledImages):
        return images
    if labels is None or len(labels) != len(images):
        raise VitvizError(f"give one label per image: {len(images)} images, "
                          f"{'no' if labels is None else len(labels)} labels.")
    paths = tuple(Path(p) for p in images)
    return LabelledImages(paths, tuple(str(p) for p in images), tuple(str(c) for c in labels),
                          tuple(f"image {i + 1} ({p})" for i, p in enumerate(images))).check("the images given")


def pick_layer(scores: list[LayerScore], layer: int | None, num_layers: int) -> int:
    """The head's layer (1-based): ``layer`` checked, or the most accurate (the earliest of equals)."""
    if layer is None:
        return max(scores, key=lambda s: (s.accuracy, -s.layer)).layer
    if not 1 <= layer <= num_layers:
        raise VitvizError(f"layer {layer} is not a layer of this model: its layers are 1 to {num_layers}.")
    return layer


def fit(lens, images, labels=None, pooling: str = "cls", layer: int | None = None, batch_size: int = 8,
        seed: int = 0, progress=None, features: tuple[np.ndarray, list[str]] | None = None) -> ProbeResult:
    """Probe every layer of ``lens``'s model and fit the head of one.

    Args:
        lens: the opened model (:func:`vitviz.open`).
        images: :class:`LabelledImages` (:func:`from_folders`, :func:`from_label_file`), or image paths.
        labels: one class name per image when ``images`` are paths.
        pooling: ``"cls"``, ``"mean"`` or ``"cls+mean"`` (:data:`POOLINGS`).
        layer: the head's layer, 1-based; default the most accurate.
        seed: the folds' shuffling.
        progress: called with the number of images whose features are done.
        features: (features (L, n, F), SHA-256 per image) computed already, e.g. by
            :func:`vitviz.probes.collect.collect_features` (the command's engine, resumable); None: computed here.

    Returns:
        ProbeResult: ``.layers`` (accuracy per layer), ``.head`` (torch Linear), ``.save(folder)``.

    Raises:
        VitvizError: bad labels (:class:`LabelError`, naming the file and line), pooling or layer.
    """
    labelled = as_labelled(images, labels)
    check_pooling(pooling)
    features, hashes = features or layer_features(lens, labelled, pooling, batch_size, progress)
    y = np.asarray(labelled.targets())
    scores = [score_layer(features[i], y, i + 1, seed) for i in range(len(features))]
    chosen = pick_layer(scores, layer, len(features))
    pipeline, search = fit_probe(features[chosen - 1], y, seed)
    weight, bias = export_head(pipeline, len(labelled.classes))
    images_info = [{"name": n, "label": c, "sha256": h} for n, c, h in zip(labelled.names, labelled.labels, hashes)]
    return ProbeResult(model_identity(lens), pooling, labelled.classes, scores, chance(y), chosen, weight, bias,
                       search.C, images_info, features, search)
