"""Faithfulness batched against image by image: the curves of a batch of images, CPU, one run, ratio.

The bundled model @224 (real weights), the four sample photos as one batch; maps: rollout and 2 random seeds
(the issue's GPU goal: rollout + 2 random seeds x 3 protocols x 11 steps). Both paths score the same perturbed
inputs: image by image (:func:`vitviz.perturbation.protocols.protocol_curves`, each map and protocol's 9 inner
steps in one forward, each image's two ends in another) and batched
(:func:`vitviz.perturbation.protocols.protocol_curves_batch`, every row of the batch ``--batch`` per forward). The
two are timed alternately, ``--repeats`` times each, median; the ratio is batched / image by image (below 1:
batched is faster), on one machine in one run. Also printed: the largest difference between their curves.

Usage: .venv/bin/python benchmarks/faithfulness_batched.py [--repeats 3] [--batch 64]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vitviz.analyses.rollout import rollout  # noqa: E402
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.perturbation.curves import random_seed_maps  # noqa: E402
from vitviz.perturbation.protocols import PROTOCOLS, protocol_curves, protocol_curves_batch  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402

SAMPLES = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")


def main(repeats: int, batch: int) -> None:
    loaded = load_model(ModelSpec())
    model, layout = loaded.model, loaded.layout
    x = preprocess([load_image(ROOT / "assets" / n).image for n in SAMPLES], loaded.data_config).tensor
    with torch.inference_mode():
        attention = capture(model, x).stack("attn").numpy()
    maps = [{"rollout": rollout(attention[i], layout).map} | random_seed_maps(layout.grid_size, 0, 2)
            for i in range(len(x))]
    inputs = len(x) * (2 + 3 * len(PROTOCOLS) * 9)

    def one_by_one():
        return [protocol_curves(model, x[i], maps[i], layout) for i in range(len(x))]

    def batched():
        return protocol_curves_batch(model, x, maps, layout, batch_size=batch)

    times = {"image by image": [], "batched": []}
    for _ in range(repeats):
        for name, fn in (("image by image", one_by_one), ("batched", batched)):
            t = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t)
            if name == "image by image":
                reference = result
            else:
                diff = max(float(np.abs(b.curves[p] - r.curves[p]).max()) for b, r in zip(result, reference)
                           for p in PROTOCOLS)
    a, b = statistics.median(times["image by image"]), statistics.median(times["batched"])
    print(f"bundled ViT-S/14 @224, {len(x)} images x (rollout + 2 random seeds) x {len(PROTOCOLS)} protocols x 11 "
          f"steps = {inputs} model inputs; {torch.get_num_threads()} threads; median of {repeats}")
    print("| path | s (batch of 4 images) | ms per image | ms per input |")
    print("|---|---|---|---|")
    for name, s in (("image by image", a), (f"batched ({batch} per forward)", b)):
        print(f"| {name} | {s:.2f} | {1000 * s / len(x):.0f} | {1000 * s / inputs:.1f} |")
    print(f"ratio batched / image by image: {b / a:.2f}x; largest curve difference {diff:.1e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    main(args.repeats, args.batch)
