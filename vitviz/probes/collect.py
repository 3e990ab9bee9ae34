"""``python -m vitviz probe``'s expensive part — every layer's features of every image — through the engine
(:mod:`vitviz.runs.engines`: here or on Ray actors), each finished batch durable as a Parquet part.

The parts live in ``DIR/.vitviz-probe-parts/``: one file per finished batch (columns ``batch`` 0-based,
``image``, ``sha256``, ``features`` = the image's (L, F) float64 features flattened layer by layer), and
``run.json`` saying what they are features of (the backbone's identity with its weights' SHA-256, the
pooling, the batch size). A run killed and started again skips the batches whose part holds exactly that
batch's images and ends with the features — and so the probes — of an uninterrupted run. The command removes
the parts once ``probe.safetensors`` and ``probe.json`` are written.

This module is the command's, not :func:`vitviz.probes.fit`'s: :mod:`vitviz.probes.head` is loaded with every
model (``--head``) and imports the rest of the package, so the package itself never imports the engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import VitvizError
from ..runs.engines import Engine, Parts, run_batches
from .data import LabelError, LabelledImages
from .features import batch_features, check_pooling, check_scope

PARTS_DIR = ".vitviz-probe-parts"
RUN_NAME = "run.json"


@dataclass(frozen=True)
class ProbeFeatures:
    """The per-batch function: (L, B, F) float64 features of every layer (:func:`batch_features`)."""

    pooling: str

    def __call__(self, lens, batch) -> np.ndarray:
        return batch_features(lens, batch.x, self.pooling)


def _schema():
    import pyarrow as pa

    return pa.schema([("batch", pa.int64()), ("image", pa.string()), ("sha256", pa.string()),
                      ("features", pa.list_(pa.float64()))])


class FeatureParts:
    """The finished batches' features of one output folder (see the module docstring)."""

    def __init__(self, folder: Path, run: dict):
        self.store = Parts(Path(folder) / PARTS_DIR)
        path = self.store.folder / RUN_NAME
        if path.exists():
            held = json.loads(path.read_text())
            if held != run:
                differ = "; ".join(f"{k} {held.get(k)!r} there, {run[k]!r} now" for k in run
                                   if k != "model" and held.get(k) != run[k])
                if held.get("model") != run["model"]:
                    differ = "; ".join(filter(None, [f"the model {held.get('model', {}).get('label')!r} there, "
                                                     f"{run['model']['label']!r} now (or its weights)", differ]))
                raise VitvizError(f"{self.store.folder} holds the features of another run ({differ}): give another "
                                  "--out, or the same model, pooling and batch size to go on.")
        else:
            from ..io.atomic import atomic_write_bytes

            atomic_write_bytes(path, json.dumps(run, indent=1).encode())

    def read(self) -> dict[int, tuple[list[str], list[str], np.ndarray]]:
        """batch -> (names, hashes, features (L, b, F)) of every finished part; ``(L, F)`` rows reshaped by
        run.json's layer count."""
        import pyarrow.parquet as pq

        held = {}
        layers = json.loads((self.store.folder / RUN_NAME).read_text())["num_layers"]
        for path in self.store.done("features"):
            table = pq.read_table(path, schema=_schema()).to_pydict()
            rows = np.asarray(table["features"], dtype=np.float64).reshape(len(table["image"]), layers, -1)
            held[table["batch"][0]] = (table["image"], table["sha256"], rows.transpose(1, 0, 2))
        return held

    def write(self, index: int, names: list[str], hashes: list[str], features: np.ndarray) -> None:
        """One batch's (L, b, F) features, durable at once."""
        import pyarrow as pa

        rows = features.transpose(1, 0, 2).reshape(len(names), -1)
        table = pa.table({"batch": [index] * len(names), "image": names, "sha256": hashes,
                          "features": list(rows)}, schema=_schema())
        self.store.write([("features", table, None)])


def collect_features(lens, images: LabelledImages, pooling: str = "cls", batch_size: int = 8,
                     engine: Engine = Engine(), folder: Path | None = None,
                     progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, list[str]]:
    """:func:`vitviz.probes.features.layer_features` through the engine, resumable in ``folder``.

    Args:
        engine: where batches run (:class:`vitviz.runs.engines.Engine`); Ray needs a lens opened from a spec.
        folder: the output folder whose parts hold finished batches (None: nothing is written).
        progress: called with the number of images done (finished before included).

    Returns:
        (features (L, n, F) float64 in the images' order, each image's SHA-256), equal to ``layer_features``'s.

    Raises:
        LabelError: an image that cannot be decoded (named with where it is listed).
        VitvizError: ``folder`` holds the parts of another model, pooling or batch size.
    """
    from .probe import model_identity

    check_pooling(pooling)
    check_scope(lens)
    n = len(images.paths)
    chunks = [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    parts = None if folder is None else FeatureParts(folder, {
        "model": model_identity(lens), "num_layers": lens.num_layers, "pooling": pooling, "batch_size": batch_size})
    held = {} if parts is None else parts.read()
    done = {i: held[i] for i, rows in enumerate(chunks) if i in held and held[i][0] == [images.names[r] for r in rows]}
    entries = [(path, name) for path, name in zip(images.paths, images.names)]
    count = sum(len(chunks[i]) for i in done)
    if progress is not None and count:
        progress(count)
    for batch in run_batches(ProbeFeatures(pooling), lens, entries, batch_size, engine, skip=done):
        for name, reason in batch.bad:
            where = images.where[images.names.index(name, batch.index * batch_size)]
            raise LabelError(f"{where}: {name}: {reason}")
        done[batch.index] = (batch.names, batch.sha256, batch.value)
        if parts is not None:
            parts.write(batch.index, *done[batch.index])
        count += batch.files
        if progress is not None:
            progress(count)
    ordered = [done[i] for i in range(len(chunks))]
    return np.concatenate([f for _, _, f in ordered], axis=1), [h for _, hashes, _ in ordered for h in hashes]


def remove_parts(folder: Path) -> None:
    """The parts of ``folder``, removed once the probe's files are written."""
    parts = Path(folder) / PARTS_DIR
    if parts.is_dir():
        Parts(parts).clear()
        Parts(parts).close()
