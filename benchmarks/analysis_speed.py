"""Full-analysis cost vs the plain fused forward, streamed mean-distance throughput, peak memory.

Prints
  1. bundled architecture @224, batch 1 and 8: (capture + rollout of every image + mean distance
     + every raw head map) / plain fused forward, with the row-vector-chain rollout and with the
     matrix-product reference (the version before issue 10), in the same run; rollout alone, chain
     vs matrix;
  2. mean attention distance streamed over 32 images in batches of 8, throughput relative to
     the plain batched forward over the same batches (ViT-B/16 @224);
  3. peak extra RSS (fresh subprocess) of a full analysis of one image for ViT-L/16 @384, and of
     the streamed distance path at 8 vs 32 images (it should not grow with the image count).

Random weights. Usage: .venv/bin/python benchmarks/analysis_speed.py
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitviz.capture import capture  # noqa: E402
from vitviz.distance import mean_attention_distance, stream_mean_attention_distance  # noqa: E402
from vitviz.layout import TokenLayout  # noqa: E402
from vitviz.maps import query_attention_map  # noqa: E402
from vitviz.rollout import rollout, rollout_reference  # noqa: E402


def build(name, size):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, img_size=size).eval()


def full_analysis(model, x, rollout_fn=rollout):
    out = capture(model, x)
    attention = out.attention.numpy()
    for a in attention:
        rollout_fn(a, out.layout)
    mean_attention_distance(attention, out.layout)
    L, H = attention.shape[1:3]
    for a in attention:
        for layer in range(L):
            for head in range(H):
                query_attention_map(a, out.layout, layer, head, "cls")
    return out


def median_time(fn, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child(mode: str) -> None:
    """In a fresh process, print the peak extra RSS (MiB) of one workload after a warm-up forward."""
    from _memory import peak_extra_mib

    if mode == "full-L384":
        model = build("vit_large_patch16_384", 384)
        x = torch.randn(1, 3, 384, 384)
        with torch.inference_mode():
            model(x)
        extra = peak_extra_mib(lambda: full_analysis(model, x))
    else:
        n = int(mode.split("-")[1])
        model = build("vit_base_patch16_224", 224)
        with torch.inference_mode():
            model(torch.randn(8, 3, 224, 224))
        images = torch.randn(n, 3, 224, 224)
        extra = peak_extra_mib(lambda: stream_mean_attention_distance(model, images.split(8), TokenLayout.from_model(model)))
    print(json.dumps({"extra": extra}))


def measure_child(mode: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["extra"]


def main() -> None:
    print(f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}")
    model = build("vit_small_patch14_dinov2", 224)
    for batch in (1, 8):
        x = torch.randn(batch, 3, 224, 224)
        median_time(lambda: model(x), 2)
        plain = median_time(lambda: model(x))
        chain = median_time(lambda: full_analysis(model, x))
        matrix = median_time(lambda: full_analysis(model, x, rollout_reference))
        print(f"1. full analysis, bundled arch @224, batch {batch}: plain {plain:.3f} s; chain rollout {chain:.3f} s "
              f"(ratio {chain / plain:.2f}); matrix rollout {matrix:.3f} s (ratio {matrix / plain:.2f})")
    attention, layout = capture(model, x[:1]).attention[0].numpy(), TokenLayout.from_model(model)
    chain = median_time(lambda: rollout(attention, layout), 11)
    matrix = median_time(lambda: rollout_reference(attention, layout), 11)
    print(f"   rollout alone (N = {layout.num_tokens}, 12 layers, per-layer maps): chain {chain * 1e3:.1f} ms vs "
          f"matrix {matrix * 1e3:.1f} ms: ratio {chain / matrix:.2f}")

    model = build("vit_base_patch16_224", 224)
    layout = TokenLayout.from_model(model)
    images = torch.randn(32, 3, 224, 224)
    median_time(lambda: model(images[:8]), 1)
    plain = median_time(lambda: [model(b) for b in images.split(8)], 3)
    streamed = median_time(lambda: stream_mean_attention_distance(model, images.split(8), layout), 3)
    print(f"2. mean distance over 32 images (ViT-B/16, batches of 8): {32 / streamed:.1f} img/s vs plain "
          f"forward {32 / plain:.1f} img/s: throughput ratio {plain / streamed:.2f}")

    print(f"3. peak extra RSS, full analysis of one image, ViT-L/16 @384: {measure_child('full-L384'):.0f} MiB")
    for n in (8, 32):
        print(f"   peak extra RSS, streamed mean distance over {n} images (ViT-B/16): "
              f"{measure_child(f'stream-{n}'):.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
