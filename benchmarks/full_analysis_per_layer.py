"""Full analysis of a batch / plain forward, before and after the per-layer reductions, in one run.

"Full analysis" is what the app and ``analyze`` compute for every image: the capture, mean attention
distance, attention sinks, per-head entropy and CLS focus, and the rollout. *Whole-array* is how
they were computed before (capture, then each analysis over the stored (B, L, H, N, N) array);
*per-layer* is :func:`vitviz.pipeline.forward` (distance, sinks, entropy, focus reduced from each layer's
contiguous attention as the forward runs) followed by the rollout. Both ratios come from the same
run, against the same plain forward (the library's own, fused attention).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/full_analysis_per_layer.py [--batch 8]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from vitviz.capture import capture
from vitviz.distance import mean_attention_distance
from vitviz.maps import head_scores
from vitviz.models import ModelSpec, load_model
from vitviz.pipeline import _LayerReductions
from vitviz.rollout import rollout
from vitviz.tokens import attention_sinks


def whole_array(model, x):
    out = capture(model, x)
    a, layout = out.attention, out.layout
    d = mean_attention_distance(a, layout)
    for ai, di in zip(a, d):
        attention_sinks(ai, layout)
        head_scores(ai, layout, di)
        rollout(ai, layout)


def per_layer(model, x, layout):
    # vitviz.pipeline.forward without the preprocessing (the input is already a tensor here).
    reduce = _LayerReductions(layout)
    out = capture(model, x, each_layer=reduce)
    for k in range(4):
        reduce.stacked(k)
    for ai in out.attention:
        rollout(ai, layout)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}", flush=True)
    import timm

    cases = [("bundled arch", load_model(ModelSpec()).model)]
    torch.manual_seed(0)
    cases.append(("ViT-B/16", timm.create_model("vit_base_patch16_224", pretrained=False).eval()))
    with torch.inference_mode():
        for name, model in cases:
            x = torch.randn(args.batch, 3, 224, 224)
            layout = capture(model, x[:1]).layout
            for fn in (lambda: model(x), lambda: whole_array(model, x), lambda: per_layer(model, x, layout)):
                fn()  # warm-up
            plain = whole = layer = 0.0
            rows = []
            for _ in range(args.repeats):  # interleaved, so load changes hit all three alike
                rows.append((timed(lambda: model(x), 1), timed(lambda: whole_array(model, x), 1),
                             timed(lambda: per_layer(model, x, layout), 1)))
            plain, whole, layer = (statistics.median(r[i] for r in rows) for i in range(3))
            print(f"{name} @224 B{args.batch}: plain {plain:.3f} s, whole-array {whole:.3f} s "
                  f"({whole / plain:.2f}x), per-layer {layer:.3f} s ({layer / plain:.2f}x); "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
