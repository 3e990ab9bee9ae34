"""One engine for every command that maps a per-batch function over image files: here, or on Ray.

```python
engine = Engine("ray", workers=2)                    # or Engine() (this process), Engine("local", workers=3)
for batch in run_batches(work, lens, files, batch_size=8, engine=engine):
    batch.names, batch.bad, batch.value              # value = work(lens, batch), batches in file order
```

A batch is ``batch_size`` consecutive files of the list (batch ``i`` holds files ``i*B .. i*B+B-1``, also
when batches are skipped to resume), decoded with :func:`vitviz.io.images.load_image` (the same rules and
sentences as ``analyze``) and preprocessed one image at a time with the model's own data config into
:class:`Batch` ``.x`` (B, 3, H, W). The per-batch function ``work(lens, batch)`` runs the model; if it has a
``finish(value)`` method, that CPU-side reduction runs in a thread here while the next batch runs through
the model (so at most two batches' results are held), or in the actor on Ray.

- **local**: this process holds the model; ``workers`` processes decode files (0: this process decodes).
- **ray**: ``workers`` Ray actors, each holding one :class:`vitviz.Lens` (and one GPU when the cluster has
  them), loaded once from the lens's spec; the driver sends file paths and receives each batch's value in
  file order. ``address`` joins a cluster (``ray://head:10001``, ``auto``); without it a local Ray with
  ``workers`` CPUs starts in this process. ``work`` must pickle.

:class:`Parts` is the durable half of a resumable run: every finished batch becomes a group of Parquet part
files renamed into place together, so a batch is all there or absent; a killed run's next run reads them
and skips those images.
"""
from __future__ import annotations

import logging
import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import ImageError, VitvizError

ENGINES = ("local", "ray")
RAY_MISSING = ("--engine ray needs Ray: in the vitviz folder run .venv/bin/pip install -e '.[ray]' "
               "(or pip install 'ray').")


def default_workers() -> int:
    """Decoding processes of the local engine: one core is left to the model."""
    return max(1, min(8, len(os.sched_getaffinity(0)) - 1))


@dataclass(frozen=True)
class Engine:
    """Where the batches run.

    Attributes:
        kind: ``"local"`` (this process) or ``"ray"``.
        workers: local: processes decoding files (0: this process); ray: actors, each holding one model.
        address: ray: the cluster to join (None: a local Ray with ``workers`` CPUs).
    """

    kind: str = "local"
    workers: int = 0
    address: str | None = None

    def check(self) -> "Engine":
        """Refuse settings that cannot run, with the options' names (before any model loads)."""
        if self.kind not in ENGINES:
            raise VitvizError(f"--engine must be one of {', '.join(ENGINES)}, not {self.kind!r}.")
        least = 1 if self.kind == "ray" else 0
        if self.workers < least:
            raise VitvizError(f"--workers must be {least} or more, not {self.workers}.")
        if self.address and self.kind != "ray":
            raise VitvizError("--address is for --engine ray: the Ray cluster to run on.")
        if self.kind == "ray":
            require_ray()
        return self


def require_ray() -> None:
    """A sentence, not a traceback, when the optional Ray extra is not installed."""
    try:
        import ray  # noqa: F401
        import ray.util  # noqa: F401
    except ImportError as exc:
        raise VitvizError(RAY_MISSING) from exc


@dataclass
class Batch:
    """One batch of files, decoded; after the engine ran it, with the per-batch function's value.

    Attributes:
        index: 0-based position of the batch in the whole file list (files ``index * B`` onwards).
        files: how many files the batch covers (good and bad).
        names: the good images' names, in file order.
        x: (B, 3, H, W) float32 model inputs of the good images (None when every file was bad, and once the
            value is computed).
        sha256: each good image's file hash.
        bad: (name, reason) of files that could not be used.
        notes: (name, note) about conversions (transparency, 16-bit, first frame of an animation).
        value: what the per-batch function returned (None for a batch without good images).
    """

    index: int
    files: int
    names: list[str]
    x: Any
    sha256: list[str] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    value: Any = None

    def problems(self) -> list[str]:
        """One sentence per bad file: ``"name: reason"`` (as :class:`vitviz.errors.ImageError` says it)."""
        return [f"{name}: {reason}" for name, reason in self.bad]


def _entry(item) -> tuple[Any, str]:
    """(source, name) of an :class:`vitviz.io.inputs.ImageFile`, a path, a (path, name) pair or a decoded
    :class:`vitviz.io.images.LoadedImage` (the app's uploads)."""
    if isinstance(item, tuple):
        return item
    if hasattr(item, "image") and hasattr(item, "sha256"):
        return item, item.name
    return Path(getattr(item, "path", item)), getattr(item, "name", str(item))


def decode_batch(index: int, entries: Sequence[tuple[Any, str]], data_config: dict) -> Batch:
    """Files to model inputs, one image at a time: bad files are listed, never raised. ``data_config`` None: the
    runner preprocesses itself (two models with their own preprocessing), ``x`` is the decoded RGB images."""
    import torch

    from ..io.images import load_image
    from ..sources.preprocess import preprocess

    tensors, names, hashes, bad, notes = [], [], [], [], []
    for source, name in entries:
        try:
            image = source if not isinstance(source, (str, Path)) else load_image(source, name)
            tensors.append(image.image if data_config is None else preprocess([image.image], data_config).tensor[0])
        except VitvizError as exc:
            bad.append((name, exc.reason if isinstance(exc, ImageError) else str(exc)))
            continue
        names.append(name)
        hashes.append(image.sha256)
        notes += [(name, note) for note in image.notes]
    x = None if not tensors else tensors if data_config is None else torch.stack(tensors)
    return Batch(index, len(entries), names, x, hashes, bad, notes)


def _chunks(files: Sequence, batch_size: int | Sequence[int], skip: Iterable[int]) -> list[tuple[int, list]]:
    entries, skip = [_entry(f) for f in files], set(skip)
    if isinstance(batch_size, int):
        if batch_size < 1:
            raise VitvizError(f"--batch-size must be 1 or more, not {batch_size}.")
        sizes = [batch_size] * -(-len(entries) // batch_size)
    else:
        sizes = list(batch_size)
        if sum(sizes) != len(entries) or min(sizes, default=1) < 1:
            raise ValueError(f"batch sizes {sizes} do not split {len(entries)} files")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(i, entries[s:s + n]) for i, (s, n) in enumerate(zip(starts, sizes)) if i not in skip]


def _data_config(runner) -> dict | None:
    """The preprocessing the engine applies: a Lens's; None for a runner without one (it preprocesses itself)."""
    loaded = getattr(runner, "loaded", None)
    return None if loaded is None else loaded.data_config


def _apply(work, lens, batch: Batch):
    """The per-batch function on a decoded batch (None when it holds no good image)."""
    if batch.x is None:
        return None
    return work(lens, batch)


def _finish(work, value):
    done = getattr(work, "finish", None)
    return value if done is None or value is None else done(value)


def run_batches(work: Callable, lens, files: Sequence, batch_size: int | Sequence[int], engine: Engine = Engine(),
                skip: Iterable[int] = ()) -> Iterator[Batch]:
    """``work(lens, batch)`` over ``files`` in batches of ``batch_size``, yielded in file order with ``.value`` set.

    Args:
        work: the per-batch function (a picklable callable for Ray), optionally with ``finish(value)``.
        lens: a :class:`vitviz.Lens` (local: it runs here; ray: its ``spec`` is loaded in each actor), or for
            ray a :class:`vitviz.sources.models.ModelSpec`. Any other runner without ``loaded`` receives the
            decoded images as ``batch.x`` (a list of RGB PIL images) and, for ray, has a ``spec`` whose
            ``open()`` builds it in each actor.
        batch_size: files per batch, or each batch's count of files in order (they sum to ``len(files)``).
        files: :class:`vitviz.io.inputs.ImageFile`, paths, (path, name) pairs, or decoded images (local only).
        skip: 0-based batch indices already done (resuming): they are neither decoded nor run.
    """
    chunks = _chunks(files, batch_size, skip)
    if not chunks:
        return iter(())
    if engine.kind == "ray":
        return _run_ray(work, getattr(lens, "spec", lens), chunks, engine)
    return _run_local(work, lens, chunks, engine.workers)


# ---- here ------------------------------------------------------------------------------------------------

class _Decoded:
    """A torch Dataset whose item i is chunk i decoded (in DataLoader workers when there are some)."""

    def __init__(self, chunks, data_config: dict):
        self.chunks, self.data_config = chunks, data_config

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> Batch:
        return decode_batch(*self.chunks[i], self.data_config)


def _quiet_worker(_):
    # The parent turns SIGTERM into an exception and handles Ctrl-C; a worker just stops, without a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _as_is(batch: Batch) -> Batch:
    return batch


def _run_local(work, lens, chunks, workers: int) -> Iterator[Batch]:
    import torch

    loader = torch.utils.data.DataLoader(
        _Decoded(chunks, _data_config(lens)), batch_size=None, num_workers=workers, collate_fn=_as_is,
        worker_init_fn=_quiet_worker if workers else None, prefetch_factor=2 if workers else None)
    if getattr(work, "finish", None) is None:
        for batch in loader:
            yield replace(batch, x=None, value=_apply(work, lens, batch))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitviz-finish") as finisher:
        pending = None
        for batch in loader:
            try:
                value = _apply(work, lens, batch)
            except BaseException:
                if pending is not None:  # the batch before is finished: the caller keeps it, then sees the error
                    yield _done(*pending)
                raise
            if pending is not None:
                yield _done(*pending)
            pending = (batch, finisher.submit(_finish, work, value))
        if pending is not None:
            yield _done(*pending)


def _done(batch: Batch, value) -> Batch:
    return replace(batch, x=None, value=value.result())


# ---- Ray -------------------------------------------------------------------------------------------------

class _Worker:
    """A Ray actor: one model (or a runner's models), loaded once from its spec; each call decodes and runs one
    batch."""

    def __init__(self, spec, work):
        from ..lens import Lens
        from ..sources.models import load_model

        self.lens = spec.open() if hasattr(spec, "open") else Lens(load_model(spec))
        self.work = work

    def run(self, index: int, entries: list[tuple[str, str]]) -> Batch:
        batch = decode_batch(index, [(Path(p), n) for p, n in entries], _data_config(self.lens))
        value = _finish(self.work, _apply(self.work, self.lens, batch))
        return replace(batch, x=None, value=_to_cpu(value))


def _to_cpu(value):
    """Tensors of a value leave the actor's device before they travel to the driver."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def start_ray(address: str | None, workers: int) -> None:
    """Join ``address`` or start a local Ray with ``workers`` CPUs (once per process), quietly."""
    require_ray()
    import ray

    if not ray.is_initialized():
        # Ray's core logs warnings meant for its developers (actor restarts); errors still show.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        ray.init(address=address, num_cpus=None if address else workers, log_to_driver=False,
                 include_dashboard=False, logging_level=logging.WARNING)


def _run_ray(work, spec, chunks, engine: Engine) -> Iterator[Batch]:
    start_ray(engine.address, engine.workers)
    import ray
    from ray.util import ActorPool

    gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0  # the cluster's, not this driver's
    # A CPU too: decoding and the reduction run there.
    actor = ray.remote(num_cpus=1, num_gpus=gpus)(_Worker)
    actors = [actor.remote(spec, work) for _ in range(min(engine.workers, len(chunks)))]
    try:
        pool = ActorPool(actors)
        jobs = [(i, [(str(source), name) for source, name in entries]) for i, entries in chunks]
        yield from pool.map(lambda a, job: a.run.remote(*job), jobs)  # in submission order
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, VitvizError):
            raise exc.cause from None  # the user's sentence, not Ray's traceback around it
        raise
    finally:
        for a in actors:  # the next model's actors get their CPUs (a local Ray has only ``workers``)
            ray.kill(a)


# ---- durable parts ---------------------------------------------------------------------------------------

class Parts:
    """A folder of Parquet part files: each finished batch is a group of them, one per kind, renamed into
    place together (the last kind written marks the batch done).

    Args:
        folder: the parts folder (created); e.g. ``DIR/.vitviz-stats-parts``.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(exist_ok=True)

    def write(self, tables: Sequence[tuple[str, Any, Any]]) -> str:
        """Make one batch durable: ``tables`` = (kind, frame or Arrow table, schema or None) in renaming order;
        the files ``<kind>-<id>.parquet`` appear together or not at all. Returns the part id."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..io.atomic import signals_held

        part = uuid.uuid4().hex
        staged = []
        for kind, frame, schema in tables:
            tmp = self.folder / f".{kind}-{part}.tmp"
            table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, schema=schema,
                                                                                     preserve_index=False)
            pq.write_table(table, tmp)
            staged.append((tmp, self.folder / f"{kind}-{part}.parquet"))
        with signals_held():
            for tmp, final in staged:
                os.replace(tmp, final)
        return part

    def done(self, kind: str) -> list[Path]:
        """The finished parts of ``kind`` (sorted by name)."""
        return sorted(self.folder.glob(f"{kind}-*.parquet"))

    def clear(self) -> None:
        """Remove every file in the folder: merged parts, and halves of batches cut short."""
        for leftover in self.folder.iterdir():
            leftover.unlink()

    def close(self) -> None:
        """Remove the folder once it is empty (everything consolidated)."""
        try:
            self.folder.rmdir()
        except OSError:
            pass

