"""``python -m vitviz probe INPUT... (--labels FILE | --folders | --patch-masks DIR) [--layer L] [--pooling P] --out DIR``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import VitvizError
from .options import ENGINE_WORKERS_HELP, Progress, add_engine, add_model, add_out, engine_of, open_lens

POOLINGS = ("cls", "mean", "cls+mean")  # vitviz.probes.features.POOLINGS, without importing torch for --help


def add_parser(sub) -> None:
    probe = sub.add_parser(
        "probe",
        help="train a linear probe on every layer for labelled images (write the best, or --layer's, as a head) or "
             "for patches painted as a concept (--patch-masks)",
        description="Score a logistic-regression probe on every layer (nested stratified cross-validation: accuracy, "
                    "its 95%% Wilson interval, the majority-class chance level) and write DIR/probe.safetensors "
                    "(weight (K, D), bias (K,): logits = pooled @ weight.T + bias) and DIR/probe.json (model, layer, "
                    "pooling, classes in the head's order, accuracy per layer, chance, sklearn version, image "
                    "hashes). Give it to analyze --head or vitviz.open(head=...). With --patch-masks: a probe on the "
                    "patch tokens of every layer for a painted concept (README: Concepts painted on the image).")
    probe.add_argument("inputs", nargs="*", type=Path, metavar="INPUT",
                       help="with --folders: folders of class folders (root/<class>/*.jpg); with --labels: optional, "
                            "the folder the label file's relative paths start from (default the label file's folder); "
                            "with --patch-masks: images, or folders of them")
    source = probe.add_mutually_exclusive_group(required=True)
    source.add_argument("--labels", type=Path, metavar="FILE",
                        help="a CSV (header path,label) or Parquet file (columns path, label): one image per row")
    source.add_argument("--folders", action="store_true", help="each INPUT holds one folder of images per class")
    source.add_argument("--patch-masks", type=Path, metavar="DIR",
                        help="a painted concept: INPUTs are images (or folders of them); DIR/<image stem>.png marks "
                             "the concept's patches white (the image's size or one pixel per patch), optional "
                             "DIR/<stem>.not.png marks not-concept patches; an image without a mask is only mapped. "
                             "Writes a patch probe of every layer (probe.safetensors weight (L, D), bias (L,)), "
                             "probe.json and concept_maps.npz (probability (n, L, gh, gw))")
    add_out(probe)
    probe.add_argument("--layer", type=int, metavar="L",
                       help="the head's layer, 1-based (default: the most accurate; every layer is scored anyway)")
    probe.add_argument("--pooling", default="cls", choices=list(POOLINGS),
                       help="cls: the pooled vector as the model pools it, through the final norm (default); mean: "
                            "the mean of the normed patch tokens; cls+mean: both concatenated (DINOv2's linear eval)")
    add_model(probe)
    probe.add_argument("--seed", type=int, default=0, help="the cross-validation folds' shuffling")
    add_engine(probe, ENGINE_WORKERS_HELP)


def run(args: argparse.Namespace) -> int:
    if args.patch_masks is not None:
        return run_concept(args)
    from ..io.output import check_writable
    from ..probes.collect import collect_features, remove_parts
    from ..probes.data import from_folders, from_label_file
    from ..probes.probe import fit

    if args.folders and not args.inputs:
        raise VitvizError("--folders needs at least one INPUT folder of class folders (root/<class>/*.jpg).")
    if args.labels is not None and len(args.inputs) > 1:
        raise VitvizError("with --labels, give at most one INPUT: the folder the label file's paths start from.")
    images = from_folders(args.inputs) if args.folders else from_label_file(
        args.labels, args.inputs[0] if args.inputs else None)
    engine = engine_of(args)
    check_writable(args.out)
    lens = open_lens(args)
    if args.layer is not None and not 1 <= args.layer <= lens.num_layers:
        raise VitvizError(f"--layer {args.layer} is not a layer of {lens.label}: its layers are 1 to {lens.num_layers}.")
    n = len(images.paths)
    print(f"{n} images in {len(images.classes)} classes ({', '.join(images.classes)}); {lens.label}, "
          f"{lens.num_layers} layers, {args.pooling} pooling", file=sys.stderr)
    start = time.perf_counter()
    # a bar on a terminal, one line per step in a log or pipe (a "\r" line there reads "features 1/4^Mfeatures 2/4")
    bar = Progress(n, desc="features")
    features = collect_features(lens, images, args.pooling, args.batch_size, engine, args.out, bar.update)
    bar.close()
    result = fit(lens, images, pooling=args.pooling, layer=args.layer, seed=args.seed, features=features)
    path = result.save(args.out)
    remove_parts(args.out)  # the files hold everything now
    print(f"features and probes of {lens.num_layers} layers in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print("layer  accuracy  95% interval  C (folds at the grid's end)")
    for s in result.layers:
        mark = "  <- head" if s.layer == result.layer else ""
        print(f"{s.layer:5d}  {s.accuracy:8.3f}  {s.low:.3f}-{s.high:.3f}   {s.C:g} ({s.C_at_edge}/{s.folds}){mark}")
    print(f"chance (largest class): {result.chance:.3f}")
    note = result.C_search.note() if result.C_search else None
    if note:
        print(f"note: the head's {note}", file=sys.stderr)
    print(f"wrote {path} and {path.parent / 'probe.json'}")
    return 0


def run_concept(args: argparse.Namespace) -> int:
    """``probe INPUT... --patch-masks DIR --out OUT``: patch probes of every layer from mask PNGs."""
    from ..io.output import check_writable
    from ..probes.concepts import HOLDOUT, LABEL_RULE, fit_concept
    from ..probes.masks import painted_from_masks

    if not args.inputs:
        raise VitvizError("--patch-masks needs the images as INPUTs (files, or folders of them).")
    if args.layer is not None:
        raise VitvizError("--layer picks an image probe's head layer; with --patch-masks every layer's patch probe is "
                          "written (row l-1 of weight is layer l's).")
    if args.engine != "local":
        raise VitvizError("--patch-masks runs in this process (a painted set is a few images: one forward each); "
                          "leave out --engine ray.")
    check_writable(args.out)
    lens = open_lens(args)
    painted = painted_from_masks(lens, args.inputs, args.patch_masks)
    n = len(painted.images)
    start = time.perf_counter()
    bar = Progress(n, desc="tokens")
    concept = fit_concept(lens, painted, batch_size=args.batch_size, seed=args.seed, progress=bar.update)
    bar.close()
    print(f"tokens and patch probes of {lens.num_layers} layers in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)
    for im in concept.images:
        print(f"{im['name']}: {im['concept']} concept, {im['not_concept']} not-concept, {im['left_out']} left out",
              file=sys.stderr)
    print(f"labels: {LABEL_RULE}; hold-out: {HOLDOUT[concept.holdout]}", file=sys.stderr)
    print("layer  balanced accuracy  accuracy")
    for s in concept.layers:
        print(f"{s.layer:5d}  {s.balanced_accuracy:17.3f}  {s.accuracy:8.3f}")
    print(f"chance: balanced 0.500, plain {concept.chance:.3f} (the larger class)")
    path = concept.save(args.out)
    print(f"wrote {path}, {path.parent / 'probe.json'} and {path.parent / 'concept_maps.npz'}")
    return 0
