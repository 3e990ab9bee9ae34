"""`python -m vitviz analyze` on 16, 64 and 256 generated images: peak RSS and wall time, with and
without --no-attention (the attention streamed to disk vs left out).

Each run is a fresh process (the whole command: imports, model load, analysis, writing); peak RSS
is its VmHWM. Generated 256x256 noise images; the bundled model by default (offline).
Usage: .venv/bin/python benchmarks/analyze_scaling.py [--counts 16 64 256] [--repeats 3] [--model bundled]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from _memory import cli_in_fresh_process


def make_images(folder: Path, n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = folder / f"img{i:03d}.png"
        if not path.exists():
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def run(images: list[Path], out: Path, model: str, no_attention: bool) -> tuple[float, float, float]:
    """(wall s, peak RSS MiB, npz MiB) of one analyze command."""
    args = ["analyze", *map(str, images), "--out", str(out), "--model", model] + (["--no-attention"] if no_attention else [])
    wall, hwm_kib, _ = cli_in_fresh_process(args)
    hwm = hwm_kib / 1024
    return wall, hwm, (out / "analysis.npz").stat().st_size / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="bundled")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="vitviz-bench-") as tmp:
        folder = Path(tmp) / "images"
        folder.mkdir()
        all_images = make_images(folder, max(args.counts))
        print("| images | attention saved | wall s (median) | peak RSS MiB (median) | npz MiB | runs |")
        print("|---|---|---|---|---|---|")
        for n in args.counts:
            for no_attention in (True, False):
                runs = [run(all_images[:n], Path(tmp) / "out", args.model, no_attention) for _ in range(args.repeats)]
                wall, hwm = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
                print(f"| {n} | {'no' if no_attention else 'yes'} | {wall:.1f} | {hwm:.0f} | {runs[-1][2]:.0f} | "
                      f"{', '.join(f'{r[0]:.1f} s / {r[1]:.0f} MiB' for r in runs)} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
