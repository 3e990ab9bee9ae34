"""Full-analysis cost vs the plain fused forward, streamed mean-distance throughput, peak memory.

Prints
  1. bundled architecture and ViT-B/16 @224, batch 1 and 8: full analysis (capture + per image
     attention sinks, rollout and head scores + mean distance, all on the attention's device) /
     plain fused forward, interleaved repeats, medians; rollout alone, chain vs matrix products;
  2. mean attention distance streamed over 32 images in batches of 8, throughput relative to
     the plain batched forward over the same batches (ViT-B/16 @224);
  3. peak extra RSS (fresh subprocess) of a full analysis of one image for ViT-L/16 @384, and of
     the streamed distance path at 8 vs 32 images (it should not grow with the image count);
  4. gradient rollout on the bundled architecture with a 1000-class head at 224 and 448 px: peak
     extra RSS beyond the model's own forward + backward, in units of one image's attention tensor:
     class_gradient_rollout (hooks, nothing retained), attention_gradients (float32) +
     gradient_rollout, and the float64 copies before issue 10 (reproduced here as ``legacy``).
     Each in a fresh subprocess.

Random weights. Usage: .venv/bin/python benchmarks/analysis_speed.py [--repeats 7] [--skip-memory]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.analyses.distance import mean_attention_distance, stream_mean_attention_distance  # noqa: E402
from vitviz.layout import TokenLayout  # noqa: E402
from vitviz.analyses.maps import head_scores  # noqa: E402
from vitviz.analyses.rollout import (attention_gradients, class_gradient_rollout, gradient_rollout, rollout,  # noqa: E402
                            rollout_reference)
from vitviz.analyses.tokens import attention_sinks  # noqa: E402


def build(name, size, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, img_size=size, **kwargs).eval()


def full_analysis(model, x):
    """What ``analyze`` and the app compute for every image of a batch, where the model ran."""
    out = capture(model, x)
    distance = mean_attention_distance(out.stack("attn"), out.layout)
    for a, d in zip(out.stack("attn"), distance):
        attention_sinks(a, out.layout)
        rollout(a, out.layout)
        head_scores(a, out.layout, d)
    return out


def median_time(fn, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def legacy_attention_gradients(model, x, target):
    """attention_gradients as it was before issue 10: float64 copies of the whole (L, H, N, N) arrays."""
    from vitviz.analyses.rollout import _attention_and_logits as attention_and_logits

    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        layers, logits = attention_and_logits(model, x)
        for probs in layers:
            probs.retain_grad()
        logits[0, target].backward()
    attention = np.stack([p[0].detach().double().cpu().numpy() for p in layers])
    grads = np.stack([p.grad[0].double().cpu().numpy() for p in layers])
    return attention, grads, target


def plain_backward(model, x, target):
    with torch.enable_grad():
        model(x.detach().requires_grad_(True))[0, target].backward()


def child(mode: str) -> None:
    """In a fresh process, print the peak extra RSS (MiB) of one workload after a warm-up forward."""
    from _memory import peak_extra_mib

    if mode == "full-L384":
        model = build("vit_large_patch16_384", 384)
        x = torch.randn(1, 3, 384, 384)
        with torch.inference_mode():
            capture(model, x)  # warm-up: the allocator's first growth is not the analysis's
            extra = peak_extra_mib(lambda: full_analysis(model, x))
    elif mode.startswith("grad-"):
        _, size, how = mode.split("-")
        model = build("vit_small_patch14_dinov2", int(size), num_classes=1000)
        for p in model.parameters():
            p.requires_grad_(False)  # gradients flow to the input only, as in vitviz
        x = torch.randn(1, 3, int(size), int(size))
        plain_backward(model, x, 0)  # warm-up
        layout = TokenLayout.from_model(model)
        if how == "plain":
            extra = peak_extra_mib(lambda: plain_backward(model, x, 0))
        elif how == "hooked":
            extra = peak_extra_mib(lambda: class_gradient_rollout(model, x, layout, 0))
        else:
            gradients = attention_gradients if how == "new" else legacy_attention_gradients
            extra = peak_extra_mib(lambda: gradient_rollout(*gradients(model, x, 0)[:2], layout))
        n = layout.num_tokens
        print(json.dumps({"extra": extra, "attention": 12 * 6 * n * n * 4 / 2**20}))
        return
    else:
        n = int(mode.split("-")[1])
        model = build("vit_base_patch16_224", 224)
        with torch.inference_mode():
            model(torch.randn(8, 3, 224, 224))
        images = torch.randn(n, 3, 224, 224)
        extra = peak_extra_mib(lambda: stream_mean_attention_distance(model, images.split(8), TokenLayout.from_model(model)))
    print(json.dumps({"extra": extra}))


def measure_child(mode: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, run in turn so that load drift hits all alike."""
    for fn in fns.values():
        median_time(fn, 1)
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(median_time(fn, 1))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    print(f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}")
    for label, name in (("bundled arch (ViT-S/14 DINOv2)", "vit_small_patch14_dinov2"), ("ViT-B/16", "vit_base_patch16_224")):
        model = build(name, 224)
        for batch in (1, 8):
            x = torch.randn(batch, 3, 224, 224)
            med = interleaved({"plain": lambda: model(x), "full": lambda: full_analysis(model, x)}, args.repeats)
            print(f"1. {label} @224, batch {batch}: plain {med['plain']:.3f} s, full analysis {med['full']:.3f} s: "
                  f"ratio {med['full'] / med['plain']:.2f}", flush=True)
    model = build("vit_small_patch14_dinov2", 224)
    attention, layout = capture(model, torch.randn(1, 3, 224, 224)).stack("attn")[0].numpy(), TokenLayout.from_model(model)
    med = interleaved({"chain": lambda: rollout(attention, layout), "matrix": lambda: rollout_reference(attention, layout)},
                      2 * args.repeats)
    print(f"   rollout alone (N = {layout.num_tokens}, 12 layers, per-layer maps): chain {med['chain'] * 1e3:.1f} ms vs "
          f"matrix {med['matrix'] * 1e3:.1f} ms: ratio {med['chain'] / med['matrix']:.3f}", flush=True)

    model = build("vit_base_patch16_224", 224)
    layout = TokenLayout.from_model(model)
    images = torch.randn(32, 3, 224, 224)
    med = interleaved({"plain": lambda: [model(b) for b in images.split(8)],
                       "streamed": lambda: stream_mean_attention_distance(model, images.split(8), layout)}, 3)
    print(f"2. mean distance over 32 images (ViT-B/16, batches of 8): {32 / med['streamed']:.1f} img/s vs plain "
          f"forward {32 / med['plain']:.1f} img/s: throughput ratio {med['plain'] / med['streamed']:.2f}", flush=True)
    if args.skip_memory:
        return

    print(f"3. peak extra RSS, full analysis of one image, ViT-L/16 @384: {measure_child('full-L384')['extra']:.0f} MiB")
    for n in (8, 32):
        print(f"   peak extra RSS, streamed mean distance over {n} images (ViT-B/16): "
              f"{measure_child(f'stream-{n}')['extra']:.0f} MiB", flush=True)
    for size in (224, 448):
        runs = {how: measure_child(f"grad-{size}-{how}") for how in ("plain", "hooked", "new", "legacy")}
        att = runs["plain"]["attention"]
        over = {how: (runs[how]["extra"] - runs["plain"]["extra"]) / att for how in ("hooked", "new", "legacy")}
        print(f"4. gradient rollout, bundled arch + head @{size} (attention {att:.0f} MiB): peak extra RSS plain "
              f"forward+backward {runs['plain']['extra']:.0f} MiB; class_gradient_rollout (what the app and analyze "
              f"run) {runs['hooked']['extra']:.0f} MiB (+{over['hooked']:.2f}x attention); attention_gradients "
              f"(float32) + gradient_rollout {runs['new']['extra']:.0f} MiB (+{over['new']:.2f}x); float64 copies "
              f"before issue 10 {runs['legacy']['extra']:.0f} MiB (+{over['legacy']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
