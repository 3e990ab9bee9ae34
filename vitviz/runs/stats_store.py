"""The files of ``python -m vitviz stats``: batches written durably as they finish, tables whole.

Every finished batch becomes a pair of Parquet part files in ``DIR/.vitviz-stats-parts/``
(renamed into place together, so a batch is either all there or absent). Consolidation streams
the previous ``stats.parquet`` / ``sinks.parquet`` and the parts into new tables, renames them
into place and only then deletes the parts; the tables record which parts they hold, so a
consolidation cut short is never counted twice. An interrupted run therefore leaves a valid
table of what finished, and the next run with the same DIR skips those images.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..sources.declared import check_parquet
from ..io.atomic import signals_held
from ..settings import Settings
from .engines import Parts
from ..analyses.stats import SINK_COLUMNS, STATS_COLUMNS, LayerHeadSummary, StatsTables

STATS_NAME, SINKS_NAME, SUMMARY_NAME = "stats.parquet", "sinks.parquet", "summary.json"
PARTS_DIR = ".vitviz-stats-parts"
_PARTS_KEY = b"vitviz_parts"
_ROWS_PER_GROUP = 1 << 17


def _schema(columns: dict[str, str]) -> pa.Schema:
    types = {"str": pa.string(), "int32": pa.int32(), "float64": pa.float64()}
    return pa.schema([(name, types[dtype]) for name, dtype in columns.items()])


STATS_SCHEMA, SINKS_SCHEMA = _schema(STATS_COLUMNS), _schema(SINK_COLUMNS)


class StatsStore:
    """``stats.parquet``, ``sinks.parquet`` and their part files in one output folder.

    Args:
        folder: the output folder (exists and is writable, see :func:`vitviz.io.output.check_writable`).
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.store = Parts(folder / PARTS_DIR)
        self.parts = self.store.folder

    def write_batch(self, tables: StatsTables) -> None:
        """Make one batch's rows durable: both part files appear together or not at all."""
        # sinks first: a stats part marks the batch done
        self.store.write([("sinks", tables.sinks, SINKS_SCHEMA), ("stats", tables.stats, STATS_SCHEMA)])

    def done_images(self, model: str) -> set[str]:
        """Names of the images whose rows for ``model`` are in the table (call after :meth:`consolidate`)."""
        path = self.folder / STATS_NAME
        if not path.exists():
            return set()
        done: set[str] = set()
        reader = _open(path)
        for batch in reader.iter_batches(columns=["image", "model"]):
            frame = batch.to_pandas()
            done.update(frame.loc[frame["model"] == model, "image"].unique())
        return done

    def consolidate(self) -> LayerHeadSummary:
        """Merge the parts into the tables (streamed, row group by row group); returns the summary of the whole table."""
        summary = LayerHeadSummary()
        held = _parts_held(self.folder / STATS_NAME)
        stats_parts = {p.stem.removeprefix("stats-"): p for p in self.store.done("stats")}
        fresh = sorted(set(stats_parts) - held)
        if not fresh and all((self.folder / name).exists() for name in (STATS_NAME, SINKS_NAME)):
            for batch in _open(self.folder / STATS_NAME).iter_batches():
                summary.add(batch.to_pandas())
            self._remove_parts()
            return summary
        # Every part present is in the new table: fresh ones now, held ones through the previous table.
        listed = sorted(stats_parts)
        for kind, schema, name in (("stats", STATS_SCHEMA, STATS_NAME), ("sinks", SINKS_SCHEMA, SINKS_NAME)):
            sources = [self.folder / name] if (self.folder / name).exists() else []
            sources += [self.parts / f"{kind}-{p}.parquet" for p in fresh]
            _merge(sources, self.parts / f".{name}.tmp", schema, listed,
                   summary.add if kind == "stats" else None)
        with signals_held():
            for name in (SINKS_NAME, STATS_NAME):  # stats last: its part list says what is merged
                os.replace(self.parts / f".{name}.tmp", self.folder / name)
        self._remove_parts()
        return summary

    def _remove_parts(self) -> None:
        self.store.clear()

    def write_summary(self, summary: dict) -> None:
        tmp = self.parts / f".{SUMMARY_NAME}.tmp"
        tmp.write_text(json.dumps(summary, indent=2, default=str))
        os.replace(tmp, self.folder / SUMMARY_NAME)

    def close(self) -> None:
        """Remove the parts folder once everything is consolidated."""
        self.store.close()


def _open(path: Path) -> pq.ParquetFile:
    """A table or part of this folder, its footer checked before any row is read: it is streamed row group
    by row group, so the largest group must fit the memory budget (a few kilobytes of footer can declare
    hundreds of millions of run-length-encoded rows).

    Raises:
        VitvizError: a sentence naming the file, the declared size and the budget.
    """
    limit = Settings.from_env(memory_share=1.0).cache_bytes
    return pq.ParquetFile(path, metadata=check_parquet(path, str(path), limit, largest_group_only=True))


def _parts_held(table: Path) -> set[str]:
    if not table.exists():
        return set()
    meta = _open(table).schema_arrow.metadata or {}
    return set(json.loads(meta.get(_PARTS_KEY, b"[]")))


def _merge(sources: list[Path], target: Path, schema: pa.Schema, parts: list[str], each=None) -> None:
    """Stream ``sources`` into one Parquet file ``target`` that records ``parts``; ``each(frame)`` sees every chunk."""
    schema = schema.with_metadata({_PARTS_KEY: json.dumps(parts).encode()})
    pending, rows = [], 0
    with pq.ParquetWriter(target, schema) as writer:
        for source in sources:
            for batch in _open(source).iter_batches():
                table = pa.Table.from_batches([batch]).cast(schema)
                if each is not None:
                    each(table.to_pandas())
                pending.append(table)
                rows += len(table)
                if rows >= _ROWS_PER_GROUP:
                    writer.write_table(pa.concat_tables(pending))
                    pending, rows = [], 0
        if pending or not sources:
            writer.write_table(pa.concat_tables(pending) if pending else schema.empty_table())
