"""Per-head attention statistics over image sets, reduced batch by batch.

One row per (image, layer, head) of the numbers the app shows per head (mean attention distance,
entropy, CLS focus) plus the attention prefix tokens receive, so that a set of thousands of
images never needs its raw attention kept: each batch is captured, reduced to rows and dropped.
``python -m vitviz stats`` writes these rows to ``stats.parquet``; the compare page reads them.

Columns of the statistics table (:data:`STATS_COLUMNS`):
    image (str): the file as given, or relative to the folder given.
    model (str): the ``--model`` string as given.
    layer, head (int32): 0-based, the npz array indices (the app shows 1-based).
    mean_distance (float64): pixels of the model input, the convention of ``analyze``'s
        ``mean_distance`` (:data:`vitviz.analyses.distance.CONVENTION`: prefix keys dropped, rows renormalised).
    mean_distance_with_prefix (float64): probing-vits' convention: prefix keys dropped, rows *not*
        renormalised, so attention on CLS and registers counts as distance 0.
    entropy (float64): nats, the heads page's :func:`vitviz.analyses.maps.head_entropy` (patch queries over
        patch keys, renormalised, averaged over queries).
    cls_focus (float64): the heads page's :func:`vitviz.analyses.maps.cls_focus` of the CLS row; NaN when the
        model has no CLS.
    prefix_received (float64): share of a patch query's attention on all prefix tokens together,
        averaged over patch queries (0 when there are none).

Columns of the attention-sink table (:data:`SINK_COLUMNS`), one row per sink token per layer as
flagged by :func:`vitviz.analyses.tokens.attention_sinks` (none for a layer without sinks):
    image, model (str); layer (int32, 0-based); token (int32, 0-based index into the full token
    sequence: prefix tokens first, then patches in raster order); share (float64: the token's mean
    share of a query's attention, over heads and all queries); z (float64: its robust z-score).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch
from PIL import Image

from ..lens import Lens
from ..trace import Trace
from .batched import Reductions, batch_sinks, reduce_attention
from .per_image import analysis_trace
from ..sources.preprocess import preprocess
from ..layout import TokenLayout
from ..tensors import to_host

STATISTICS = ("mean_distance", "mean_distance_with_prefix", "entropy", "cls_focus", "prefix_received")
STATS_COLUMNS = {"image": "str", "model": "str", "layer": "int32", "head": "int32"} | {s: "float64" for s in STATISTICS}
SINK_COLUMNS = {"image": "str", "model": "str", "layer": "int32", "token": "int32", "share": "float64", "z": "float64"}


@dataclass
class StatsTables:
    """The rows of one batch (or a whole set): ``stats`` with :data:`STATS_COLUMNS`, ``sinks`` with :data:`SINK_COLUMNS`."""

    stats: pd.DataFrame
    sinks: pd.DataFrame


def per_head_statistics(attention: torch.Tensor | np.ndarray, layout: TokenLayout,
                        reduced: Reductions | None = None) -> dict[str, np.ndarray]:
    """Every statistic of :data:`STATISTICS` for each image, layer and head.

    attention: (B, L, H, N, N) probabilities -> {name: (B, L, H) float64}. ``reduced``: the batch's
    :func:`vitviz.analyses.batched.reduce_attention` with ``scores``, when already taken.
    """
    # One pass over the whole batch, where capture left it (a GPU's attention stays there): only the results move.
    r = reduced or reduce_attention(attention, layout, scores=True)
    return {
        "mean_distance": to_host(r.distance),
        "mean_distance_with_prefix": to_host(r.distance_with_prefix),
        "entropy": to_host(r.entropy),
        "cls_focus": to_host(r.cls_focus),
        "prefix_received": to_host(r.prefix_received),
    }


def statistics_table(attention: torch.Tensor | np.ndarray, layout: TokenLayout, names: list[str],
                     model: str, reduced: Reductions | None = None) -> pd.DataFrame:
    """One row per (image, layer, head) with :data:`STATS_COLUMNS`.

    attention: (B, L, H, N, N) probabilities of B images named ``names``; ``model`` fills the model column;
    ``reduced``: as :func:`per_head_statistics` takes it.
    """
    values = per_head_statistics(attention, layout, reduced)
    B, L, H = values["mean_distance"].shape
    if len(names) != B:
        raise ValueError(f"{len(names)} names for {B} images")
    columns = {
        "image": np.repeat(np.asarray(names, dtype=object), L * H),
        "model": np.full(B * L * H, model, dtype=object),
        "layer": np.tile(np.repeat(np.arange(L, dtype=np.int32), H), B),
        "head": np.tile(np.arange(H, dtype=np.int32), B * L),
    } | {name: v.reshape(-1) for name, v in values.items()}
    return typed_table(pd.DataFrame(columns), STATS_COLUMNS)


def sinks_table(attention: torch.Tensor | np.ndarray, layout: TokenLayout, names: list[str],
                model: str, reduced: Reductions | None = None) -> pd.DataFrame:
    """The attention sinks of every image and layer, one row each, with :data:`SINK_COLUMNS`.

    attention: (B, L, H, N, N) probabilities of B images named ``names``; ``reduced``: the batch's
    :func:`vitviz.analyses.batched.reduce_attention`, when already taken.
    """
    received = (reduced or reduce_attention(attention, layout)).received
    rows = []
    for name, sinks in zip(names, batch_sinks(received, layout)):
        for layer, tokens in enumerate(sinks.sinks):
            for token in tokens:
                rows.append((name, model, layer, int(token), sinks.received[layer, token], sinks.z[layer, token]))
    return typed_table(pd.DataFrame(rows, columns=list(SINK_COLUMNS)), SINK_COLUMNS)


def batch_tables(loaded, inputs: torch.Tensor, names: list[str], model: str) -> StatsTables:
    """Capture one batch and reduce it to rows; the attention is dropped on return.

    Args:
        loaded: a :class:`vitviz.sources.models.LoadedModel`.
        inputs: (b, 3, H, W) normalised model input (:func:`vitviz.sources.preprocess.preprocess`).
        names: the b image names.
        model: the model string written in the ``model`` column.
    """
    return capture_tables(analysis_trace(Lens(loaded), inputs), names, model)


def capture_tables(out: Trace, names: list[str], model: str) -> StatsTables:
    """The rows of one captured batch of images named ``names`` (``model`` fills the model column)."""
    attention = out.stack("attn")
    reduced = reduce_attention(attention, out.layout, scores=True)
    return StatsTables(stats=statistics_table(attention, out.layout, names, model, reduced),
                       sinks=sinks_table(attention, out.layout, names, model, reduced))


def table_for_images(loaded, images: list[Image.Image], names: list[str], batch_size: int = 8,
                     progress: Callable[[int, int], None] | None = None, model: str | None = None) -> pd.DataFrame:
    """The statistics table of decoded RGB images, ``batch_size`` at a time.

    Args:
        loaded: a :class:`vitviz.sources.models.LoadedModel`.
        images, names: the images and their names (the ``image`` column).
        batch_size: images per forward pass.
        progress: called as ``progress(done, total)`` after each batch.
        model: the ``model`` column; default the model's spec name.
    """
    if len(images) != len(names):
        raise ValueError(f"{len(names)} names for {len(images)} images")
    model = loaded.spec.name if model is None else model
    parts = []
    for start in range(0, len(images), batch_size):
        batch = preprocess(images[start:start + batch_size], loaded.data_config)
        parts.append(batch_tables(loaded, batch.tensor, names[start:start + batch_size], model).stats)
        if progress:
            progress(min(start + batch_size, len(images)), len(images))
    return pd.concat(parts, ignore_index=True) if parts else empty_table(STATS_COLUMNS)


def empty_table(columns: dict[str, str]) -> pd.DataFrame:
    """A table with no rows and the given column dtypes."""
    return typed_table(pd.DataFrame({name: [] for name in columns}), columns)


def typed_table(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``frame`` with the column dtypes of a column spec (:data:`STATS_COLUMNS`, :data:`SINK_COLUMNS`)."""
    # "str" stays numpy object: pandas 3's default string dtype would differ between an empty and a full table.
    return frame.astype({name: object if dtype == "str" else dtype for name, dtype in columns.items()})


class LayerHeadSummary:
    """Mean and spread of each statistic per (model, layer, head), added up table part by table part.

    Memory holds one row per (model, layer, head) whatever the number of images.
    """

    def __init__(self):
        self.sums: pd.DataFrame | None = None

    def add(self, table: pd.DataFrame) -> None:
        """Add rows with :data:`STATS_COLUMNS`."""
        values = table[list(STATISTICS)]
        part = pd.concat([values.assign(n=1.0), (values ** 2).add_suffix("_sq")], axis=1)
        part[["model", "layer", "head"]] = table[["model", "layer", "head"]]
        part = part.groupby(["model", "layer", "head"]).sum(min_count=1)
        self.sums = part if self.sums is None else self.sums.add(part, fill_value=0)

    def result(self) -> pd.DataFrame:
        """Index (model, layer, head); columns ``images`` and ``<statistic>_mean`` / ``<statistic>_std``
        (standard deviation over images, ddof 0)."""
        s = self.sums
        if s is None:
            return pd.DataFrame()
        out = pd.DataFrame({"images": s["n"].astype(int)}, index=s.index)
        for name in STATISTICS:
            mean = s[name] / s["n"]
            out[f"{name}_mean"] = mean
            out[f"{name}_std"] = np.sqrt(np.maximum(s[f"{name}_sq"] / s["n"] - mean ** 2, 0))
        return out
