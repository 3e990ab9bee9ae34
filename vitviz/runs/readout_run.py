"""The readout over an image set, batch by batch, here or on Ray (:mod:`vitviz.runs.engines`): each batch's direct
readout table, per-head patch maps and logit-lens table (``python -m vitviz readout``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class ReadoutBatch:
    """One batch's results: ``table`` (:meth:`vitviz.Readout.table`, images numbered within the batch),
    ``maps`` (b, L, H, gh, gw) float32, ``lens`` (:meth:`vitviz.LogitLens.table`, or None without a head),
    ``residual`` (b,) |total − parts|, ``target`` (the bound target's description and text)."""

    table: pd.DataFrame
    maps: np.ndarray
    lens: pd.DataFrame | None
    residual: np.ndarray
    target: dict
    target_text: str


@dataclass(frozen=True)
class ReadoutWork:
    """The per-batch function: the readout of ``target_class`` (None: each image's top-1; a headless model's pooled
    vector's projection), or of CLIP's score for ``texts`` (each image's best match among them), and, with a head,
    the logit lens's ``top`` classes per layer. Picklable for Ray."""

    target_class: int | None = None
    top: int = 5
    texts: tuple[str, ...] = ()

    def __call__(self, lens, batch) -> ReadoutBatch:
        from .. import residual

        keep = residual.readout_points(lens) + (["resid_post"] if lens.has_head else [])
        trace = lens.trace(batch.x, keep=keep)  # one forward for both readouts
        r = residual.readout(lens, batch.x, residual.target_for(lens, self.target_class, self.texts), trace=trace)
        r.images = list(batch.names)
        lens_table = None
        if lens.has_head:
            ll = residual.logit_lens(lens, batch.x, trace=trace)
            ll.images = list(batch.names)
            lens_table = ll.table(top=self.top)
        return ReadoutBatch(r.table(), r.patch_maps().astype(np.float32), lens_table, np.abs(r.residual),
                            r.target.describe(), r.target.text())
