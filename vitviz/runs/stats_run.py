"""Engines of ``python -m vitviz stats``: the same per-batch reduction fed by a DataLoader or by Ray Data.

Both decode files with :func:`vitviz.io.images.load_image` (so the same rules and messages as
``analyze``), preprocess with the model's own data config, run each batch through
:func:`vitviz.capture.capture` and reduce it with :func:`vitviz.analyses.stats.capture_tables`; the caller
writes each finished batch (:class:`FileBatch`).
"""
from __future__ import annotations

import logging
import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import torch

from ..capture import Capture, capture
from ..errors import VitvizError
from ..io.images import load_image
from ..sources.preprocess import preprocess
from ..io.inputs import ImageFile
from ..analyses.stats import SINK_COLUMNS, STATS_COLUMNS, StatsTables, capture_tables, typed_table


def default_workers() -> int:
    """Decoding processes: one core is left to the model."""
    return max(1, min(8, len(os.sched_getaffinity(0)) - 1))


@dataclass
class FileBatch:
    """One batch of files after decoding and reduction.

    Attributes:
        files: how many files the batch covered (good and bad).
        tables: the rows of its good images (none when every file was bad).
        bad: (name, reason) of files that could not be used.
        notes: (name, note) about conversions (transparency, 16-bit, first frame of an animation).
    """

    files: int
    tables: StatsTables | None
    bad: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)


def decode(file: ImageFile, data_config: dict) -> tuple[torch.Tensor | None, str | None, list[str]]:
    """One file to its model input (3, H, W): (tensor, None, notes), or (None, reason, []) for a bad file."""
    try:
        image = load_image(file.path, file.name)
        return preprocess([image.image], data_config).tensor[0], None, image.notes
    except VitvizError as exc:
        return None, getattr(exc, "reason", str(exc)), []


class ImageFiles(torch.utils.data.Dataset):
    """Files decoded and preprocessed in DataLoader workers; item i: (name, tensor or None, reason, notes)."""

    def __init__(self, files: list[ImageFile], data_config: dict):
        self.files, self.data_config = files, data_config

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return (self.files[i].name, *decode(self.files[i], self.data_config))


def _collate(items):
    return items  # good and bad files are split by the consumer; tensors are stacked there


def _quiet_worker(_):
    # The parent turns SIGTERM into an exception and handles Ctrl-C; a worker just stops, without a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _capture(loaded, items) -> tuple[list, Capture | None]:
    """The forward of a batch's good files: (items, Capture or None when every file was bad)."""
    good = [tensor for _, tensor, _, _ in items if tensor is not None]
    return items, capture(loaded.model, torch.stack(good)) if good else None


def _tables(items, out: Capture | None, model: str) -> FileBatch:
    """A captured batch reduced to rows; its attention is dropped on return."""
    names = [name for name, tensor, _, _ in items if tensor is not None]
    return FileBatch(files=len(items), tables=None if out is None else capture_tables(out, names, model),
                     bad=[(name, reason) for name, tensor, reason, _ in items if tensor is None],
                     notes=[(name, note) for name, _, _, notes in items for note in notes])


def _reduce(loaded, items, model: str) -> FileBatch:
    return _tables(*_capture(loaded, items), model)


def run_local(loaded, files: list[ImageFile], model: str, batch_size: int, workers: int) -> Iterator[FileBatch]:
    """Batches of ``files`` in order: decoded by ``workers`` processes (0: in this one), captured and reduced here.

    A batch is reduced in a thread while the next one runs through the model (on a GPU the two
    overlap fully), so at most two batches' attention are held at once.
    """
    loader = torch.utils.data.DataLoader(
        ImageFiles(files, loaded.data_config), batch_size=batch_size, num_workers=workers, collate_fn=_collate,
        worker_init_fn=_quiet_worker if workers else None, prefetch_factor=2 if workers else None)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitviz-reduce") as reducer:
        pending = None
        for items in loader:
            captured = _capture(loaded, items)
            if pending is not None:
                yield pending.result()
            pending = reducer.submit(_tables, *captured, model)
        if pending is not None:
            yield pending.result()


# ---- Ray Data -------------------------------------------------------------------------------------------

RAY_MISSING = ("--engine ray needs Ray Data: in the vitviz folder run .venv/bin/pip install -e '.[ray]' "
               "(or pip install 'ray[data]').")


_RAY_COLUMNS = STATS_COLUMNS | SINK_COLUMNS | {"reason": "str", "kind": "str", "batch": "str"}


def _ray_schema():
    import pyarrow as pa

    # Explicit types: inferred ones turn a string column with gaps into Ray's opaque Python-object type.
    return pa.schema([(n, pa.string() if t == "str" else pa.float64()) for n, t in _RAY_COLUMNS.items()]
                     + [("files", pa.int64())])


def _rows(result: FileBatch):
    """A FileBatch as one Arrow table Ray can carry: ``kind`` (stats, sinks, bad, note) over both tables' columns,
    ``batch`` (an id) and ``files`` (the batch's file count) on every row."""
    import pyarrow as pa

    frames = [pd.DataFrame({"image": [n for n, _ in pairs], "reason": [r for _, r in pairs], "kind": kind})
              for kind, pairs in (("bad", result.bad), ("note", result.notes))]
    if result.tables is not None:
        frames += [result.tables.stats.assign(kind="stats"), result.tables.sinks.assign(kind="sinks")]
    frame = pd.concat([f for f in frames if len(f)], ignore_index=True).reindex(columns=list(_RAY_COLUMNS))
    # Integers as float64: the rows of other kinds hold NaN there.
    frame = frame.astype({n: object if t == "str" else "float64" for n, t in _RAY_COLUMNS.items()})
    frame = frame.assign(batch=uuid.uuid4().hex, files=result.files)
    return pa.Table.from_pandas(frame, schema=_ray_schema(), preserve_index=False)


def _from_rows(frame: pd.DataFrame) -> FileBatch:
    """The inverse of :func:`_rows`, for the rows of one batch (on the driver)."""
    def table(kind, columns):
        rows = frame[frame["kind"] == kind]
        return typed_table(rows[list(columns)].reset_index(drop=True), columns)

    def pairs(kind):
        return list(frame.loc[frame["kind"] == kind, ["image", "reason"]].itertuples(index=False, name=None))

    stats = table("stats", STATS_COLUMNS)
    return FileBatch(files=int(frame["files"].iloc[0]),
                     tables=StatsTables(stats, table("sinks", SINK_COLUMNS)) if len(stats) else None,
                     bad=pairs("bad"), notes=pairs("note"))


class _RayReducer:
    """A Ray Data actor: one model per actor, loaded once; each call reduces one batch of files."""

    def __init__(self, spec, model: str):
        from ..sources.models import load_model

        self.loaded, self.model = load_model(spec), model

    def __call__(self, batch: dict[str, np.ndarray]):
        items = [(name, *decode(ImageFile(Path(path), name), self.loaded.data_config))
                 for path, name in zip(batch["path"], batch["name"])]
        return _rows(_reduce(self.loaded, items, self.model))


def require_ray() -> None:
    """A sentence, not a traceback, when the optional Ray extra is not installed."""
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise VitvizError(RAY_MISSING) from exc


def run_ray(spec, files: list[ImageFile], model: str, batch_size: int, workers: int,
            address: str | None) -> Iterator[FileBatch]:
    """The same batches reduced by a pool of Ray actors (``workers`` of them, a GPU each when CUDA is present).

    Ray Data reads the file list, decodes and reduces in the actors (one model each) and streams each
    batch's rows back here, where they are written exactly as the local engine's.
    """
    require_ray()
    import ray
    import ray.data
    if not ray.is_initialized():
        # Ray's core logs warnings meant for its developers (actor restarts); errors still show.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        ray.init(address=address, num_cpus=None if address else workers, log_to_driver=False,
                 include_dashboard=False, logging_level=logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # vitviz draws its own progress
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True
    gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0  # the cluster's, not this driver's
    items = [{"path": str(f.path), "name": f.name} for f in files]
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // batch_size, 200)))
    ds = ds.map_batches(_RayReducer, fn_constructor_args=(spec, model), batch_size=batch_size,
                        batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers),
                        num_gpus=gpus, num_cpus=1)  # a CPU too: decoding and the reduction run there
    for chunk in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        frame = chunk.to_pandas()  # numpy dtypes: Arrow-backed pandas columns mix badly with all-null ones
        for _, rows in frame.groupby("batch", sort=False):
            yield _from_rows(rows)
