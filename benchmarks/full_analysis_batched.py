"""Full analysis / plain forward at batch 1, 8 and 64 on the CPU, for two trees in one run (issue 40: the per-image
analyses computed for the whole batch at once, in torch, where the attention is).

"Full analysis" is :func:`vitviz.runs.analysis.analyze_batch` as ``analyze --no-attention`` runs it: preprocessing,
the forward that keeps every layer's attention, the token norms, artifacts, sinks, mean distance and each image's
rollout with its cumulative steps (and gradient rollout for a model with a head). "Forward with attention" is the
Trace alone (``Lens.trace`` keeping what ``analyze`` reads, no analysis): the floor the analyses sit on. "Plain" is
preprocessing and the model's own fused forward (inference mode). Each tree runs in its own process, rounds
alternate between the trees so that load drift hits both alike, and each ratio is of the same process (interleaved
calls, median of ``--repeats``). One torch thread (``OMP_NUM_THREADS=1``): the process's CPU time is the figure on a
machine other sessions load (wall time is printed beside it).

    git -C /work/main archive main vitviz | tar -x -C /tmp/before      # the tree before
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/full_analysis_batched.py --before /tmp/before --batches 1,8,64
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
STEPS = ("plain", "forward with attention", "full analysis")


def child(batches: list[int], repeats: int, model: str) -> None:
    import torch

    import vitviz
    from vitviz.io.images import load_image
    from vitviz.runs.analysis import AnalysisSettings, analyze_batch
    from vitviz.sources.preprocess import preprocess

    torch.set_num_threads(1)
    if model == "bundled":
        lens = vitviz.open("bundled")
    else:  # a timm architecture with random weights (timing does not depend on them)
        import dataclasses

        import timm

        from vitviz.lens import Lens
        from vitviz.sources.models import ModelSpec, _finish

        torch.manual_seed(0)
        loaded = _finish(timm.create_model(model, pretrained=False), ModelSpec(name=model, device="cpu"),
                         "random weights", model, [])
        lens = Lens(dataclasses.replace(loaded))
    loaded = lens.loaded
    photos = [load_image(p).image for p in sorted((ROOT / "assets").glob("*.jpg"))]
    keep = ["attn", "resid_post.norm", "final_norm"] + (["logits"] if loaded.has_head else [])
    out = {}
    for batch in batches:
        images = [photos[i % len(photos)] for i in range(batch)]
        settings = AnalysisSettings(batch_size=batch)

        def plain():
            with torch.inference_mode():
                loaded.model(preprocess(images, loaded.data_config).tensor)

        def traced():
            lens.trace(preprocess(images, loaded.data_config), keep=keep)

        def full():
            analyze_batch(loaded, images, settings, keep_attention=False)

        wall, cpu = {s: [] for s in STEPS}, {s: [] for s in STEPS}
        for fn in (plain, traced, full):
            fn()  # warm-up
        for _ in range(repeats):
            for name, fn in zip(STEPS, (plain, traced, full)):
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                cpu[name].append(time.process_time() - start_cpu)
                wall[name].append(time.perf_counter() - start)
        out[str(batch)] = {"wall": {n: statistics.median(t) for n, t in wall.items()},
                           "cpu": {n: statistics.median(t) for n, t in cpu.items()}}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a folder holding the tree before (vitviz/)")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="bundled", help="bundled, or a timm name built with random weights")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        child(batches, args.repeats, args.model)
        return
    trees = {"before": args.before.resolve(), "after": ROOT}
    results = {name: [] for name in trees}
    print("load before:", os.getloadavg(), flush=True)
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
            done = subprocess.run([sys.executable, __file__, "--child", "--before", str(tree), "--batches",
                                   args.batches, "--repeats", str(args.repeats), "--model", args.model],
                                  env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{name}: {done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(row)
            print(name, json.dumps(row), flush=True)
    print("load after:", os.getloadavg(), flush=True)
    print(f"\n{args.model}, one torch thread, medians of {args.rounds} rounds x {args.repeats} repeats")
    print("| batch | tree | plain CPU s | forward with attention / plain | full analysis / plain (CPU time) "
          "| full / plain (wall) |")
    print("|---|---|---|---|---|---|")
    for batch in batches:
        for name, rows in results.items():
            rows_b = [r[str(batch)] for r in rows]

            def ratio(clock, step, rows_b=rows_b):
                return statistics.median(r[clock][step] / r[clock]["plain"] for r in rows_b)

            plain = statistics.median(r["cpu"]["plain"] for r in rows_b)
            print(f"| {batch} | {name} | {plain:.3f} | {ratio('cpu', STEPS[1]):.3f} | **{ratio('cpu', STEPS[2]):.3f}** "
                  f"| {ratio('wall', STEPS[2]):.3f} |")


if __name__ == "__main__":
    main()
