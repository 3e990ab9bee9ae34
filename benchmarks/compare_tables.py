"""The Compare models page's cost on large stats tables: reading and checking, then averaging.

For a synthetic ViT-B-shaped table (12 layers x 12 heads) of B images, prints
  plain      pandas.read_parquet of the file (the floor),
  checked    vitviz.analyses.compare.read_stats_table (columns, dtypes, negative indices, repeated rows),
  summary    head_summary + layer_summary of one statistic (what a statistic switch recomputes),
the ratio checked / plain, the table's size in memory as the byte-bounded store weighs it, and
peak extra RSS of checked read + summary, measured in a fresh subprocess per size.

Usage:
    .venv/bin/python benchmarks/compare_tables.py [--images 1000 10000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _memory import peak_extra_mib  # noqa: E402
from test_compare import stats_table  # noqa: E402

from vitviz.analyses.compare import head_summary, layer_summary, read_stats_table  # noqa: E402

LAYERS, HEADS, REPEATS = 12, 12, 3


def _median_s(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak(path: str) -> None:
    """Child process: peak extra RSS of the page's work on one file, printed as JSON."""
    mib = peak_extra_mib(lambda: layer_summary(head_summary(read_stats_table(path), "mean_distance")))
    print(json.dumps({"peak_mib": mib}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--peak-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_of:
        return _peak(args.peak_of)
    print("| images | rows | file MiB | plain s | checked s | checked / plain | summary s | in memory MiB | peak extra MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for images in args.images:
            path = Path(folder) / f"stats_{images}.parquet"
            values = np.random.default_rng(0).random((images, LAYERS, HEADS)) * 100
            stats_table("vit_base_patch16_224", values).to_parquet(path, index=False)
            plain = _median_s(lambda: pd.read_parquet(path))
            checked = _median_s(lambda: read_stats_table(path))
            table = read_stats_table(path)
            summary = _median_s(lambda: layer_summary(head_summary(table, "mean_distance")))
            held = table.memory_usage(deep=True).sum() / 2**20
            child = subprocess.run([sys.executable, __file__, "--peak-of", str(path)], capture_output=True,
                                   text=True, check=True)
            peak = json.loads(child.stdout.strip().splitlines()[-1])["peak_mib"]
            print(f"| {images} | {len(table)} | {path.stat().st_size / 2**20:.1f} | {plain:.2f} | {checked:.2f} | "
                  f"**{checked / plain:.2f}** | {summary:.2f} | {held:.0f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
