"""``python -m vitviz stats`` on the engine (:mod:`vitviz.runs.engines`): each batch captured and reduced to rows.

Files are decoded by the engine (:func:`vitviz.io.images.load_image`: the same rules and messages as ``analyze``),
each batch runs through :func:`vitviz.analyses.per_image.analysis_trace` (the lens's one forward) and is reduced with
:func:`vitviz.analyses.stats.capture_tables` (here in a thread while the next batch runs through the model, or
in the Ray actor); the caller writes each finished batch (:class:`FileBatch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from ..analyses.stats import StatsTables, capture_tables
from ..io.inputs import ImageFile
from .engines import Engine, run_batches


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


@dataclass(frozen=True)
class StatsWork:
    """The per-batch function of ``stats``: the forward (:meth:`__call__`), then the reduction (:meth:`finish`)."""

    model: str  # the --model string: the tables' model column

    def __call__(self, lens, batch):
        from ..analyses.per_image import analysis_trace

        return batch.names, analysis_trace(lens, batch.x)

    def finish(self, value) -> StatsTables:
        names, out = value
        return capture_tables(out, names, self.model)  # the batch's attention is dropped on return


def _file_batches(batches) -> Iterator[FileBatch]:
    for b in batches:
        yield FileBatch(files=b.files, tables=b.value, bad=b.bad, notes=b.notes)


def run_local(loaded, files: list[ImageFile], model: str, batch_size: int, workers: int) -> Iterator[FileBatch]:
    """Batches of ``files`` in order: decoded by ``workers`` processes (0: in this one), captured and reduced here.

    A batch is reduced in a thread while the next one runs through the model (on a GPU the two
    overlap fully), so at most two batches' attention are held at once.
    """
    from ..lens import Lens

    return _file_batches(run_batches(StatsWork(model), Lens(loaded), files, batch_size, Engine("local", workers)))


def run_ray(spec, files: list[ImageFile], model: str, batch_size: int, workers: int,
            address: str | None) -> Iterator[FileBatch]:
    """The same batches reduced by ``workers`` Ray actors (one model each, a GPU each when the cluster has them),
    streamed back here in file order, where they are written exactly as the local engine's."""
    return _file_batches(run_batches(StatsWork(model), spec, files, batch_size, Engine("ray", workers, address)))
