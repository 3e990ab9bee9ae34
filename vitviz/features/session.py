"""A small SAE trained on a handful of images in one go (the Features page's Train button): ``features train`` in a
temporary folder (the model runs once; the tokens are held for the epochs), the finished folder handed back as a zip.

```python
from vitviz.features.session import default_settings, train_small
trained = train_small(lens, images, default_settings(lens))   # images: paths, ImageFiles or LoadedImages
trained.sae; trained.zip                                       # the SAE; sae.safetensors + sae.json zipped
```
"""
from __future__ import annotations

import hashlib
import io
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import VitvizError
from .sae import SAE_INFO, SAE_WEIGHTS, SAE
from .train import TrainSettings, train

# Until converged (the trainer's plateau test, vitviz.features.sae.Convergence: at least 2,000 steps) on 2 of the
# bundled samples (512 patch tokens, the bundled model's layer 9): explained variance 0.97 in 2,000 steps, 15-20 s on
# a CPU shared with other jobs; 4 photos 0.95 (tests/test_features_session.py).
DEFAULT_LATENTS = 256
DEFAULT_TOPK = 8
DEFAULT_EPOCHS = None  # until converged
DEFAULT_BATCH_TOKENS = 256
# Images per forward: the whole set of a small run in one batch, so each epoch shuffles every token together.
MAX_BATCH_IMAGES = 16


@dataclass(frozen=True)
class SizeCap:
    """The most a shared server trains for one request (``None``: no cap).

    Attributes:
        images: images in the training set. latents: width K. epochs: passes over the set's tokens.
    """

    images: int | None = None
    latents: int | None = None
    epochs: int | None = None

    def check(self, settings: TrainSettings, n_images: int) -> None:
        """Raises VitvizError naming the first setting over the cap."""
        for what, value, cap in (("images", n_images, self.images), ("latents", settings.latents, self.latents),
                                 ("epochs", settings.epochs, self.epochs)):
            if cap is not None and value is not None and value > cap:
                raise VitvizError(f"{value} {what} is more than this server trains at once (at most {cap} {what}): "
                                  f"use fewer, or `python -m vitviz features train` on your own machine.")

    def text(self) -> str:
        """``"16 images, 1024 latents, 100 epochs (or until converged: at most 50,000 steps)"``."""
        from .sae import Convergence

        epochs = (f"{self.epochs} epochs (or until converged: at most {Convergence().max_steps:,} steps)"
                  if self.epochs is not None else None)
        return ", ".join(f"{v} {k}" for k, v in (("images", self.images), ("latents", self.latents)) if v is not None
                         ) + (f", {epochs}" if epochs else "")


# A shared server: a run at the cap is 100 passes over at most 16 images' tokens, or until converged at most
# Convergence.max_steps steps (the model runs once either way); the weights of 1024 latents of a D = 1024 model are
# 8 MB (24 MB with Adam's state). Every run also holds one of the server's run slots (VITVIZ_MAX_RUNS).
SHARED_CAP = SizeCap(images=16, latents=1024, epochs=100)


def default_layer(num_layers: int) -> int:
    """1-based: three quarters of the way up (layer 9 of 12, the layer the guide's `features train` example reads)."""
    return max(1, round(0.75 * num_layers))


def default_settings(lens, layer: int | None = None, point: str = "resid_post") -> TrainSettings:
    """The settings the page starts from: :data:`DEFAULT_LATENTS` latents, k = :data:`DEFAULT_TOPK`, trained until
    converged in :data:`DEFAULT_BATCH_TOKENS`-token steps, at ``layer`` (1-based; default :func:`default_layer`)."""
    return TrainSettings(point=point, layer=default_layer(lens.num_layers) if layer is None else int(layer),
                         latents=DEFAULT_LATENTS, topk=DEFAULT_TOPK, epochs=DEFAULT_EPOCHS,
                         batch_tokens=DEFAULT_BATCH_TOKENS)


@dataclass(frozen=True)
class TrainedSAE:
    """An SAE trained by :func:`train_small`.

    Attributes:
        sae: on the CPU; ``sae.info`` is its sae.json (model, point, layer, images, metrics).
        zip: the folder ``features train`` writes, zipped: ``FOLDER/sae.safetensors`` and ``FOLDER/sae.json``
            (the resume checkpoint left out: the run is finished). Unzipped, :func:`vitviz.features.load_sae` reads it.
        folder: the folder's name inside the zip.
        sha256: the zip's hash (names this SAE in caches).
    """

    sae: SAE
    zip: bytes
    folder: str
    sha256: str


def train_small(lens, images: Sequence, settings: TrainSettings,
                progress: Callable[[float, dict], None] | None = None, cap: SizeCap = SizeCap()) -> TrainedSAE:
    """Train ``settings`` on ``images`` in a temporary folder (:func:`vitviz.features.train.train`: the model runs
    once, the tokens are held in memory for the later epochs).

    Args:
        images: paths, :class:`vitviz.io.inputs.ImageFile` or :class:`vitviz.io.images.LoadedImage` (named by
            ``.name``); ``settings.batch_size`` is replaced by the set's size, up to :data:`MAX_BATCH_IMAGES`.
        progress: ``fn(fraction done, the last step's metrics)`` after each image batch (``explained_variance``,
            ``l0``, ``step``, ...); the fraction is epochs done / epochs, or for a run until converged steps done /
            the fewest steps such a run takes (:class:`vitviz.features.sae.Convergence`), at most 1. An exception it
            raises stops the run and nothing is kept.
        cap: the size cap (:data:`SHARED_CAP` on a shared server).

    Raises:
        VitvizError: a setting over the cap, or one that does not fit the model (the sentence names it).
    """
    from dataclasses import replace

    from .data import check_point
    from .sae import Convergence

    if not images:
        raise VitvizError("no images to train on: add images in the sidebar.")
    cap.check(settings, len(images))
    check_point(lens, settings.point, settings.layer)
    settings = replace(settings, batch_size=min(len(images), MAX_BATCH_IMAGES))
    settings.check()
    per_epoch = -(-len(images) // settings.batch_size)

    def fraction(done: int, metrics: dict) -> float:
        if settings.epochs is None:
            return min(metrics["step"] / Convergence().min_steps, 1.0)
        return done / (per_epoch * settings.epochs)

    callback = None if progress is None else (lambda done, metrics: progress(fraction(done, metrics), metrics))
    folder = f"sae-layer{settings.layer}-{settings.latents}x{settings.topk}"
    with tempfile.TemporaryDirectory(prefix="vitviz-sae-") as tmp:
        out = Path(tmp) / folder
        sae = train(lens, list(images), settings, out, progress=False, callback=callback)
        data = folder_zip(out, folder, [SAE_WEIGHTS, SAE_INFO])
    return TrainedSAE(sae, data, folder, hashlib.sha256(data).hexdigest())


def folder_zip(folder: str | Path, name: str, files: Sequence[str]) -> bytes:
    """``files`` of ``folder`` in a zip, under the folder ``name`` (stored, not compressed: float weights barely
    shrink)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for f in files:
            z.write(Path(folder) / f, f"{name}/{f}")
    return buffer.getvalue()
