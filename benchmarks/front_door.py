"""The front door's costs: ``import vitviz``, ``vitviz.open("bundled")`` cold and warm, and a Trace against the
plain forward it wraps.

Each import / open is timed in a fresh interpreter (``-X importtime`` is not used: wall clock of the statement),
three times, median reported; "cold open" is the first ``vitviz.open`` in a process (torch, timm and the weights
already on disk: the bundled model's converted weights cached), "warm open" a second one in the same process.
Trace rows: median of 5 of ``lens.trace(x, keep=...)`` against ``lens.trace(x, keep="pooled")`` with the library's
fused path allowed (``vitviz.adapters.run(..., fast=True)``), batch 8 at 224 px, in the same process.
Usage: .venv/bin/python benchmarks/front_door.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _in_fresh_process(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {}
    rows["import vitviz"] = [_in_fresh_process("import time; t = time.perf_counter(); import vitviz; "
                                               "print(time.perf_counter() - t)") for _ in range(args.repeats)]
    rows["import vitviz + torch + timm"] = [_in_fresh_process(
        "import time; t = time.perf_counter(); import vitviz, torch, timm; print(time.perf_counter() - t)")
        for _ in range(args.repeats)]
    rows["vitviz.open('bundled'), cold"] = [_in_fresh_process(
        "import vitviz, torch, timm, time; t = time.perf_counter(); vitviz.open('bundled'); "
        "print(time.perf_counter() - t)") for _ in range(args.repeats)]
    rows["vitviz.open('bundled'), warm"] = [_in_fresh_process(
        "import vitviz, time; vitviz.open('bundled'); t = time.perf_counter(); vitviz.open('bundled'); "
        "print(time.perf_counter() - t)") for _ in range(args.repeats)]
    for name, values in rows.items():
        print(f"{name:40s} {statistics.median(values):8.3f} s   (runs: {', '.join(f'{v:.3f}' for v in values)})")

    import torch

    import vitviz
    from vitviz.adapters import run

    lens = vitviz.open("bundled")
    x = torch.randn(8, 3, 224, 224)

    def median(fn, n=5):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    with torch.inference_mode():
        plain = median(lambda: run(lens.model, x, keep=("pooled",), fast=True))
    for keep in (("pooled",), ("attn",), ("attn", "resid_post"), ("q", "k", "v", "attn", "resid_post")):
        t = median(lambda: lens.trace(x, keep=keep))
        print(f"trace keep={keep!s:45s} {t:7.3f} s  = {t / plain:5.2f}x the fused forward ({plain:.3f} s), batch 8")


if __name__ == "__main__":
    main()
