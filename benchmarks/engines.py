"""The engine (vitviz.runs.engines): Ray against local for `stats` on a few images, and float16 shards' cost.

Prints
  1. ``python -m vitviz stats`` on N images (deit-tiny, random weights, 224 px, batch 8) with ``--engine local``
     (1 decoding worker) and ``--engine ray`` (a local Ray: 2 CPUs, 2 actors), each the whole command in a fresh
     process, wall time with start-up; repeats interleaved, medians. With ``--before DIR`` the same commands also run
     from an older checkout (e.g. ``git worktree add --detach /tmp/before 2e91088``: the Ray Data engine), in the
     same interleaved loop.
  2. ``features train --shards``' parts on the bundled model (ViT-S/14, real weights), layer 6 ``resid_post``, M
     images (the sample photos, repeated), batch 8: the forward to the point (``token_batches``), writing the
     float16 shards, reading them back, in ms per image and as ratios of the forward; the shards' bytes per token.

Usage: .venv/bin/python benchmarks/engines.py [ray] [shards] [--images N] [--repeats R] [--before DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from stats_throughput import make_images, random_checkpoint  # noqa: E402


def command(tree: Path, args: list[str]) -> float:
    """``python -m vitviz ARGS`` run from ``tree``'s vitviz in a fresh process: wall seconds."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vitviz", *args], capture_output=True, text=True, cwd=tree,
                            env=os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return wall


def ray_vs_local(tmp: Path, n: int, repeats: int, before: Path | None) -> None:
    folder = make_images(tmp / f"img{n}", n)
    tiny = random_checkpoint("deit_tiny_patch16_224", tmp)
    model = ["--model", "deit_tiny_patch16_224", "--checkpoint", str(tiny), "--batch-size", "8"]
    trees = {"this tree": ROOT} | ({f"before ({before})": before} if before else {})
    walls = {(t, e): [] for t in trees for e in ("local", "ray")}
    for r in range(repeats):
        for tree_name, tree in trees.items():
            for engine, workers in (("local", "1"), ("ray", "2")):
                out = tmp / f"out-{r}-{engine}-{len(walls[tree_name, engine])}-{hash(tree_name) % 1000}"
                walls[tree_name, engine].append(command(tree, ["stats", str(folder), "--out", str(out), *model,
                                                               "--engine", engine, "--workers", workers]))
                shutil.rmtree(out)
    for tree_name in trees:
        local, ray = (statistics.median(walls[tree_name, e]) for e in ("local", "ray"))
        print(f"{tree_name}: stats on {n} images, deit-tiny @224, whole command, medians of {repeats}: local "
              f"{local:.1f} s, ray (local Ray, 2 CPUs, 2 actors) {ray:.1f} s, ray / local = {ray / local:.2f}; every "
              f"run: local {[round(w, 1) for w in walls[tree_name, 'local']]}, ray "
              f"{[round(w, 1) for w in walls[tree_name, 'ray']]}", flush=True)


def shards_cost(tmp: Path, m: int, repeats: int) -> None:
    import torch

    import vitviz
    from vitviz.features.shards import Shards
    from vitviz.io.inputs import expand_inputs

    photos = sorted((ROOT / "assets").glob("*.jpg"))
    folder = tmp / "photos"
    folder.mkdir()
    for i in range(m):
        shutil.copy(photos[i % len(photos)], folder / f"{i:03d}-{photos[i % len(photos)].name}")
    files, _ = expand_inputs([folder])
    lens = vitviz.open("bundled", device="cpu")
    run = {"model": "bundled", "point": "resid_post", "layer": 6}
    times = {"forward": [], "write": [], "read": []}
    size = tokens = 0
    for r in range(repeats):
        from vitviz.features.data import token_batches

        start = time.perf_counter()
        batches = list(token_batches(lens, files, "resid_post", 6, 8))
        times["forward"].append(time.perf_counter() - start)
        target = tmp / f"shards{r}"
        shards = Shards(target, run, len(batches))
        start = time.perf_counter()
        for b in batches:
            shards.write(b, "layer 6")
        times["write"].append(time.perf_counter() - start)
        start = time.perf_counter()
        tokens = sum(len(b.tokens.reshape(-1, b.tokens.shape[-1])) for b in shards.read())
        times["read"].append(time.perf_counter() - start)
        size = sum(p.stat().st_size for p in target.glob("shard-*"))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"shards, bundled ViT-S/14 @224, layer 6 resid_post, {m} images (the sample photos repeated), batch 8, "
          f"medians of {repeats}: forward to the point {1000 * med['forward'] / m:.1f} ms/img; write float16 shards "
          f"{1000 * med['write'] / m:.2f} ms/img ({med['write'] / med['forward']:.3f}x the forward); read "
          f"{1000 * med['read'] / m:.2f} ms/img ({med['read'] / med['forward']:.3f}x); {size / tokens:.0f} bytes per "
          f"token ({size / m / 1024:.0f} KiB per image); torch threads {torch.get_num_threads()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("parts", nargs="*", default=["ray", "shards"])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "ray" in args.parts:
            ray_vs_local(Path(tmp), args.images, args.repeats, args.before)
        if "shards" in args.parts:
            shards_cost(Path(tmp), 2 * args.images, args.repeats)
    print(f"load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
