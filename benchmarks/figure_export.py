"""SVG / PDF export cost (issue 34): Plotly's own export (kaleido + the machine's Chromium; a browser started per
file, as the pages do, and kept running with kaleido's sync server) against redrawing the same chart with matplotlib,
and the multi-panel paper figure. Median of REPEATS interleaved runs each; the baseline is matplotlib's SVG of the
same distance chart, measured in the same run.

    .venv/bin/python benchmarks/figure_export.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vitviz.analyses.distance import conv_receptive_field  # noqa: E402
from vitviz.figures.chart_export import chart_file  # noqa: E402
from vitviz.figures.core import distance_scatter, tile_grid_figure  # noqa: E402
from vitviz.figures.paper_figure import MapGroup, MapRow, paper_figure  # noqa: E402
from vitviz.figures.analysis_report import distance_file  # noqa: E402

REPEATS = 3


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    rng = np.random.default_rng(0)
    distance = np.sort(rng.uniform(20, 120, (12, 6)), axis=0)
    chart = distance_scatter(distance, conv_receptive_field(12), uniform=116.5)
    filters = tile_grid_figure(rng.random((28, 14, 14, 3)), [f"PC{i + 1} · 1.0%" for i in range(28)], "filters",
                               columns=7, tile_px=126)
    image = Image.new("RGB", (224, 224), (120, 90, 60))
    rows = [MapRow(f"layer {l}", rng.random((6, 16, 16)), [f"head {h + 1}" for h in range(6)]) for l in (1, 4, 8, 12)]
    work = {
        "matplotlib redraw, distance chart, svg (baseline)": lambda: distance_file(distance, None, "svg"),
        "matplotlib redraw, distance chart, pdf": lambda: distance_file(distance, None, "pdf"),
        "kaleido per file (browser started), distance chart, svg": lambda: chart_file(chart, "svg"),
        "kaleido per file (browser started), distance chart, pdf": lambda: chart_file(chart, "pdf"),
        "kaleido per file (browser started), filter grid, svg": lambda: chart_file(filters, "svg"),
        "paper figure, 4 layers x 6 heads, compose + svg": lambda: paper_figure(
            image, [MapGroup("layers", rows, "attention weight")], title="t").file("svg"),
        "paper figure, 4 layers x 6 heads, compose + pdf": lambda: paper_figure(
            image, [MapGroup("layers", rows, "attention weight")], title="t").file("pdf"),
    }
    times = {k: [] for k in work}
    for _ in range(REPEATS):
        for name, fn in work.items():
            times[name].append(timed(fn))

    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        chart_file(chart, "svg")  # the server's browser starts on the first call
        times["kaleido sync server (browser kept), distance chart, svg"] = [
            timed(lambda: chart_file(chart, "svg")) for _ in range(REPEATS)]
        times["kaleido sync server (browser kept), distance chart, pdf"] = [
            timed(lambda: chart_file(chart, "pdf")) for _ in range(REPEATS)]
    finally:
        kaleido.stop_sync_server(silence_warnings=True)

    base = statistics.median(times["matplotlib redraw, distance chart, svg (baseline)"])
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}; median of {REPEATS}")
    print("| export | median s | / baseline |\n|---|---|---|")
    for name, values in times.items():
        m = statistics.median(values)
        print(f"| {name} | {m:.2f} | {m / base:.1f} |")


if __name__ == "__main__":
    main()
