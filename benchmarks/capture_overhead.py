"""Capture overhead: vitviz capture vs the plain fused forward vs the usual hook baseline.

Prints, per model and batch size, the median time of
  plain    model(x) with timm's fused attention (what the model costs anyway),
  capture  vitviz.trace.trace_for_analysis(model, x) (all layers' attention, features, logits),
  hooks    fused attention turned off on a copy + forward hooks on attn_drop (vit-explain /
           timm AttentionExtract style),
and the ratios capture/plain and hooks/plain. Then peak extra RSS of capture over the plain
forward for ViT-L/16 @384, each measured in a fresh subprocess.

Random weights (timing does not depend on them). ``--families`` times EVA-02, BEiT and a rotary ViT
instead (their rotary embedding and relative position bias are in capture's attention and in the
hook baseline's unfused path alike). Usage:
    .venv/bin/python benchmarks/capture_overhead.py [--quick] [--families] [--device cuda]
"""
from __future__ import annotations

import argparse
import copy
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
from vitviz.trace import trace_for_analysis as capture  # noqa: E402

MODELS = [
    ("bundled (vit_small_patch14_dinov2)", "vit_small_patch14_dinov2", 224),
    ("ViT-B/16", "vit_base_patch16_224", 224),
    ("ViT-L/16", "vit_large_patch16_384", 384),
]
FAMILY_MODELS = [
    ("EVA-02 S/14 (RoPE, SwiGLU)", "eva02_small_patch14_224", 224),
    ("BEiT-B/16 (relative position bias)", "beit_base_patch16_224", 224),
    ("rotary ViT-B/16 (reg1, gap)", "vit_base_patch16_rope_reg1_gap_256", 256),
]


def build(name: str, img_size: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, img_size=img_size).eval().to(device)


def hook_baseline(model: torch.nn.Module):
    """The usual way: a copy with fused attention off, softmax outputs caught at attn_drop."""
    unfused = copy.deepcopy(model)
    store = []
    for blk in unfused.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: store.append(o.float().cpu()))

    def run(x):
        store.clear()
        out = unfused(x)
        return torch.stack(store, dim=1), out

    return run


def timed(fn, x, repeats: int, device: str) -> list[float]:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def peak_rss_child(name: str, img_size: int, batch: int) -> None:
    """In a fresh process: peak extra RSS of the plain forward and of capture (MiB)."""
    from _memory import peak_extra_mib

    model = build(name, img_size, "cpu")
    x = torch.randn(batch, 3, img_size, img_size)
    with torch.inference_mode():
        model(x)
        plain = peak_extra_mib(lambda: model(x))
        hooks = hook_baseline(model)
        hooked = peak_extra_mib(lambda: hooks(x))
        del hooks  # free the unfused copy before capture is measured
    captured = peak_extra_mib(lambda: capture(model, x))
    attention_mib = len(model.blocks) * model.blocks[0].attn.num_heads * batch * (x.shape[-1] // 16) ** 4 / 2**18
    print(json.dumps({"plain": plain, "capture": captured, "hooks": hooked, "attention_mib": attention_mib}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, batch 1 only")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--families", action="store_true", help="EVA-02, BEiT and a rotary ViT; no memory run")
    parser.add_argument("--only", help="run only the models whose label contains this, e.g. ViT-L")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 and 8; --quick: 1)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default 7 small, 3 large)")
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        name, size, batch = args.memory_child
        return peak_rss_child(name, int(size), int(batch))

    print(f"torch {torch.__version__}, timm {timm.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'model':36s} {'B':>2s} {'plain s':>8s} {'capture s':>9s} {'hooks s':>8s} {'capture/plain':>13s} {'hooks/plain':>11s}")
    batches = args.batches or ((1,) if args.quick else (1, 8))
    for label, name, size in FAMILY_MODELS if args.families else MODELS:
        if args.only and args.only not in label:
            continue
        model = build(name, size, args.device)
        hooks = hook_baseline(model)
        for batch in batches:
            x = torch.randn(batch, 3, size, size, device=args.device)
            repeats = args.repeats or (3 if (args.quick or size > 224 or batch > 1) else 7)
            runs = {"plain": model, "capture": lambda t: capture(model, t), "hooks": hooks}
            for fn in runs.values():  # warm-up
                timed(fn, x, 1, args.device)
            times = {k: [] for k in runs}
            for _ in range(repeats):  # interleaved so drift hits all three alike
                for k, fn in runs.items():
                    times[k] += timed(fn, x, 1, args.device)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{label:36s} {batch:2d} {med['plain']:8.3f} {med['capture']:9.3f} {med['hooks']:8.3f} "
                  f"{med['capture'] / med['plain']:13.2f} {med['hooks'] / med['plain']:11.2f}", flush=True)

    if args.device == "cpu" and not args.families and (not args.only or args.only in "ViT-L/16"):
        for batch in batches:
            out = subprocess.run([sys.executable, __file__, "--memory-child", "vit_large_patch16_384", "384", str(batch)],
                                 capture_output=True, text=True, check=True)
            m = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"ViT-L/16 @384 B={batch}: peak extra RSS plain forward {m['plain']:.0f} MiB, capture "
                  f"{m['capture']:.0f} MiB, hooks baseline {m['hooks']:.0f} MiB; capture - plain = "
                  f"{m['capture'] - m['plain']:.0f} MiB (the attention itself is about {m['attention_mib']:.0f} MiB)")


if __name__ == "__main__":
    main()
