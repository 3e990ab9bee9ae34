"""The ``similarity`` command's runner: minibatches on the engine (:func:`vitviz.runs.engines.run_batches`), each one
durable. :class:`CKAWork` computes exactly what :func:`vitviz.similarity` adds for the same minibatch; :class:`CKASums`
keeps the running sums on disk so that an interrupted run goes on from the next minibatch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analyses.similarity import MinibatchCKA, minibatch_sums
from .layer_features import features_of, grams, open_features
from .similarity_run import MIN_BATCH, describe

@dataclass(frozen=True)
class SidesSpec:
    """What a worker opens: model A, model B (None: A's within-model map), the point read.

    Attributes:
        a: model A's :class:`vitviz.sources.models.ModelSpec`.
        b: model B's, or None.
        point: a ViT's token point per block.
    """

    a: object
    b: object | None
    point: str

    def open(self) -> "Sides":
        side_a = features_of(open_features(self.a), self.point)
        side_b = side_a if self.b is None else features_of(open_features(self.b), self.point)
        return Sides(side_a, side_b, self)


@dataclass(frozen=True)
class Sides:
    """Both sides of a comparison, loaded (the runner :func:`vitviz.runs.engines.run_batches` hands to
    :class:`CKAWork`; it has no ``loaded``, so the engine gives it decoded images and each side preprocesses its own).

    Attributes:
        a: :class:`LensFeatures` or :class:`CNNFeatures`.
        b: the same kinds; ``a`` itself for the within-model map.
        spec: how a Ray actor opens the same.
    """

    a: object
    b: object
    spec: SidesSpec

    @property
    def same(self) -> bool:
        return self.b is self.a


@dataclass(frozen=True)
class CKAWork:
    """The per-batch function of the ``similarity`` command: both sides' Gram matrices of one minibatch (the
    forwards, :meth:`__call__`), then that minibatch's terms of the sums (:meth:`finish`, with its bootstrap
    replicates): exactly what :func:`similarity` adds for the same minibatch. None for a minibatch with fewer than
    four readable images. The value carries the sides in words (:func:`describe`): a driver on Ray loads no
    model."""

    pooling: str
    kernel: str
    threshold: float
    replicates: int
    seed: int

    def __call__(self, sides: Sides, batch):
        if len(batch.x) < MIN_BATCH:
            return None
        grams_a = grams(sides.a, batch.x, self.pooling, self.kernel, self.threshold)
        grams_b = grams_a if sides.same else grams(sides.b, batch.x, self.pooling, self.kernel, self.threshold)
        return batch.index, grams_a, grams_b, describe(sides.a, sides.b)

    def finish(self, value) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], dict]:
        """(ab, aa, bb) of :func:`vitviz.analyses.similarity.minibatch_sums`, and the sides in words."""
        index, grams_a, grams_b, sides = value
        return minibatch_sums(grams_a, grams_b, sides["same_model"], self.replicates, self.seed, index), sides


class CKASums:
    """The running sums of one run of the command, durable in ``DIR/.vitviz-similarity-parts/sums.npz``: after each
    finished minibatch, the sums of minibatches 0 .. k (added in minibatch order, as :func:`similarity` adds them),
    written whole in place of the previous ones. Its size is that of the sums, whatever the number of images.

    Args:
        folder: the output folder.
        key: the run's settings in one string (models, images, minibatches, point, pooling, kernel, bootstrap): sums of
            another key are another run's and are dropped.
    """

    NAME = "sums.npz"

    def __init__(self, folder: Path, key: str):
        self.folder, self.key = Path(folder) / ".vitviz-similarity-parts", key

    def read(self) -> tuple[dict | None, bool]:
        """(the state :meth:`write` wrote, or None; whether sums of other settings were dropped)."""
        path = self.folder / self.NAME
        if not path.exists():
            return None, False
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            if meta["key"] != self.key:
                self.clear()
                return None, True
            accumulator = MinibatchCKA(*stored["ab"].shape[1:], replicates=stored["ab"].shape[0] - 1)
            accumulator.add(stored["ab"], stored["aa"], stored["bb"], images=meta["images"])
            accumulator.batches = meta["batches"]
        return {"next": meta["next"], "accumulator": accumulator, "sides": meta["sides"],
                "skipped": dict(meta["skipped"])}, False

    def write(self, following: int, accumulator: MinibatchCKA, sides: dict, skipped: dict[str, str]) -> None:
        """The sums of every minibatch before ``following`` (0-based), the sides in words, the files skipped so far."""
        import io

        from ..io.atomic import atomic_write_bytes

        self.folder.mkdir(exist_ok=True)
        meta = {"key": self.key, "next": following, "batches": accumulator.batches, "images": accumulator.images,
                "sides": sides, "skipped": list(skipped.items())}
        buffer = io.BytesIO()
        np.savez(buffer, ab=accumulator.ab, aa=accumulator.aa, bb=accumulator.bb, meta=np.array(json.dumps(meta)))
        atomic_write_bytes(self.folder / self.NAME, buffer.getvalue())

    def clear(self) -> None:
        """Remove the sums and their folder (the result is written, or they were another run's)."""
        (self.folder / self.NAME).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass
