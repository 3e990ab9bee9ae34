"""Cost of the faithfulness page and of attention flow; the bundled model's AUC table on the samples.

Prints
  1. one image, the bundled model @224: the perturbation test of every page method (last-layer mean
     and 6 heads, rollout, attention flow's map given, random; 11 steps) / one plain forward of one image,
     and the same per perturbed input (batches of 16 vs one image alone);
  2. attention flow time for the bundled model (real weights) and ViT-B/16 @224 (random weights, timing
     only), full depth and the last 4 layers: seconds per image and per patch;
  3. with --auc: the bundled model's AUC table on the four sample photos (all methods, flow over all layers).

Usage: .venv/bin/python benchmarks/faithfulness.py [--auc]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import timm
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.perturbation.curves import attention_maps, perturbation_curves  # noqa: E402
from vitviz.analyses.flow import attention_flow  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.analyses.rollout import rollout  # noqa: E402

SAMPLES = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")


def main(with_auc: bool) -> None:
    torch.set_num_threads(torch.get_num_threads())
    loaded = load_model(ModelSpec())
    model, layout = loaded.model, loaded.layout
    x = preprocess([load_image(ROOT / "assets" / "astronaut.jpg").image], loaded.data_config).tensor
    out = capture(model, x)
    attention = out.stack("attn")[0].numpy()
    t = time.perf_counter()
    flow = attention_flow(attention, layout)
    flow_s = time.perf_counter() - t
    maps = attention_maps(attention, layout, rollout_map=rollout(attention, layout).map, flow_map=flow.map)
    # The machine is shared and its load drifts: one plain forward is timed after every method (from the
    # progress callback), its time taken out of the total, and the ratio uses the median of those forwards.
    samples = []

    @torch.inference_mode()
    def plain_forward(done, total):
        t0 = time.perf_counter()
        model(x)
        samples.append(time.perf_counter() - t0)

    with torch.inference_mode():
        model(x)
    t = time.perf_counter()
    perturbation_curves(model, x[0], maps, layout, progress=plain_forward)
    page = time.perf_counter() - t - sum(samples)
    plain = statistics.median(samples)
    print(f"plain forwards between methods: {', '.join(f'{s * 1e3:.0f}' for s in samples)} ms")
    inputs = len(maps) * 2 * 9 + 2
    print(f"threads {torch.get_num_threads()}; one plain forward (bundled, 1 image @224): {plain * 1e3:.0f} ms")
    print(f"perturbation test, {len(maps)} methods x 11 steps ({inputs} inputs, batches of 16): {page:.1f} s "
          f"= {page / plain:.0f}x one forward = {page / inputs / plain:.2f}x one forward per input")
    print(f"  with attention flow over all layers: {(page + flow_s) / plain:.0f}x one forward")
    for name, loader in (("bundled ViT-S/14", None), ("ViT-B/16 (random weights)", "vit_base_patch16_224")):
        if loader is None:
            a, lay = attention, layout
        else:
            torch.manual_seed(0)
            vit = timm.create_model(loader, pretrained=False).eval()
            o = capture(vit, torch.randn(1, 3, 224, 224))
            a, lay = o.stack("attn")[0].numpy(), o.layout
        for label, start in (("all 12 layers", 0), ("last 4 layers", a.shape[0] - 4)):
            t = time.perf_counter()
            f = attention_flow(a, lay, start=start)
            s = time.perf_counter() - t
            print(f"attention flow, {name}, {label}: {s:.1f} s per image ({s / lay.num_patches * 1e3:.0f} ms per "
                  f"patch, {lay.num_patches} patches); max error bound {f.error_bound.max():.1e}")
    if with_auc:
        print("\nbundled model, 11 steps, pre-logits cosine; AUC deletion (lower = better) / insertion (higher = better)")
        rows = {}
        for name in SAMPLES:
            xi = preprocess([load_image(ROOT / "assets" / name).image], loaded.data_config).tensor
            ai = capture(model, xi).stack("attn")[0].numpy()
            mi = attention_maps(ai, layout, rollout_map=rollout(ai, layout).map,
                                flow_map=attention_flow(ai, layout).map)
            r = perturbation_curves(model, xi[0], mi, layout)
            for m, d, i in zip(r.methods, r.deletion_auc, r.insertion_auc):
                rows.setdefault(m, []).append(f"{d:.3f} / {i:.3f}")
            print(f"  {name}: best deletion {r.reference()['best']['deletion']}, best insertion "
                  f"{r.reference()['best']['insertion']}", flush=True)
        print("| method | " + " | ".join(SAMPLES) + " |")
        print("|---|" + "---|" * len(SAMPLES))
        for m, cells in rows.items():
            print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main("--auc" in sys.argv)
