"""Painted concepts as data: the paintings and the labels they give the patches (:data:`LABEL_RULE`), and a fitted
patch probe per layer (:class:`ConceptProbe`) with its files (``probe.safetensors``, ``probe.json``,
``concept_maps.npz``). The fitting and the concept as an attribution target are :mod:`vitviz.probes.concepts`, which
re-exports every name here and whose docstring states the method.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import VitvizError

C = 0.1  # the inverse L2 strength on standardised tokens, unless fit_concept is given another
KIND = "patch"
WEIGHTS, INFO, MAPS = "probe.safetensors", "probe.json", "concept_maps.npz"
LABEL_RULE = ("an image with concept patches only: its unpainted patches are not concept; an image with not-concept "
              "patches: only its painted patches count; an image with nothing painted: maps only, no training")
HOLDOUT = {"images": "whole painted images held out (GroupKFold over images, at most 5 folds)",
           "blocks": "the one painted image's patches held out in 2x2 blocks (GroupKFold over the blocks, 5 folds, "
                     "shuffled)"}


class ConceptError(VitvizError, ValueError):
    """Paintings that cannot train a concept probe, or a concept target a method cannot explain (the sentence says
    why)."""


def patch_labels(concept: np.ndarray | None, not_concept: np.ndarray | None, num_patches: int) -> np.ndarray:
    """One image's patch labels (P,) int8 under :data:`LABEL_RULE`: 1 concept, 0 not concept, -1 left out.

    Args:
        concept, not_concept: (gh, gw) or (P,) bool, or None (nothing painted of that kind).
    """
    c = np.zeros(num_patches, bool) if concept is None else np.asarray(concept, bool).reshape(-1)
    n = None if not_concept is None else np.asarray(not_concept, bool).reshape(-1)
    if n is None or not n.any():
        return np.where(c, 1, 0 if c.any() else -1).astype(np.int8)
    return np.where(c, 1, np.where(n, 0, -1)).astype(np.int8)


def patch_rectangle(a: int, b: int, grid_size: tuple[int, int]) -> list[int]:
    """The raster indices (0-based) of the patches in the rectangle with corners at patches ``a`` and ``b``."""
    gw = grid_size[1]
    (r0, c0), (r1, c1) = divmod(int(a), gw), divmod(int(b), gw)
    return [r * gw + c for r in range(min(r0, r1), max(r0, r1) + 1) for c in range(min(c0, c1), max(c0, c1) + 1)]


@dataclass(frozen=True)
class PaintedImages:
    """Images with painted patches, in a fixed order.

    Attributes:
        images: what :meth:`vitviz.Lens.preprocess` takes (paths, PIL images) or :class:`vitviz.io.images.LoadedImage`.
        names: how messages and probe.json name each image.
        concept, not_concept: per image (gh, gw) bool on the model's patch grid, or None (nothing of that kind).
    """

    images: tuple
    names: tuple[str, ...]
    concept: tuple
    not_concept: tuple

    @classmethod
    def of(cls, images, concept, not_concept=None, names=None) -> "PaintedImages":
        """From lists (one entry per image; ``not_concept`` default all None, ``names`` default str of each)."""
        n = len(images)
        not_concept = [None] * n if not_concept is None else list(not_concept)
        names = [getattr(im, "name", None) or str(im) for im in images] if names is None else list(names)
        if not len(concept) == len(not_concept) == len(names) == n:
            raise ConceptError(f"give one concept mask (or None) per image: {n} images, {len(concept)} concept masks, "
                               f"{len(not_concept)} not-concept masks.")
        return cls(tuple(images), tuple(names), tuple(concept), tuple(not_concept))

    def labels(self, grid_size: tuple[int, int]) -> np.ndarray:
        """(n, P) int8 labels (:func:`patch_labels`), checked against the grid and against each other.

        Raises:
            ConceptError: a mask of another grid, a patch painted both ways, or no concept patch and no not-concept
                patch in the whole set (the sentence names the image).
        """
        gh, gw = grid_size
        rows = []
        for name, c, n in zip(self.names, self.concept, self.not_concept):
            for kind, mask in (("concept", c), ("not-concept", n)):
                if mask is not None and np.asarray(mask).size != gh * gw:
                    raise ConceptError(f"{name}: its {kind} mask has {np.asarray(mask).size} patches; the model's grid "
                                       f"has {gh}x{gw} = {gh * gw}.")
            if c is not None and n is not None and (np.asarray(c, bool) & np.asarray(n, bool)).any():
                raise ConceptError(f"{name}: a patch is painted both concept and not concept.")
            rows.append(patch_labels(c, n, gh * gw))
        labels = np.stack(rows)
        if not (labels == 1).any():
            raise ConceptError("no patch is painted as concept: paint the concept's patches on at least one image.")
        if not (labels == 0).any():
            raise ConceptError("every painted patch is concept: leave some patches of a painted image unpainted, or "
                               "paint some as not concept.")
        return labels


@dataclass(frozen=True)
class ConceptScore:
    """One layer's out-of-fold scores.

    Attributes:
        layer: 1-based.
        balanced_accuracy: mean of the concept and not-concept recalls (chance 0.5).
        accuracy: the share of painted patches predicted right (chance: the larger class's share).
        folds: the folds of the hold-out.
    """

    layer: int
    balanced_accuracy: float
    accuracy: float
    folds: int

    def to_dict(self) -> dict:
        return {"layer": self.layer, "balanced_accuracy": self.balanced_accuracy, "accuracy": self.accuracy,
                "folds": self.folds}


@dataclass
class ConceptProbe:
    """Patch probes of every layer, their scores and maps.

    Attributes:
        model: the backbone's identity (:func:`vitviz.probes.probe.model_identity`).
        num_prefix_tokens: tokens before the patches in ``resid_post``.
        grid_size: (gh, gw).
        layers: one :class:`ConceptScore` per layer (1-based), or [] for a probe read from a file without them.
        weight: (L, D) float64, row l-1 the probe of layer l on raw ``resid_post`` patch tokens (standardisation
            folded in): logit = token @ weight[l-1] + bias[l-1], probability = sigmoid(logit).
        bias: (L,) float64.
        holdout: ``"images"`` or ``"blocks"`` (:data:`HOLDOUT`).
        images: per image ``{"name", "sha256", "concept", "not_concept", "left_out"}`` (patch counts).
        labels: (n, P) int8 the labels trained on (1 concept, 0 not, -1 left out or not painted).
        probability: (n, L, gh, gw) float32, the probe's probability on every patch, per layer (layer 0-based).
        chance: the larger class's share of painted patches (plain accuracy's chance; balanced accuracy's is 0.5).
        C: the inverse L2 strength.
    """

    model: dict
    num_prefix_tokens: int
    grid_size: tuple[int, int]
    layers: list[ConceptScore]
    weight: np.ndarray
    bias: np.ndarray
    holdout: str
    images: list[dict]
    labels: np.ndarray | None = field(default=None, repr=False)
    probability: np.ndarray | None = field(default=None, repr=False)
    chance: float = 0.5
    C: float = C

    @property
    def num_layers(self) -> int:
        return len(self.weight)

    @property
    def table(self) -> list[dict]:
        """``[{"layer": 1, "balanced_accuracy", "accuracy", "folds"}, ...]`` (layers 1-based)."""
        return [s.to_dict() for s in self.layers]

    def readable_from(self, threshold: float = 0.9) -> int | None:
        """The first layer (1-based) from which every layer's balanced accuracy is at least ``threshold``, or None."""
        first = None
        for s in self.layers:
            first = (first or s.layer) if s.balanced_accuracy >= threshold else None
        return first

    def logits(self, tokens: torch.Tensor, layer: int) -> torch.Tensor:
        """The concept's logit per patch: ``tokens`` (B, N, D) of ``blocks.{layer-1}.resid_post`` -> (B, P)."""
        w = torch.as_tensor(self.weight[layer - 1], dtype=tokens.dtype, device=tokens.device)
        b = float(self.bias[layer - 1])
        return tokens[:, self.num_prefix_tokens:] @ w + b

    def info(self) -> dict:
        """probe.json's content."""
        import sklearn

        return {"format": 1, "kind": KIND, "model": self.model, "point": "resid_post", "layer_base": 1,
                "token_layout": {"num_prefix_tokens": self.num_prefix_tokens, "grid_size": list(self.grid_size)},
                "probe": {"weight": list(self.weight.shape), "bias": list(self.bias.shape), "C": self.C,
                          "definition": "row l-1 is layer l's probe on the patch tokens of blocks.{l-1}.resid_post "
                                        "(prefix tokens dropped): logit = token @ weight[l-1] + bias[l-1], "
                                        "probability = sigmoid(logit); standardisation folded in; classes weighted "
                                        "by inverse frequency"},
                "labels": LABEL_RULE, "holdout": HOLDOUT[self.holdout], "holdout_kind": self.holdout,
                "score": "balanced_accuracy: mean of the concept and not-concept recalls over the painted patches, "
                         "out-of-fold (chance 0.5); accuracy: share right (chance: the larger class's share)",
                "chance": {"balanced_accuracy": 0.5, "accuracy": self.chance},
                "layers": self.table, "sklearn": sklearn.__version__, "images": self.images,
                "maps": f"{MAPS}: probability (n, L, gh, gw) float32 (layer 0-based), names (n,), labels (n, gh, gw) "
                        "int8 (1 concept, 0 not, -1 left out)"}

    def files(self) -> dict[str, bytes]:
        """``{"probe.safetensors", "probe.json", "concept_maps.npz"}`` bytes (the last only with maps)."""
        import io

        from safetensors.torch import save

        from .probe import METADATA_KEY

        info = self.info()
        out = {WEIGHTS: save({"weight": torch.from_numpy(self.weight).float().contiguous(),
                              "bias": torch.from_numpy(self.bias).float().contiguous()},
                             metadata={METADATA_KEY: json.dumps(info)}),
               INFO: (json.dumps(info, indent=1) + "\n").encode()}
        if self.probability is not None:
            buffer = io.BytesIO()
            gh, gw = self.grid_size
            np.savez_compressed(buffer, probability=self.probability.astype(np.float32),
                                names=np.array([im["name"] for im in self.images]),
                                labels=self.labels.reshape(-1, gh, gw))
            out[MAPS] = buffer.getvalue()
        return out

    def save(self, folder: str | Path) -> Path:
        """Write the files of :meth:`files` into ``folder`` (created), each whole or not at all; returns the
        safetensors file."""
        from ..io.atomic import atomic_write_bytes

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        files = self.files()
        for name in (MAPS, WEIGHTS, INFO):  # probe.json last: its presence says the set is complete
            if name in files:
                atomic_write_bytes(folder / name, files[name])
        return folder / WEIGHTS


def read_concept(path: str | Path) -> ConceptProbe:
    """A concept probe written by :meth:`ConceptProbe.save` (``probe.safetensors``; its maps are not read).

    Raises:
        ConceptError: not a patch probe file (the sentence names it).
    """
    from safetensors import safe_open

    from .probe import METADATA_KEY

    path = Path(path)
    try:
        with safe_open(str(path), framework="np") as f:
            info = json.loads((f.metadata() or {}).get(METADATA_KEY, "{}"))
            weight, bias = f.get_tensor("weight").astype(np.float64), f.get_tensor("bias").astype(np.float64)
    except Exception as exc:  # noqa: BLE001 - missing, damaged or foreign: say so
        raise ConceptError(f"{path} is not a concept probe file ({exc}).") from None
    if info.get("kind") != KIND:
        raise ConceptError(f"{path.name} is not a patch (concept) probe: it was written by `probe` without "
                           "--patch-masks.")
    try:
        layout = info["token_layout"]
        scores = [ConceptScore(r["layer"], r["balanced_accuracy"], r["accuracy"], r["folds"]) for r in info["layers"]]
        return ConceptProbe(info["model"], int(layout["num_prefix_tokens"]), tuple(layout["grid_size"]), scores,
                            weight, bias, info["holdout_kind"], info["images"], chance=info["chance"]["accuracy"],
                            C=info["probe"]["C"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConceptError(f"{path.name}: its description lacks {exc} (write it again with probe --patch-masks).") \
            from None
