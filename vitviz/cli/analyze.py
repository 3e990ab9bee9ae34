"""``python -m vitviz analyze IMAGE ... --out DIR``: every layer's attention and the app's analyses for some images,
into DIR/analysis.npz and DIR/settings.json (the run itself: :mod:`vitviz.runs.analyze`)."""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from ..errors import VitvizError
from ..io.output import check_writable
from .options import EXIT_NO_IMAGE, Progress, add_model, add_out, skipped_records, spec_of
from ..words import counted

# Options of analyses defined on attention over the whole sequence, with their defaults.
GLOBAL_ATTENTION_OPTIONS = {"fusion": "mean", "discard": 0.0, "start_layer": 1, "end_layer": None,
                            "exclude_artifacts": False, "exclude_sinks": False, "target_class": None,
                            "faithfulness": False, "flow": False, "clusters": None, "cluster_layer": None,
                            "report": False, "format": None, "attribution": None, "registers": None, "register_neurons": None}


def add_parser(sub) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="capture the attention of every layer and head for some images",
        description="Run a ViT on images and write DIR/analysis.npz (input, attention, features, logits) "
                    "and DIR/settings.json (model, weights, versions, image hashes, token layout, device). "
                    "Bad image files are reported on stderr and skipped; the exit status is non-zero "
                    "only when no image could be analysed.",
    )
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE", help="image files (jpg, png, webp, ...)")
    add_out(analyze)
    add_model(analyze, labels=True, head=True)
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
    analyze.add_argument("--format", metavar="FMT[,FMT]", default=None,
                         help="--report's formats, png, svg and/or pdf (e.g. svg,pdf; default png): SVG and PDF keep "
                              "titles, labels and colour bars as text; a given --format also writes per image every "
                              "head of four layers (one colour scale) and the maps side by side")
    analyze.add_argument("--no-attention", action="store_true",
                         help="leave the raw attention (B, L, H, N, N) out of analysis.npz (every analysis still runs)")


def image_batches(paths: list[Path], size: int, problems: list):
    """Decode the files ``size`` good images at a time: yields (files done, [LoadedImage]); bad files go to ``problems``."""
    from ..io.images import load_images

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


def _report_formats(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--format``'s formats, checked before any model work; None without ``--format`` (the PNGs as before)."""
    if args.format is None:
        return None
    if not args.report:
        raise VitvizError("--format says which files --report writes: add --report.")
    from ..figures.analysis_report import parse_formats

    return parse_formats(args.format)


def _attribution_methods(text: str | None) -> tuple[str, ...]:
    """``--attribution``'s methods, checked before any model work."""
    if text is None:
        return ()
    from ..explainers import parse_methods

    return tuple(parse_methods(text))


def run(args: argparse.Namespace) -> int:
    """Stream the images through the model batch by batch; write the run's files whole or not at all."""
    if args.cluster_layer is not None and args.clusters is None:
        raise VitvizError("--cluster-layer needs --clusters K: the number of clusters to make.")
    check_writable(args.out)  # before any model work: a wrong --out costs nothing
    report_formats = _report_formats(args)

    from ..settings import Settings
    from ..sources.budget import admit, admit_fitted
    from ..sources.models import load_model

    spec = spec_of(args)
    # The app's check, before the model runs: one batch's attention must fit half the machine
    # (or half of VITVIZ_CACHE_MB); the streamed run holds nothing bigger.
    limits, batch = Settings.from_env(memory_share=1.0), min(args.batch_size, len(args.images))
    admit(spec, limits, batch=batch)

    problems: list = []
    batches = image_batches(args.images, args.batch_size, problems)
    first = next(batches, None)
    if first is None:
        print("error: no image could be analysed.", file=sys.stderr)
        return EXIT_NO_IMAGE

    attribution = _attribution_methods(args.attribution)
    loaded = load_model(spec)
    admit_fitted(loaded, limits, batch=batch)  # a checkpoint's own resolution and tokens, known once it is read
    batches = itertools.chain([first], batches)
    progress = Progress(len(args.images))
    window = loaded.attention_scope == "window"
    if window:
        from ..runs.analyze import write_window_analysis as write

        settings, extra = _window_settings(args, loaded, attribution), {}
    else:
        from ..runs.analyze import write_analysis as write

        edit, layout, register_info = _register(args, loaded)
        settings = _settings(args, attribution)
        extra = {"report": args.report, "report_formats": report_formats, "edit": edit, "layout": layout,
                 "register_info": register_info}
    try:
        written = write(args.out, loaded, batches, settings, keep_attention=not args.no_attention,
                        skipped=_Skipped(problems), progress=progress.update, **extra)
    finally:
        progress.close()
    print(f"analysed {counted(len(written.images), 'image')} with {loaded.label} on {loaded.device}"
          f"{' (window attention)' if window else ''}; wrote {args.out}/analysis.npz")
    return 0


class _Skipped:
    """The skipped files' records, read when settings.json is written (after the last batch was decoded)."""

    def __init__(self, problems: list):
        self.problems = problems

    def __iter__(self):
        return iter(skipped_records(self.problems))


def _register(args: argparse.Namespace, loaded):
    """--registers' edit of the forward, its token layout and its record (None, None, None without it)."""
    if args.registers is None:
        if args.register_neurons is not None:
            raise VitvizError("--register-neurons needs --registers JSON: the file whose neurons it counts.")
        return None, None, None
    from ..runs.registers_run import load_register

    if args.faithfulness or args.cluster_layer is not None:
        raise VitvizError("--registers runs the analyses of one forward with the register; --faithfulness and "
                          "--cluster-layer run forwards of their own and cannot take it yet.")
    register, data = load_register(args.registers, loaded.model, loaded.layout, args.register_neurons,
                                   args.register_init)
    info = register.to_dict() | {"file": str(args.registers), "threshold": data.get("threshold"),
                                 "emergence_layer": data.get("emergence_layer")}
    return register.edit(loaded.layout), register.layout(loaded.layout), info


def _settings(args: argparse.Namespace, attribution: tuple[str, ...]):
    """The analyses' settings from the command's options (global attention)."""
    from ..runs.analysis import AnalysisSettings

    return AnalysisSettings(fusion=args.fusion, discard=args.discard, start_layer=args.start_layer - 1,
                            end_layer=args.end_layer, exclude_artifacts=args.exclude_artifacts,
                            exclude_sinks=args.exclude_sinks, faithfulness=args.faithfulness,
                            faithfulness_steps=args.faithfulness_steps, flow=args.flow,
                            target_class=args.target_class, batch_size=args.batch_size, clusters=args.clusters,
                            cluster_layer=None if args.cluster_layer is None else args.cluster_layer - 1,
                            attribution=attribution)


def _window_settings(args: argparse.Namespace, loaded, attribution: tuple[str, ...]):
    """Window models (Swin) take --attribution and --target-class; the other analyses are refused with a sentence."""
    from ..runs.analysis import AnalysisSettings
    from ..runs.analyze import window_settings

    applies = window_settings(bool(attribution))
    given = [f"--{name.replace('_', '-')}" for name, default in GLOBAL_ATTENTION_OPTIONS.items()
             if name not in applies and getattr(args, name) != default]
    if given:
        raise VitvizError(f"{loaded.label} attends within shifted windows (no CLS token, no attention over the whole "
                          f"image): {', '.join(given)} do not apply to it; without them analyze writes its window "
                          "attention and the mean attention distance within windows per block.")
    return AnalysisSettings(target_class=args.target_class, attribution=attribution)
