"""Cost of each attribution method relative to one plain forward; the AUC table of every method.

Prints
  1. per model (the bundled model @224 with its real weights; ViT-B/16 and Swin-T @224 with random weights,
     timing only) and batch 8: the median time of one plain forward (``model(x)``, timm's fused attention,
     inference mode) and of each attribution method (:mod:`vitviz.explainers`) on the same batch, all measured in
     the same run, each method right after a plain forward: the ratios method / plain forward of the medians,
     of the minima and the median of the paired ratios; beside them,
     ``attnlrp (before)``: AttnLRP with its LayerNorm rule written out as tensor operations, as it was before
     the fused rule (:class:`vitviz.explainers.rules._LayerNormRule`), to compare in the same run;
  2. with --auc: deletion and insertion AUC (11 steps, mean colour, the faithfulness page's score: the
     bundled model has no head, so the cosine of pooled vectors; the attribution target is the pooled
     vector's projection on its own direction) of every method on the four sample photos, signed order
     (most relevant first by signed value), plus positive-only and absolute orders for the signed methods,
     beside the random map over 10 seeds (mean and standard deviation).

Usage: .venv/bin/python -u benchmarks/attribution_cost.py [--auc] [--no-cost] [--repeats R] [--models bundled,vit_b,swin_t]
       [--methods "attnlrp,attnlrp (before),gradient"]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import timm
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vitviz.explainers import get_method, registered  # noqa: E402
from vitviz.explainers import rules as attribution  # noqa: E402  (the rules module: _layer_norm is swapped there)
from vitviz.explainers.base import AttributionMethod  # noqa: E402
from vitviz.explainers.targets import default_target  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

METHODS = tuple(n for n, m in registered().items() if isinstance(m, AttributionMethod))


def attribute(model, x, method, target):
    return get_method(method).maps(model, x, target)

SAMPLES = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")
BATCH = 8


def _batch(loaded) -> torch.Tensor:
    images = [load_image(ROOT / "assets" / n).image for n in SAMPLES]
    x = preprocess(images, loaded.data_config).tensor
    return x.repeat(BATCH // len(x), 1, 1, 1)


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _written_out_layer_norm(module: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """The LayerNorm rule as it was before the fused one: (x - mean) / stop_gradient(std) * weight + bias."""
    dims = tuple(range(-len(module.normalized_shape), 0))
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
    y = (x - mean) / (var + module.eps).sqrt().detach()
    if module.weight is not None:
        y = y * module.weight
    if module.bias is not None:
        y = y + module.bias
    return y


@contextlib.contextmanager
def _before():
    fused = attribution._layer_norm
    attribution._layer_norm = _written_out_layer_norm
    try:
        yield
    finally:
        attribution._layer_norm = fused


def cost(label: str, model: torch.nn.Module, x: torch.Tensor, repeats: int, methods=METHODS) -> None:
    target = default_target(model)

    def plain():
        with torch.inference_mode():
            model(x)

    def before():
        with _before():
            attribute(model, x, "attnlrp", target)

    runs = {m: (lambda m=m: attribute(model, x, m, target)) for m in methods if m in METHODS}
    if "attnlrp (before)" in methods:
        runs["attnlrp (before)"] = before
    plain()
    for fn in runs.values():  # warm-up
        fn()
    # Each method right after its own plain forward, so a load change on the shared machine hits both alike; the
    # paired ratio (method / the forward just before it) is the steadiest figure under changing load.
    times = {name: [] for name in ["plain forward", *runs]}
    paired = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            (base,) = _time(plain, 1)
            (took,) = _time(fn, 1)
            times["plain forward"].append(base)
            times[name].append(took)
            paired[name].append(took / base)
    base, floor = statistics.median(times["plain forward"]), min(times["plain forward"])
    print(f"\n{label}, batch {len(x)}, input {tuple(x.shape[-2:])}, {repeats} repeats: median and min s, their ratios "
          "to the plain forward's median and min, and the median of the ratios to the forward run just before")
    for name, t in times.items():
        med = statistics.median(t)
        pair = f"{statistics.median(paired[name]):5.2f}x" if name in paired else "  -  "
        print(f"  {name:17s} {med:8.3f} s {med / base:5.2f}x   min {min(t):8.3f} s {min(t) / floor:5.2f}x   "
              f"paired {pair}   (max {max(t):.3f})", flush=True)


def auc_table() -> None:
    from vitviz.perturbation.curves import default_fractions, perturbation_curves, random_map

    loaded = load_model(ModelSpec())
    model, layout = loaded.model, loaded.layout
    x = preprocess([load_image(ROOT / "assets" / n).image for n in SAMPLES], loaded.data_config).tensor
    target = default_target(model)
    maps = {m: attribute(model, x, m, target).patches for m in METHODS}
    rows: dict[str, list[tuple[float, float]]] = {}
    seeds = range(10)
    for i, name in enumerate(SAMPLES):
        per_image = {m: maps[m][i] for m in METHODS}
        for m in ("attnlrp", "cp-lrp", "gradient"):
            per_image[f"{m} (positive)"] = np.maximum(maps[m][i], 0)
            per_image[f"{m} (absolute)"] = np.abs(maps[m][i])
        per_image |= {f"random seed {s}": random_map(layout.grid_size, s) for s in seeds}
        result = perturbation_curves(model, x[i], per_image, layout, fractions=default_fractions(11))
        for m, d, s in zip(result.methods, result.deletion_auc, result.insertion_auc):
            rows.setdefault(m, []).append((float(d), float(s)))
        seeds_auc = np.array([rows[f"random seed {s}"][-1] for s in seeds])
        print(f"  {name} ({result.score}): random {seeds_auc[:, 0].mean():.3f} ± {seeds_auc[:, 0].std(ddof=1):.3f} / "
              f"{seeds_auc[:, 1].mean():.3f} ± {seeds_auc[:, 1].std(ddof=1):.3f}; " +
              ", ".join(f"{m} {v[-1][0]:.3f} / {v[-1][1]:.3f}" for m, v in rows.items()
                        if not m.startswith("random seed")), flush=True)
    rand = np.array([rows[f"random seed {s}"] for s in seeds])  # (seeds, images, 2)
    print("\nAUC, bundled model, 11 steps, mean colour; per image deletion / insertion; lower deletion and higher "
          "insertion are better")
    print(f"{'method':24s} " + " ".join(f"{n:>15s}" for n in SAMPLES) + f" {'mean':>15s}")
    for m, values in rows.items():
        if m.startswith("random seed"):
            continue
        v = np.array(values)
        print(f"{m:24s} " + " ".join(f"{d:6.3f} / {s:6.3f}" for d, s in v) +
              f" {v[:, 0].mean():6.3f} / {v[:, 1].mean():6.3f}")
    mean, sd = rand.mean(axis=0), rand.std(axis=0, ddof=1)
    print(f"{'random (10 seeds) mean':24s} " + " ".join(f"{d:6.3f} / {s:6.3f}" for d, s in mean) +
          f" {rand[..., 0].mean():6.3f} / {rand[..., 1].mean():6.3f}")
    print(f"{'random (10 seeds) s.d.':24s} " + " ".join(f"{d:6.3f} / {s:6.3f}" for d, s in sd) +
          f" {rand[..., 0].mean(axis=1).std(ddof=1):6.3f} / {rand[..., 1].mean(axis=1).std(ddof=1):6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--auc", action="store_true", help="also the AUC table")
    parser.add_argument("--no-cost", action="store_true", help="skip the timings (the AUC table alone)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="bundled,vit_b", help="which of bundled,vit_b,swin_t to time")
    parser.add_argument("--methods", default=",".join([*METHODS, "attnlrp (before)"]),
                        help="which methods to time (comma-separated; 'attnlrp (before)' is the unfused LayerNorm rule)")
    args = parser.parse_args()
    models, methods = args.models.split(","), args.methods.split(",")
    print(f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}")
    if not args.no_cost and "bundled" in models:
        loaded = load_model(ModelSpec())
        cost("bundled (DINOv2 ViT-S/14, real weights)", loaded.model, _batch(loaded), args.repeats, methods)
    if not args.no_cost and "vit_b" in models:
        torch.manual_seed(0)
        vit_b = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
        cost("ViT-B/16 (random weights)", vit_b, torch.randn(BATCH, 3, 224, 224), args.repeats, methods)
    if not args.no_cost and "swin_t" in models:  # window attention: LeGrad and Grad-CAM on the stage grids
        torch.manual_seed(0)
        swin_t = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
        cost("Swin-T (random weights)", swin_t, torch.randn(BATCH, 3, 224, 224), args.repeats, methods)
    if args.auc:
        auc_table()


if __name__ == "__main__":
    main()
