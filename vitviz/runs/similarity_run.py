"""How the layers of one model relate to each other and to another model's: :func:`similarity`, CKA over an image set.

```python
import vitviz
a = vitviz.open("bundled")
result = vitviz.similarity(a, a, ["assets/"], batch_size=8)      # within one model: (12, 12)
cnn = vitviz.CNNFeatures.open("resnet50", checkpoint="resnet50.safetensors")   # a CNN's stages as the other side
result = vitviz.similarity(a, cnn, paths, pooling="mean")         # (12, 5)
result.cka, result.low, result.high                               # (L_a, L_b), 0-based layers
result.table()                                                    # layer_a, layer_b, cka, low, high, images
```

A ViT's layers are read through :meth:`vitviz.Lens.trace` at a named point (``resid_post`` by default); a CNN's
stages through timm's ``forward_intermediates`` (:mod:`vitviz.adapters.cnn`). Images are the examples; each layer's
features per image are chosen by ``pooling`` (:data:`POOLINGS`). The estimator and its interval are
:class:`vitviz.analyses.similarity.MinibatchCKA`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ..analyses.similarity import KERNELS, MinibatchCKA
from ..errors import ImageError, VitvizError
from .layer_features import POOLINGS, features_of, grams
from ..words import counted

MIN_BATCH = 4  # the unbiased HSIC needs four examples


class TooFewImages(VitvizError):
    """Fewer than four of the images could be read; ``skipped``: (name, reason) of each that could not."""

    def __init__(self, message: str, skipped: list[tuple[str, str]]):
        super().__init__(message)
        self.skipped = skipped


@dataclass(frozen=True)
class Similarity:
    """CKA of every layer of model A against every layer of model B over one image set.

    Attributes:
        cka: (L_a, L_b) float64, layer i of A (0-based, row) against layer j of B (column); 1-based on screen.
        low: (L_a, L_b) the bootstrap interval's 2.5 percentile over images; NaN with bootstrap=0.
        high: (L_a, L_b) its 97.5 percentile.
        images: how many images the estimate used.
        layers_a: model A's layer names (``"block 1"``, ... ; a CNN's stage modules ``"layer1"``, ...).
        layers_b: model B's.
        settings: models, point, pooling (with what it means), kernel, batch size, minibatches, estimator, interval.
    """

    cka: np.ndarray
    low: np.ndarray
    high: np.ndarray
    images: int
    layers_a: tuple[str, ...]
    layers_b: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """One row per pair of layers: layer_a, layer_b (0-based), cka, low, high, images."""
        la, lb = self.cka.shape
        a, b = np.meshgrid(np.arange(la), np.arange(lb), indexing="ij")
        return pd.DataFrame({"layer_a": a.ravel(), "layer_b": b.ravel(), "cka": self.cka.ravel(),
                             "low": self.low.ravel(), "high": self.high.ravel(), "images": self.images})

    def diagonal(self) -> pd.DataFrame:
        """The curve along the map: for two models, each layer of A against B's layer at the same relative depth (the
        same index when the depths agree); within one model, each layer against the next (how much each block
        changes the representation). Columns layer_a, layer_b (0-based), cka, low, high."""
        la, lb = self.cka.shape
        if self.settings.get("same_model"):
            a = np.arange(la - 1)
            b = a + 1
        else:
            a = np.arange(la)
            b = np.clip(np.round((a + 1) * lb / la).astype(int) - 1, 0, lb - 1)
        return pd.DataFrame({"layer_a": a, "layer_b": b, "cka": self.cka[a, b], "low": self.low[a, b],
                             "high": self.high[a, b]})


def _check_options(pooling: str, kernel: str, batch_size: int, images: int) -> None:
    """A sentence for a pooling or kernel :func:`similarity` does not know, or too few images per minibatch or all."""
    if pooling not in POOLINGS:
        raise VitvizError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}.")
    if kernel not in KERNELS:
        raise VitvizError(f"kernel {kernel!r} is not one of {', '.join(KERNELS)}.")
    if batch_size < MIN_BATCH:
        raise VitvizError(f"batch size {batch_size}: minibatch CKA needs {MIN_BATCH} or more images per minibatch.")
    if images < MIN_BATCH:
        raise VitvizError(f"{counted(images, 'image')}: CKA needs {MIN_BATCH} or more (the unbiased HSIC compares "
                          "pairs of pairs of images).")


def similarity(lens_a, lens_b, images: Sequence, point: str = "resid_post", pooling: str = "tokens",
               batch_size: int = 32, kernel: str = "linear", threshold: float = 1.0, bootstrap: int = 200,
               seed: int = 0, progress: Callable[[int, int], None] | None = None) -> Similarity:
    """CKA between every layer of ``lens_a`` and every layer of ``lens_b`` on the same images.

    Minibatch CKA with the unbiased HSIC (Nguyen, Raghu & Kornblith, ICLR 2021): images go through both models
    ``batch_size`` at a time and only the sums of each minibatch's HSIC stay, so memory does not grow with the number
    of images; the interval is a Bayesian bootstrap over the images (:class:`vitviz.analyses.similarity.MinibatchCKA`).

    Args:
        lens_a: a :class:`vitviz.Lens` (read at ``point``), a :class:`LensFeatures` or a :class:`CNNFeatures`.
        lens_b: the same kinds; ``lens_a`` itself gives the within-model map from one forward per batch.
        images: paths, PIL images or (H, W, 3) arrays (anything :meth:`vitviz.Lens.preprocess` takes); 4 or more.
        point: a ViT's token point per block (``resid_post``: each block's output).
        pooling: ``"tokens"``, ``"mean"`` or ``"cls"``: what one image's features are (:data:`POOLINGS`).
        batch_size: images per minibatch (4 or more; the images are split into near-equal minibatches).
        kernel: ``"linear"`` or ``"rbf"`` (width ``threshold`` x the median distance in each minibatch).
        bootstrap: replicates of the interval (0: none).
        seed: of the bootstrap.
        progress: ``progress(done, total)`` after each minibatch, in images.

    Returns:
        Similarity: ``cka``, ``low``, ``high`` (L_a, L_b); ``images``; ``settings``.

    Raises:
        VitvizError: fewer than 4 images, an unknown pooling, kernel or point, CLS pooling of a model without one.
    """
    images = list(images)
    _check_options(pooling, kernel, batch_size, len(images))
    side_a = features_of(lens_a, point)
    same = lens_b is lens_a
    side_b = side_a if same else features_of(lens_b, point)
    sizes = iter(minibatch_sizes(len(images), batch_size))
    accumulator = MinibatchCKA(len(side_a.layer_names), len(side_b.layer_names), replicates=bootstrap, seed=seed)
    from ..lens import _as_rgb

    def add(loaded: list) -> None:
        pictures = [item.image for item in loaded]
        grams_a = grams(side_a, pictures, pooling, kernel, threshold)
        grams_b = grams_a if same else grams(side_b, pictures, pooling, kernel, threshold)
        accumulator.update(grams_a, grams_b, same=same)

    # Images are decoded once for both models, a minibatch at a time. One that cannot be read is skipped and the next
    # images fill its minibatch; each full minibatch waits until the next is full, so that a last one left short by
    # unreadable files joins it instead of being dropped.
    pending, held, skipped, target = [], [], [], next(sizes)
    for i, item in enumerate(images):
        try:
            pending.append(_as_rgb(item, i))
        except ImageError as exc:
            skipped.append((exc.name, exc.reason))
        if len(pending) >= target:
            if held:
                add(held)
                if progress is not None:
                    progress(i + 1 - len(pending), len(images))
            held, pending, target = pending, [], next(sizes, target)
    if len(pending) >= MIN_BATCH:
        if held:
            add(held)
        held = pending
    else:
        held += pending
    if len(held) >= MIN_BATCH:
        add(held)
    else:
        skipped += [(item.name, f"fewer than {MIN_BATCH} readable images in all") for item in held]
    if progress is not None:
        progress(len(images), len(images))
    if accumulator.batches == 0:
        raise TooFewImages(f"fewer than {MIN_BATCH} of the {len(images)} images could be read: CKA needs {MIN_BATCH}.",
                           skipped)
    return result_of(accumulator, describe(side_a, side_b), point=point, pooling=pooling, kernel=kernel,
                     threshold=threshold, batch_size=batch_size, seed=seed, skipped=skipped)


def describe(side_a, side_b) -> dict:
    """The two sides in words: labels, layer names, whether they are one model."""
    return {"model_a": side_a.label, "model_b": side_b.label, "same_model": side_b is side_a,
            "layers_a": list(side_a.layer_names), "layers_b": list(side_b.layer_names)}


def result_of(accumulator: MinibatchCKA, sides: dict, *, point: str, pooling: str, kernel: str, threshold: float,
              batch_size: int, seed: int, skipped: list[tuple[str, str]]) -> Similarity:
    """The summed minibatches as a :class:`Similarity`, with its settings in words (``sides``: :func:`describe`)."""
    cka, low, high = accumulator.result()
    bootstrap = accumulator.replicates
    settings = {
        "model_a": sides["model_a"], "model_b": sides["model_b"], "same_model": sides["same_model"],
        "point": point, "pooling": pooling, "pooling_means": POOLINGS[pooling],
        "kernel": kernel, "rbf_threshold": threshold if kernel == "rbf" else None,
        "batch_size": batch_size, "minibatches": accumulator.batches, "images": accumulator.images,
        "estimator": "minibatch CKA with the unbiased HSIC (Song et al. 2012) summed over minibatches "
                     "(Nguyen, Raghu & Kornblith, ICLR 2021); examples are images",
        "interval": f"95 % percentile Bayesian bootstrap over the {accumulator.images} images ({bootstrap} replicates "
                    f"of Exp(1) image weights, seed {seed}; each minibatch's unbiased HSIC weighted)" if bootstrap
                    else "none (bootstrap 0)",
        "layers": "0-based in arrays and tables; 1-based on screen",
        "skipped": skipped,
    }
    return Similarity(cka=cka, low=low, high=high, images=accumulator.images, layers_a=tuple(sides["layers_a"]),
                      layers_b=tuple(sides["layers_b"]), settings=settings)


def minibatch_sizes(images: int, batch_size: int) -> list[int]:
    """How ``images`` images split into minibatches: near-equal ones of at most ``batch_size`` images, unless that
    would leave one under four (then fewer, larger ones); one minibatch when there are under eight images."""
    count = max(1, min(-(-images // batch_size), images // MIN_BATCH))
    return [len(b) for b in np.array_split(np.arange(images), count)]
