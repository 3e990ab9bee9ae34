"""Capture overhead for Hugging Face transformers ViTs and timm hybrid ResNet+ViT models.

Prints, per model and batch size, the fastest of several runs (the least disturbed by other
processes on a shared machine; as timeit advises) of
  default  the model's own default forward (transformers: SDPA; timm: fused attention),
  eager    transformers' eager forward with output_attentions=True (HF only: the usual way),
  capture  vitviz.trace.trace_for_analysis on the model as vitviz loads it (HF: eager, loaded once),
and the ratio capture/default in the same run. Random weights; timing does not depend on them.
Usage:
    .venv/bin/python benchmarks/hf_hybrid_capture.py [--quick] [--device cuda]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402


def fastest_seconds(fns: dict, repeats: int) -> dict:
    """The fastest run of each function, the functions interleaved round by round so that load from
    other processes falls on all of them alike."""
    for fn in fns.values():
        fn()  # warm-up
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def hf_vit_b16(folder: Path, device: str):
    """ViT-B/16 @224 (transformers defaults) saved with save_pretrained and loaded as vitviz loads it."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(num_labels=1000)).save_pretrained(folder)
    ViTImageProcessor().save_pretrained(folder)
    loaded = load_model(ModelSpec(name=str(folder), device=device))
    default = ViTForImageClassification.from_pretrained(folder).eval().to(device)
    return loaded.model, default


def timm_hybrid(device: str):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_base_r50_s16_224", pretrained=False, num_classes=1000).eval().to(device)
    return model, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="batch 1 only, 3 repeats")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    batches = (1,) if args.quick else (1, 8)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        models = {"HF ViT-B/16 (transformers)": hf_vit_b16(Path(tmp), args.device),
                  "timm vit_base_r50_s16_224 (hybrid)": timm_hybrid(args.device)}
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
        print(f"{'model':38s} {'B':>2s} {'default s':>10s} {'eager s':>9s} {'capture s':>10s} {'capture/default':>16s}")
        for label, (ours, default) in models.items():
            for b in batches:
                x = torch.randn(b, 3, 224, 224, device=args.device)
                fns = {"default": lambda: default(x), "capture": lambda: capture(ours, x)}
                if ours is not default:
                    fns["eager"] = lambda: ours(pixel_values=x, output_attentions=True)
                t = fastest_seconds(fns, repeats)
                t_default, t_capture, t_eager = t["default"], t["capture"], t.get("eager", float("nan"))
                print(f"{label:38s} {b:2d} {t_default:10.3f} {t_eager:9.3f} {t_capture:10.3f} "
                      f"{t_capture / t_default:15.2f}x")


if __name__ == "__main__":
    main()
