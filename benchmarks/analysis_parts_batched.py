"""Where the full analysis's time goes beyond the forward, per-image functions against the batch's (issue 40).

One batch of the bundled model at 224 px (the sample photos repeated to ``--batch``), its trace taken once; then, CPU
time of one torch thread, median of ``--repeats`` interleaved calls: the per-image path ``analyze`` ran before
(mean distance of the batch, then per image the sinks and the rollout: :mod:`vitviz.analyses.distance`,
:func:`~vitviz.analyses.tokens.attention_sinks`, :func:`~vitviz.analyses.rollout.rollout`) and the batch's
(:func:`vitviz.analyses.batched.reduce_attention` with the heads fused, :func:`~vitviz.analyses.batched.batch_rollout`),
beside the plain forward of the same batch.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/analysis_parts_batched.py --batch 8
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    import vitviz
    from vitviz.analyses.batched import batch_rollout, batch_sinks, reduce_attention, rollouts
    from vitviz.analyses.distance import mean_attention_distance
    from vitviz.analyses.rollout import rollout
    from vitviz.analyses.tokens import attention_sinks
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    torch.set_num_threads(1)
    lens = vitviz.open("bundled")
    photos = [load_image(p).image for p in sorted((ROOT / "assets").glob("*.jpg"))]
    x = preprocess([photos[i % len(photos)] for i in range(args.batch)], lens.loaded.data_config)
    trace = lens.trace(x, keep=["attn", "resid_post.norm", "final_norm"])
    a, layout = trace.stack("attn"), trace.layout

    def plain():
        with torch.inference_mode():
            lens.model(x.tensor)

    def per_image():
        mean_attention_distance(a, layout)
        for image in a:
            attention_sinks(image, layout)
            rollout(image, layout)

    def batched():
        r = reduce_attention(a, layout, fusion="mean")
        batch_sinks(r.received, layout)
        rollouts(batch_rollout(r.fused, layout), layout)

    def reductions():
        reduce_attention(a, layout, fusion="mean")

    r = reduce_attention(a, layout, fusion="mean")

    def chains():
        rollouts(batch_rollout(r.fused, layout), layout)

    steps = {"plain forward": plain, "per-image analyses (before)": per_image, "batched analyses (after)": batched,
             "  of which reduce_attention": reductions, "  of which batch_rollout": chains}
    times = {name: [] for name in steps}
    for fn in steps.values():
        fn()
    for _ in range(args.repeats):
        for name, fn in steps.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    plain_s = statistics.median(times["plain forward"])
    print(f"bundled @224, batch {args.batch}, one torch thread, CPU time, median of {args.repeats}")
    print("| step | CPU s | / plain forward |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.4f} | {statistics.median(t) / plain_s:.3f} |")


if __name__ == "__main__":
    main()
