"""Full analysis / plain forward on the bundled model at 224 px, batch 8, for two trees in one run (issue 29: the
Trace keeps only what is asked).

"Full analysis" is what ``analyze`` and the app compute for every batch: preprocessing, the forward that keeps every
layer's attention (:func:`vitviz.analyses.per_image.analyse_images`, before issue 41 ``runs.pipeline.forward``:
token norms, artifacts, sinks, mean distance, and in the
trees before the Trace also every head's entropy and CLS focus) and each image's rollout. "Plain" is preprocessing
and the model's own fused forward. Each tree runs in its own process, rounds alternate between the trees so that load
drift hits both alike, and each round's ratio is full / plain of the same process (interleaved, median of
``--repeats``). One torch thread (``OMP_NUM_THREADS=1``): on a shared 2-core machine two threads wait on each other.
Both the process's CPU time and wall time are reported: on a machine other sessions load, wall time measures the
queue for the cores as much as the work, the CPU time of a one-thread process the work.

    git archive main vitviz | tar -x -C /tmp/trace_before      # the tree before
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/full_analysis_trace.py --before /tmp/trace_before --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(repeats: int) -> None:
    import torch

    from vitviz.analyses.rollout import rollout
    from vitviz.io.images import load_image
    try:
        from vitviz.analyses.per_image import analyse_images as forward
    except ImportError:  # a tree before issue 41
        from vitviz.runs.pipeline import forward
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.sources.preprocess import preprocess

    loaded = load_model(ModelSpec())
    images = [load_image(p).image for p in sorted((ROOT / "assets").glob("*.jpg"))] * 2

    def plain():
        loaded.model(preprocess(images, loaded.data_config).tensor)

    def full():
        fwd = forward(loaded, images)
        attention = fwd.trace.stack("attn") if hasattr(fwd, "trace") else fwd.capture.attention
        for a in attention:
            rollout(a, fwd.layout)
        return fwd

    def scores():  # what the heads page pays when it opens one image (after the Trace: on first read only)
        fwd = full()
        return fwd.image(0).head_scores if hasattr(fwd, "image") else fwd.head_scores(0)

    names = ("plain", "full", "full + one image's head scores")
    wall, cpu = {n: [] for n in names}, {n: [] for n in names}
    with torch.inference_mode():
        plain(), full()
        for _ in range(repeats):
            for name, fn in zip(names, (plain, full, scores)):
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                cpu[name].append(time.process_time() - start_cpu)
                wall[name].append(time.perf_counter() - start)
    print(json.dumps({"wall": {n: statistics.median(t) for n, t in wall.items()},
                      "cpu": {n: statistics.median(t) for n, t in cpu.items()}}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a folder holding the tree before (vitviz/)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.repeats)
        return
    trees = {"before": args.before.resolve(), "after": ROOT}
    results = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
            out = subprocess.run([sys.executable, __file__, "--child", "--before", str(tree), "--repeats",
                                  str(args.repeats)], env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(row)
            print(name, json.dumps(row), flush=True)
    for clock in ("cpu", "wall"):
        for name, rows in results.items():
            ratio = statistics.median(r[clock]["full"] / r[clock]["plain"] for r in rows)
            scores = statistics.median(r[clock]["full + one image's head scores"] / r[clock]["plain"] for r in rows)
            plain = statistics.median(r[clock]["plain"] for r in rows)
            print(f"{clock} time, {name}: plain {plain:.3f} s, full / plain {ratio:.3f} (with one image's head "
                  f"scores {scores:.3f}), median of {len(rows)} rounds")

if __name__ == "__main__":
    main()
