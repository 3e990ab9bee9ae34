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

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..explainers.targets import Target
from .painted import (C, HOLDOUT, INFO, KIND, LABEL_RULE, MAPS, WEIGHTS, ConceptError, ConceptProbe,
                      ConceptScore, PaintedImages, patch_labels, patch_rectangle, read_concept)

MAX_FOLDS = 5
BLOCK = 2  # one painted image: patches held out in BLOCK x BLOCK blocks
MAX_ITER = 1000


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
