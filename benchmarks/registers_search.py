"""Registers (issue 19): the bundled model's outliers and sinks, what sink masking costs its output, the test-time
register on the planted model, and the cost of the register-neuron search.

Prints
  1. the bundled DINOv2-S/14's largest patch-token norm over the median, per block, over the four sample photos, at
     224 px (and 448 / 518 with --sizes);
  2. its patch attention sinks per layer (summed over the photos) and the output change of sink masking (pooled
     cosine per photo);
  3. on the planted tiny ViT of tests/test_registers.py: the pooled cosine of the test-time register, of sink masking
     of the outliers and of zeroing the neuron (no register);
  4. the search over 64 images (the photos, flipped and cropped) relative to a plain forward over them in the same run:
     the spelled-out forward keeping ``pooled`` and timm's own fused ``forward_features``, interleaved batch by batch,
     median of --repeats.
Usage:
    .venv/bin/python benchmarks/registers_search.py [--sizes 224 448 518] [--repeats 3] [--device cpu]
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
sys.path.insert(0, str(ROOT / "tests"))
from vitviz.analyses import registers as R  # noqa: E402
from vitviz.adapters import run  # noqa: E402
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.analyses.tokens import attention_sinks  # noqa: E402

PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")


def photos():
    return [load_image(ROOT / "assets" / n).image for n in PHOTOS]


def outliers_and_sinks(size: int, device: str) -> None:
    loaded = load_model(ModelSpec(img_size=None if size == 224 else size, device=device))
    x = preprocess(photos(), loaded.data_config).tensor.to(loaded.device)
    out = R.find_outliers(R.token_norms(loaded.model, x).cpu().numpy(), loaded.layout)
    ratio = out.ratio.max(axis=0)
    print(f"{size} px: max/median patch norm per block (max over photos): {' '.join(f'{v:.2f}' for v in ratio)}"
          f"  (largest {ratio.max():.2f}; outliers at 10x: {int(out.mask.sum())})")
    if size != 224:
        return
    cap = capture(loaded.model, x)
    sinks = [attention_sinks(a, cap.layout) for a in cap.stack("attn")]
    per_layer = np.sum([[int((s >= cap.layout.num_prefix_tokens).sum()) for s in k.sinks] for k in sinks], axis=0)
    print(f"patch sinks per layer (summed over the {len(PHOTOS)} photos): {' '.join(map(str, per_layer))}")
    change = R.compare_outputs(loaded.model, x, R.mask_keys(R.sink_mask(sinks, cap.layout, x.device)))
    print("sink masking, pooled cosine per photo (" + ", ".join(PHOTOS) + "): "
          + " ".join(f"{c:.4f}" for c in change.pooled_cosine))


def planted() -> None:
    from test_registers import LAYER, NEURON, plant, tiny_vit
    from vitviz.layout import TokenLayout

    model = plant(tiny_vit())
    layout = TokenLayout.from_model(model)
    torch.manual_seed(2)
    x = torch.randn(16, 3, 64, 64)
    out = R.find_outliers(R.token_norms(model, x).numpy(), layout)

    def ablate(h, point):
        h = h.clone()
        h[..., NEURON] = 0
        return h

    for name, edit in (("test-time register", R.TestTimeRegister(((LAYER, NEURON),)).edit(layout)),
                       ("outlier masking", R.mask_keys(R.outlier_mask(out))),
                       ("neuron zeroed, no register", {f"blocks.{LAYER}.mlp_hidden": ablate})):
        c = R.compare_outputs(model, x, edit)
        print(f"planted tiny ViT, {name}: pooled cosine {c.pooled_cosine.min():.4f}-{c.pooled_cosine.max():.4f}, "
              f"top-1 agrees {int(c.top1_agrees.sum())}/{len(x)}, largest |logit change| {c.max_logit_change.max():.3f}")


def search_cost(device: str, repeats: int) -> None:
    loaded = load_model(ModelSpec(device=device))
    images = []
    for im in photos():
        for k in range(16):
            w, h = im.size
            crop = im.crop((k % 4 * w // 16, k // 4 * h // 16, w - (3 - k % 4) * w // 16, h - (3 - k // 4) * h // 16))
            images.append(crop.transpose(0) if k % 2 else crop)
    batches = [preprocess(images[i:i + 8], loaded.data_config).tensor.to(loaded.device) for i in range(0, 64, 8)]
    model = loaded.model

    def timed(fn, b):
        t0 = time.perf_counter()
        with torch.inference_mode():
            fn(b)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    # Interleaved batch by batch (spelled-out, fused, search on the same batch, in turn), so a change of load on a
    # shared machine falls on all three alike; the per-batch search's ranking is part of its cost.
    runs = {"spelled": lambda b: run(model, b, keep=("pooled",)), "fused": lambda b: model.forward_features(b),
            "search": lambda b: R.search_register_neurons(model, [b], loaded.layout)}
    totals = {k: [] for k in runs}
    for _ in range(repeats):
        sums = dict.fromkeys(runs, 0.0)
        for b in batches:
            for k, fn in runs.items():
                sums[k] += timed(fn, b)
        for k in runs:
            totals[k].append(sums[k])
    spelled, fused, search = (statistics.median(totals[k]) for k in ("spelled", "fused", "search"))
    print(f"64 images, batch 8, {loaded.device}, interleaved per batch, median of {repeats}: spelled-out forward "
          f"{spelled:.2f} s, timm fused forward {fused:.2f} s, search {search:.2f} s -> search / spelled-out "
          f"{search / spelled:.2f}x, search / fused {search / fused:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[224])
    parser.add_argument("--search-only", action="store_true", help="only the search's cost")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not args.search_only:
        for size in args.sizes:
            outliers_and_sinks(size, args.device)
        planted()
    search_cost(args.device, args.repeats)


if __name__ == "__main__":
    main()
