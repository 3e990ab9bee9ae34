"""Queries and keys, and the patching heatmap, on the bundled model (DINOv2 ViT-S/14, 224 px, 12 layers x 6 heads).

1. One head and all heads of one layer over 8 images (the four sample photos and their mirror images): the
   forward to the layer's keys, then PCA, t-SNE and UMAP of each head's 2 x 8 x 257 = 4112 points, against
   AttentionViz's published ~12 s per head (8 images, 400 tokens, ViT-B/32, their machine).
2. The full layer x head patching heatmap (72 heads, image A into image B) against one plain forward of one
   image, one head per forward and several heads per forward (copies of B in one batch).

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/heads_qk_patching.py [--layer 12] [--skip-umap]

(On the shared 2-core dev machine at load 10, OMP_NUM_THREADS=2 made one forward 11.5 s instead of 0.28 s:
threads spinning on oversubscribed cores. Use 1 there.)

Prints one JSON object (times in seconds, the machine and its load average before and after).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

import vitviz
from vitviz.heads import patching, qk

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def timed(fn, repeat: int = 1):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=12, help="1-based")
    ap.add_argument("--skip-umap", action="store_true")
    args = ap.parse_args()
    layer = args.layer - 1
    result = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "platform": platform.platform(), "load_before": os.getloadavg()}}
    lens = vitviz.open("bundled")
    result["machine"]["device"] = str(lens.device)
    photos = [ASSETS / n for n in ("chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg")]
    pil = [Image.open(p).convert("RGB") for p in photos]
    x = lens.preprocess(pil + [ImageOps.mirror(im) for im in pil])
    H = lens.num_heads

    # 1. queries and keys
    t_trace, trace = timed(lambda: lens.trace(x, keep=[("q", layer), ("k", layer)], stop_after=("k", layer)), 3)
    heads = [qk.head_qk(trace, layer, h) for h in range(H)]
    per_head = {"forward_to_keys_8_images": t_trace, "points_per_head": int(2 * heads[0].queries.shape[0]
                                                                             * heads[0].queries.shape[1])}
    methods = ["pca", "tsne"] + ([] if args.skip_umap else ["umap"])
    if "umap" in methods:  # numba compiles UMAP's kernels on the first call in a process: timed apart
        per_head["umap_first_call_with_compile"], _ = timed(lambda: qk.head_picture(heads[0], "umap"))
    for method in methods:
        t_one, _ = timed(lambda: qk.head_picture(heads[0], method), 3 if method == "pca" else 1)
        t_all, _ = timed(lambda: [qk.head_picture(h, method) for h in heads])
        per_head[f"{method}_one_head"] = t_one
        per_head[f"{method}_all_{H}_heads"] = t_all
        per_head[f"{method}_one_head_vs_attentionviz_12s"] = t_one / 12.0
    result["queries_keys"] = per_head

    # 2. patching
    a, b = x.tensor[:1], x.tensor[1:2]
    lens.trace(b, keep="pooled")  # warm
    t_forward, _ = timed(lambda: lens.trace(b, keep="pooled"), 5)
    pairs = [(l, h) for l in range(lens.num_layers) for h in range(H)]
    rows = {"one_forward_1_image": t_forward, "heads": len(pairs)}
    for batch in (1, 8, 24):
        t_patch, effects = timed(lambda: patching.patch(lens, a, b, pairs, batch=batch))
        rows[f"heatmap_batch_{batch}"] = t_patch
        rows[f"heatmap_batch_{batch}_in_forwards"] = t_patch / t_forward
    result["patching"] = rows
    result["machine"]["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
