"""Several models' per-head statistics side by side: read ``vitviz stats`` tables, average over images.

A stats table (``DIR/stats.parquet``) has one row per (image, model, layer, head); layers and
heads count from 0 there, as in every array vitviz writes. This module checks such tables at
the boundary (one sentence per bad file) and reduces them to what the ViT paper's Fig. 7 right
plots: per (model, layer, head) the mean over images and its spread, per (model, layer) the mean
over heads.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import OptionError, VitvizError, first_line
from ..sources.names import canonical_model_name
from .stats import STATS_COLUMNS as COLUMNS

STATS_NAME = "stats.parquet"
KEYS = ["image", "model", "layer", "head"]
# Text columns as categories: 10 000 images of ViT-B are 1.4 M rows, 265 MiB with the names as Python
# strings and 70 MiB as categories (benchmarks/compare_tables.py).
DTYPES = {column: "category" if dtype == "str" else dtype for column, dtype in COLUMNS.items()}


@dataclass(frozen=True)
class Statistic:
    """One per-head statistic of a stats table.

    Attributes:
        column: its column in ``stats.parquet``.
        label: what a reader of the paper calls it (axis titles, pickers).
        unit: what the numbers are in, for axis titles and tables.
    """

    column: str
    label: str
    unit: str

    @property
    def axis_title(self) -> str:
        return f"{self.label} ({self.unit})"


STATISTICS = {s.column: s for s in (
    Statistic("mean_distance", "mean attention distance", "pixels"),
    Statistic("mean_distance_with_prefix", "mean attention distance, prefix rows not renormalised", "pixels"),
    Statistic("entropy", "attention entropy", "nats"),
    Statistic("cls_focus", "CLS focus", "0 = uniform, 1 = one patch"),
    Statistic("prefix_received", "attention received by prefix tokens", "share of attention"),
)}


class StatsTableError(VitvizError):
    """A file that is not a usable ``vitviz stats`` table; the message names the file."""


def read_stats_table(source: bytes | str | Path, name: str | None = None, limit_bytes: int | None = None) -> pd.DataFrame:
    """One stats table, checked: Parquet bytes (an upload) or a path to a ``.parquet`` file or a stats folder.

    Args:
        source: the file's bytes, a ``stats.parquet`` path, or the ``--out`` folder holding one.
        name: the file name as the user knows it (defaults to the path).
        limit_bytes: refuse a table whose footer declares more than this in memory (see
            :func:`vitviz.sources.declared.check_parquet`); None: the server's budget (``VITVIZ_CACHE_MB``).

    Returns:
        The table with exactly :data:`vitviz.analyses.stats.STATS_COLUMNS` in their dtypes (layer and head 0-based).

    Raises:
        StatsTableError: not Parquet, larger than the budget, a column missing or of the wrong kind, a
            negative layer or head, or one (image, model, layer, head) given twice.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..sources.declared import open_user_table

    try:
        # The footer first: a few kilobytes may declare hundreds of millions of run-length-encoded rows.
        opened, metadata, name = open_user_table(source, STATS_NAME, "stats", name, limit_bytes)
    except VitvizError as exc:
        raise StatsTableError(str(exc)) from exc
    try:
        # The columns before the reader: pyarrow's read_dictionary names a column it cannot find with a bare
        # KeyError (b'image'), not a sentence.
        _check_columns(metadata.schema.to_arrow_schema().names, name)
        handle = pq.ParquetFile(opened, metadata=metadata,
                                read_dictionary=[c for c, d in DTYPES.items() if d == "category"])
        batches = list(handle.iter_batches(columns=list(COLUMNS)))  # row group by row group: no second copy
        table = (pa.Table.from_batches(batches) if batches else handle.read(columns=list(COLUMNS))).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise StatsTableError(f"{name}: not a Parquet file ({first_line(exc)}); expected the stats.parquet "
                              "that `python -m vitviz stats --out DIR` writes.") from exc
    return check_stats_table(table, name)


def _check_columns(present, name: str) -> None:
    missing = [c for c in COLUMNS if c not in set(present)]
    if missing:
        raise StatsTableError(f"{name}: not a vitviz stats table: it lacks the column"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} (expected the "
                              "stats.parquet that `python -m vitviz stats --out DIR` writes).")


def stats_path(source: str | Path) -> Path:
    """The ``stats.parquet`` a path names: the file itself, or the one in a ``--out`` folder."""
    path = Path(source).expanduser()
    return path / STATS_NAME if path.is_dir() else path


def check_stats_table(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """A table with the stats columns (e.g. made in the app) checked and typed as :func:`read_stats_table` does."""
    _check_columns(table.columns, name)
    for column, dtype in COLUMNS.items():
        integer = dtype.startswith("int")
        fits = pd.api.types.is_integer_dtype if integer else pd.api.types.is_numeric_dtype
        if dtype != "str" and not fits(table[column]):
            raise StatsTableError(f"{name}: column {column} holds {table[column].dtype}, not "
                                  f"{'integers' if integer else 'numbers'}; is this a vitviz stats table?")
    table = table[list(COLUMNS)].astype(DTYPES)
    for column in ("layer", "head"):
        if (table[column] < 0).any():
            raise StatsTableError(f"{name}: column {column} has negative values; layers and heads count from 0.")
    repeated = int(table.duplicated(KEYS).sum())
    if repeated:
        raise StatsTableError(f"{name}: {repeated} rows repeat an (image, model, layer, head) given before; "
                              "a stats table has one row per image, layer and head.")
    return table.reset_index(drop=True)


def combine(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Checked tables by source name -> one table; a model found in several sources is told apart.

    The same model name in two files (two runs of one model on other images) becomes
    ``"model (source)"`` in each, so their rows are never averaged together unnoticed. Names are
    compared in their canonical form (:func:`vitviz.sources.names.canonical_model_name`).
    """
    if not tables:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in DTYPES.items()})
    tables = {source: _canonical(table) for source, table in tables.items()}
    sources: dict[str, list[str]] = {}
    for source, table in tables.items():
        for model in table["model"].unique():
            sources.setdefault(model, []).append(source)
    parts = []
    for source, table in tables.items():
        renamed = {m: f"{m} ({source})" for m in table["model"].unique() if len(sources[m]) > 1}
        parts.append(table.assign(model=table["model"].astype(str).replace(renamed)) if renamed else table)
    return pd.concat(parts, ignore_index=True).astype(DTYPES)


def _canonical(table: pd.DataFrame) -> pd.DataFrame:
    names = {m: canonical_model_name(m) for m in table["model"].astype(str).unique()}
    if all(k == v for k, v in names.items()):
        return table
    return table.assign(model=table["model"].astype(str).map(names))


def head_summary(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """Per (model, layer, head): mean, standard deviation and count over images of one statistic.

    Args:
        table: a checked stats table (see :func:`read_stats_table`, :func:`combine`).
        statistic: a column of :data:`STATISTICS`.

    Returns:
        Columns model, layer, head (0-based), mean, std (over images, ddof=0 as on the attention
        distance page: 0 for one image), n_images (images with a value: NaN, e.g. CLS focus of a
        model without CLS, is left out). Models in first-seen order, then layer, head.
    """
    if statistic not in STATISTICS:
        raise OptionError(f"statistic must be one of {list(STATISTICS)}, not {statistic!r}")
    grouped = table.groupby(["model", "layer", "head"], sort=False, observed=True)[statistic]
    out = grouped.agg(mean="mean", std=lambda v: v.std(ddof=0), n_images="count").reset_index()
    out["n_images"] = out["n_images"].astype("int64")
    return _in_model_order(out, table)


def layer_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (model, layer): the mean over heads of the per-head means, from :func:`head_summary`.

    Returns:
        Columns model, layer (0-based), depth (the model's layer count L), mean, n_heads.
        Heads without a value (NaN) are left out of the mean.
    """
    out = heads.groupby(["model", "layer"], sort=False, observed=True)["mean"].agg(mean="mean", n_heads="count") \
        .reset_index()
    depth = heads.groupby("model", sort=False, observed=True)["layer"].max() + 1
    out.insert(2, "depth", out["model"].map(depth).astype("int64"))
    out["n_heads"] = out["n_heads"].astype("int64")
    return _in_model_order(out, heads)


def model_overview(heads: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Per model, in plotting order: ``layers`` (its depth L) and ``images`` (the most images any head has a value for).

    heads, layers: :func:`head_summary` and :func:`layer_summary` of one statistic; ``images`` 0
    means the model has no value of it (CLS focus of a model without CLS).
    """
    depth = layers.groupby("model", sort=False, observed=True)["depth"].first()
    images = heads.groupby("model", sort=False, observed=True)["n_images"].max()
    out = pd.DataFrame({"layers": depth.astype("int64"), "images": images.reindex(depth.index).astype("int64")})
    out.index = out.index.astype(str)
    return out


def _in_model_order(out: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    order = {m: i for i, m in enumerate(like["model"].unique())}
    keys = [c for c in ("layer", "head") if c in out]
    return out.sort_values(keys).sort_values("model", key=lambda m: m.astype(str).map(order), kind="stable") \
        .reset_index(drop=True)


def relative_depth(layer: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Layer index (0-based) -> (layer + 1) / L: the last layer of every model at 1."""
    return (np.asarray(layer) + 1) / np.asarray(depth)
