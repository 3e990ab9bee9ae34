"""Capture overhead for Swin Transformers (window attention, vitviz.swin).

Prints, per batch size, the fastest of several interleaved runs (see hf_hybrid_capture.py) of
  default  the model's own forward as timm builds it (WindowAttention.fused_attn is timm's
           "experimental" switch, off by default: the unfused softmax path),
  sdpa     the same model with fused attention switched on (a copy): the fastest timm can do,
  capture  vitviz.trace.trace_for_analysis (the adapter's spelled-out forward; every block's window probabilities kept),
  +dist    capture and the mean attention distance within windows of every block (the page's cost),
and the ratios capture/default and capture/sdpa in the same run. Random weights.
Usage:
    .venv/bin/python benchmarks/swin_capture.py [--quick] [--model swin_tiny_patch4_window7_224]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_hybrid_capture import fastest_seconds  # noqa: E402
from vitviz import swin  # noqa: E402
from vitviz.trace import trace_for_analysis as capture  # noqa: E402


def main() -> None:
    import timm

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="batch 1 only, 3 repeats")
    parser.add_argument("--model", default="swin_tiny_patch4_window7_224")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval()
    fused = copy.deepcopy(model)
    for stage in fused.layers:
        for blk in stage.blocks:
            blk.attn.fused_attn = True
    size = model.patch_embed.img_size
    print(f"{args.model} @{size[0]}, torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    print(f"{'B':>2s} {'default s':>10s} {'sdpa s':>8s} {'capture s':>10s} {'+dist s':>8s} "
          f"{'capture/default':>16s} {'capture/sdpa':>13s}")

    def with_distance(x):
        out = capture(model, x)
        return [swin.mean_window_attention_distance(a, g) for a, g in zip(out.each("attn"), out.geometry)]

    with torch.inference_mode():
        for b in ((1,) if args.quick else (1, 8)):
            x = torch.randn(b, 3, *size)
            t = fastest_seconds({"default": lambda: model(x), "sdpa": lambda: fused(x),
                                 "capture": lambda: capture(model, x), "dist": lambda: with_distance(x)}, repeats)
            print(f"{b:2d} {t['default']:10.3f} {t['sdpa']:8.3f} {t['capture']:10.3f} {t['dist']:8.3f} "
                  f"{t['capture'] / t['default']:15.2f}x {t['capture'] / t['sdpa']:12.2f}x")


if __name__ == "__main__":
    main()
