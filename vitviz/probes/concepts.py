"""Concepts painted on the image: a logistic probe per layer on the patch tokens, from patches marked as "concept"
(and optionally "not concept") on one or more images.

```python
painted = PaintedImages.of(["assets/chelsea.jpg", "assets/coffee.jpg"],
                           concept=[eyes, None])                 # (gh, gw) bool per image; None: map only
concept = fit_concept(lens, painted)
concept.table               # [{"layer": 1, "balanced_accuracy": ..., "accuracy": ..., ...}, ...] layers 1-based
concept.probability         # (n, L, gh, gw): the probe's probability on every patch of every image, per layer
vitviz.explain(lens, x, "attnlrp", target=vitviz.ConceptTarget(concept, layer=9))
```

Which patches are what (stated on screen and in probe.json, :data:`LABEL_RULE`):

- an image with concept patches and no not-concept patches: its other patches are *not concept*;
- an image with not-concept patches: only the patches painted on it count, the unpainted ones are left out;
- an image with nothing painted takes no part in training: it only gets maps ("where else does it fire").

The probe of layer l (1-based) reads ``blocks.{l-1}.resid_post`` (the block's output tokens, as ``lens.trace`` keeps
them, prefix tokens dropped): ``StandardScaler`` then ``LogisticRegression`` (L2, C = :data:`C` on the standardised
tokens, classes weighted by their inverse frequency so that a small concept is not outvoted). Its accuracy is
out-of-fold (:data:`HOLDOUT`): with two or more painted images, whole images are held out (``GroupKFold`` over
images, at most 5 folds); with one, its patches are held out in 2x2 blocks (``GroupKFold`` over the blocks, 5 folds,
shuffled) so that a patch's closest neighbours are held out with it. The score shown is the balanced accuracy (the mean
of the concept and not-concept recalls: chance is 0.5 whatever the share of concept patches); plain accuracy and its
chance (the larger class's share) are kept beside it. The maps come from the probe fitted on all painted patches:
on the painted images they are the training data's fit, on the others a prediction.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..explainers.targets import Target
from ..errors import VitvizError

C = 0.1
MAX_FOLDS = 5
BLOCK = 2  # one painted image: patches held out in BLOCK x BLOCK blocks
MAX_ITER = 1000
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


# ---------------------------------------------------------------------------------------------
# Fitting


def patch_tokens(lens, painted: PaintedImages, batch_size: int = 8, progress=None) -> tuple[np.ndarray, list[str]]:
    """Every layer's patch tokens of every image from one forward per image: (L, n, P, D) float32 and each image's
    SHA-256 (of the file, or of the decoded pixels for an image given as PIL)."""
    import hashlib

    from ..io.images import LoadedImage, load_image
    from ..errors import ImageError

    if lens.scope != "global":
        raise ConceptError(f"{lens.label} attends within windows and pools only its last stage: patch probes read "
                           "models whose every layer has the same patch tokens (ViT, DeiT, DINOv2, CLIP, ...).")
    npt = lens.layout.num_prefix_tokens
    out, hashes = [], []
    for start in range(0, len(painted.images), batch_size):
        batch = []
        for item, name in zip(painted.images[start:start + batch_size], painted.names[start:start + batch_size]):
            if isinstance(item, (str, Path)):
                try:
                    item = load_image(item, name)
                except ImageError as exc:
                    raise ConceptError(str(exc)) from None
            if isinstance(item, LoadedImage):
                hashes.append(item.sha256)
                item = item.image
            else:
                hashes.append(hashlib.sha256(item.convert("RGB").tobytes()).hexdigest())
            batch.append(item)
        trace = lens.trace(lens.preprocess(batch), keep="resid_post")
        out.append(trace.stack("resid_post")[:, :, npt:].transpose(0, 1).float().cpu().numpy())  # (L, B, P, D)
        if progress is not None:
            progress(min(start + batch_size, len(painted.images)))
    return np.concatenate(out, axis=1), hashes


def _probe(C: float, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, class_weight="balanced", max_iter=MAX_ITER,
                                                              random_state=seed))


def folds_of(labels: np.ndarray, grid_size: tuple[int, int], seed: int = 0) -> tuple[str, np.ndarray, int]:
    """The hold-out groups of the painted patches: (``"images"`` or ``"blocks"``, groups (M,) one per painted patch
    in raster order of ``labels`` (n, P) >= 0, the number of folds)."""
    gh, gw = grid_size
    image, patch = np.nonzero(labels >= 0)
    painted_images = np.unique(image)
    if len(painted_images) >= 2:
        return "images", image, min(MAX_FOLDS, len(painted_images))
    row, col = divmod(patch, gw)
    blocks = (row // BLOCK) * (-(-gw // BLOCK)) + col // BLOCK
    return "blocks", blocks, min(MAX_FOLDS, len(np.unique(blocks)))


def score_layer(X: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int, seed: int = 0, C: float = C
                ) -> tuple[float, float]:
    """Out-of-fold (balanced accuracy, accuracy) of one layer's painted patches ``X`` (M, D), labels ``y`` (M,) in
    {0, 1}, hold-out ``groups`` (M,). A training fold holding one class only predicts that class."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import GroupKFold

    predicted = np.empty_like(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for train, test in GroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(X, y, groups):
            if len(np.unique(y[train])) == 1:
                predicted[test] = y[train][0]
            else:
                predicted[test] = _probe(C, seed).fit(X[train], y[train]).predict(X[test])
    return float(balanced_accuracy_score(y, predicted)), float((predicted == y).mean())


def fit_concept(lens, painted: PaintedImages, C: float = C, batch_size: int = 8, seed: int = 0,
                progress=None) -> ConceptProbe:
    """Score a patch probe on every layer and map every image with each.

    Args:
        lens: the opened model (:func:`vitviz.open`); window-attention models are refused.
        painted: the images and their masks on the model's patch grid (:class:`PaintedImages`).
        C: inverse L2 strength on standardised tokens.
        seed: the folds' shuffling.
        progress: called with the number of images whose tokens are done.

    Returns:
        ConceptProbe: ``.layers`` (scores per layer), ``.probability`` (n, L, gh, gw), ``.weight`` (L, D).

    Raises:
        ConceptError: paintings that cannot train a probe (the sentence names the image).
    """
    from sklearn.exceptions import ConvergenceWarning

    from .linear import export_head
    from .probe import model_identity

    grid = tuple(lens.layout.grid_size)
    labels = painted.labels(grid)
    tokens, hashes = patch_tokens(lens, painted, batch_size, progress)  # (L, n, P, D)
    L, n, P, D = tokens.shape
    holdout, groups, folds = folds_of(labels, grid, seed)
    painted_at = labels >= 0
    y = labels[painted_at].astype(np.int64)
    scores, weight, bias = [], np.zeros((L, D)), np.zeros(L)
    for i in range(L):
        X = tokens[i][painted_at].astype(np.float64)
        balanced, plain = score_layer(X, y, groups, folds, seed, C)
        scores.append(ConceptScore(i + 1, balanced, plain, folds))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            w, b = export_head(_probe(C, seed).fit(X, y), 1)  # one score: the concept's logit
        weight[i], bias[i] = w[0], b[0]
    logits = np.einsum("lnpd,ld->lnp", tokens.astype(np.float64), weight) + bias[:, None, None]
    probability = (1 / (1 + np.exp(-logits))).transpose(1, 0, 2).reshape(n, L, *grid).astype(np.float32)
    images = [{"name": name, "sha256": h, "concept": int((row == 1).sum()), "not_concept": int((row == 0).sum()),
               "left_out": int((row == -1).sum())} for name, h, row in zip(painted.names, hashes, labels)]
    chance = float(max(y.mean(), 1 - y.mean()))
    return ConceptProbe(model_identity(lens), lens.layout.num_prefix_tokens, grid, scores, weight, bias, holdout,
                        images, labels, probability, chance, C)


# ---------------------------------------------------------------------------------------------
# The concept as an attribution target


@dataclass(frozen=True)
class ConceptTarget(Target):
    """A painted concept as the score any map method explains: which pixels made the concept fire.

    ``vitviz.explain(lens, x, "attnlrp", target=ConceptTarget(concept, layer=9))``. The value is the patch probe's
    logit (before the sigmoid) on ``blocks.{layer-1}.resid_post``, summed over the image's patches (``patch`` None)
    or at patch ``patch`` (0-based raster index). Relevance methods (AttnLRP, CP-LRP, Gradient x Input), Integrated
    Gradients and occlusion explain it; LeGrad (which scores the model's output through its head) and Grad-CAM on a
    block after ``layer`` are refused with a sentence.

    Args:
        probe: a :class:`ConceptProbe` (:func:`fit_concept`) or the path of its ``probe.safetensors``.
        layer: the probe's layer, 1-based (as in its table and on screen).
        patch: one patch (0-based raster index), or None for the sum over the patches.
    """

    probe: ConceptProbe = field(compare=False)
    layer: int
    patch: int | None = None
    binds_per_image = False  # nothing is fixed from the unperturbed image: the same target scores every copy

    def __post_init__(self):
        if isinstance(self.probe, (str, Path)):
            object.__setattr__(self, "probe", read_concept(self.probe))
        L = self.probe.num_layers
        if not 1 <= int(self.layer) <= L:
            raise ConceptError(f"layer {self.layer} is not a layer of this concept probe: its layers are 1 to {L} "
                               "(1-based).")
        P = self.probe.grid_size[0] * self.probe.grid_size[1]
        if self.patch is not None and not 0 <= int(self.patch) < P:
            raise ConceptError(f"patch {self.patch} is out of range: the grid has {P} patches (0 to {P - 1}).")

    @property
    def point(self) -> str:
        return f"blocks.{int(self.layer) - 1}.resid_post"

    def __call__(self, points):
        if self.point not in points:
            raise ConceptError(f"this map method scores the model's output, not the tokens inside it: a painted "
                               f"concept reads layer {self.layer}'s tokens (use AttnLRP, CP-LRP, Gradient x Input, "
                               "Integrated Gradients or occlusion).")
        later = sorted({int(k.split(".")[1]) + 1 for k in points
                        if k.startswith("blocks.") and int(k.split(".")[1]) > int(self.layer) - 1})
        if later:
            raise ConceptError(f"this map method reads layer {later[-1]}, after the concept's layer {self.layer}, "
                               "where the concept's logit has no gradient: use AttnLRP, CP-LRP, Gradient x Input, "
                               "Integrated Gradients or occlusion (or the concept at the last layer).")
        logits = self.probe.logits(points[self.point], int(self.layer))  # (B, P)
        return logits.sum(1) if self.patch is None else logits[:, int(self.patch)]

    def describe(self) -> dict:
        return {"kind": "concept", "layer": int(self.layer), "layer_base": 1, "patch": self.patch,
                "point": self.point, "definition": "the patch probe's logit (token @ weight + bias) "
                + ("summed over the patches" if self.patch is None else "at the patch (0-based raster index)")}

    def text(self) -> str:
        where = "summed over the patches" if self.patch is None else f"at patch {self.patch}"
        return f"painted concept's logit at layer {self.layer}, {where}"
