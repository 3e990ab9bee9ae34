"""Capture overhead of the Hugging Face adapters' forward against transformers' own plain forward.

For each transformers family, a ViT-Ti-sized random model (192 wide, 12 layers, 3 heads, 224 px, or
``--image-size``) is saved with save_pretrained and loaded as vitviz loads it. Prints the fastest of
several interleaved runs (the least disturbed by other processes) of
  default  the model's own default forward (SDPA), loaded by transformers itself,
  eager    transformers' eager forward with output_attentions=True (the usual way to read attention),
  capture  vitviz.trace.trace_for_analysis (every layer's attention, token norms, final features, logits),
and the ratios capture/default and eager/default in the same run. Run it from two checkouts (PYTHONPATH)
to compare a change; a family the checkout does not read is skipped.
Usage:
    .venv/bin/python benchmarks/hf_capture_overhead.py [--batch 8] [--repeats 5] [--families vit,beit] [--image-size 112] [--clock cpu]
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
from vitviz.errors import ModelError  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

TINY = dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768, image_size=224,
            patch_size=16)
FAMILIES = {  # name: (config class, model class, config overrides)
    "vit": ("ViTConfig", "ViTForImageClassification", {"num_labels": 1000}),
    "dinov2_with_registers": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", {"num_register_tokens": 4}),
    "clip": ("CLIPVisionConfig", "CLIPVisionModel", {}),
    "beit": ("BeitConfig", "BeitForImageClassification", {"use_relative_position_bias": True, "num_labels": 1000}),
    "dinov3_vit": ("DINOv3ViTConfig", "DINOv3ViTModel", {"num_register_tokens": 4}),
}


def fastest_seconds(fns: dict, repeats: int, clock=time.perf_counter) -> dict:
    """The fastest run of each function by ``clock``, the functions interleaved round by round so that load from
    other processes falls on all of them alike (``time.process_time``: this process's CPU time, which other
    processes on a shared machine disturb far less than the wall clock)."""
    for fn in fns.values():
        fn()  # warm-up
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
    return best


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--image-size", type=int, default=224, help="a smaller size for a loaded machine")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU time (a shared, loaded machine)")
    args = parser.parse_args()
    size = args.image_size
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
          f"batch {args.batch}, {size} px, best of {args.repeats}, {args.clock} clock")
    print(f"{'family':24s} {'default s':>10s} {'eager s':>9s} {'capture s':>10s} {'eager/default':>14s} "
          f"{'capture/default':>16s}")
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        for family in args.families.split(","):
            config_cls, model_cls, extra = FAMILIES[family]
            folder = Path(tmp) / family
            torch.manual_seed(0)
            cls = getattr(transformers, model_cls)
            cls(getattr(transformers, config_cls)(**(TINY | extra | {"image_size": size}))).save_pretrained(folder)
            try:
                ours = load_model(ModelSpec(name=str(folder))).model
            except ModelError as exc:
                print(f"{family:24s} skipped: {exc}")
                continue
            default = cls.from_pretrained(folder).eval()
            x = torch.randn(args.batch, 3, size, size)
            t = fastest_seconds({"default": lambda: default(pixel_values=x),
                                 "eager": lambda: ours(pixel_values=x, output_attentions=True),
                                 "capture": lambda: capture(ours, x)}, args.repeats, clock)
            print(f"{family:24s} {t['default']:10.3f} {t['eager']:9.3f} {t['capture']:10.3f} "
                  f"{t['eager'] / t['default']:14.2f} {t['capture'] / t['default']:16.2f}", flush=True)


if __name__ == "__main__":
    main()
