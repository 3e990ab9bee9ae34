"""``python -m vitviz registers INPUT ... --out DIR``: high-norm outlier tokens and the MLP neurons that write them."""
from __future__ import annotations

import argparse

from ..errors import VitvizError
from ..io.output import check_writable
from .options import add_inputs, add_model, add_out, decode, expand, no_image, skipped_records, spec_of, versions


def add_parser(sub) -> None:
    regs = sub.add_parser(
        "registers",
        help="find high-norm outlier tokens and the MLP neurons that write them (register neurons)",
        description="Run a ViT on an image set; write DIR/registers.json (the outlier threshold, the layer where "
                    "outliers emerge, 1-based, and the register neurons best first: layer 1-based, index, score) and "
                    "DIR/norms.parquet (every token's output norm per image and layer). Give the json to "
                    "`analyze --registers` to run with a test-time register.")
    add_inputs(regs)
    add_out(regs)
    add_model(regs)
    regs.add_argument("--threshold", type=float, default=10.0, metavar="F",
                      help="a patch is an outlier when its output norm exceeds F x the median patch norm of its image "
                           "and layer (default 10, Darcet et al.)")
    regs.add_argument("--detect-layer", type=int, metavar="L",
                      help="the layer (1-based) whose outliers are the positions the neurons are scored at "
                           "(default: the last, as Jiang et al.)")
    regs.add_argument("--top", type=int, default=50, metavar="K", help="neurons to list (default 50)")


def run(args: argparse.Namespace) -> int:
    """Outliers and register neurons of an image set: registers.json and norms.parquet, each whole or not at all."""
    from ..analyses.registers import OUTLIER_FACTOR
    from ..runs.registers_run import REGISTERS_NAME, search_images, write_search
    from ..sources.models import load_model
    from .options import check_batch_size

    check_batch_size(args)
    if args.threshold <= 1:
        raise VitvizError(f"--threshold is a multiple of the median norm and must be above 1, not {args.threshold:g}.")
    if args.top < 1:
        raise VitvizError(f"--top must be 1 or more, not {args.top}.")
    check_writable(args.out)
    files, problems = expand(args)
    images, image_names, bad = decode(files)
    if not images:
        return no_image()
    loaded = load_model(spec_of(args))
    if loaded.attention_scope == "window":
        raise VitvizError(f"{loaded.label} attends within shifted windows and has no prefix tokens to take a register; "
                          "registers reads models whose tokens attend to every token.")
    depth = loaded.adapter.num_layers(loaded.model)
    if args.detect_layer is not None and not 1 <= args.detect_layer <= depth:
        raise VitvizError(f"--detect-layer {args.detect_layer} is not a layer of this model (1 to {depth}).")
    search = search_images(loaded, images, args.batch_size, args.threshold,
                           -1 if args.detect_layer is None else args.detect_layer - 1, args.top)
    write_search(args.out, search, image_names, {
        "command": "registers", "model": loaded.card(), "versions": versions(),
        "skipped": skipped_records(problems + bad), "default_threshold": OUTLIER_FACTOR})
    o = search.outliers
    if search.neurons:
        best = search.neurons[0]
        print(f"outliers emerge in layer {o.emergence_layer + 1}; best register neuron: layer {best.layer + 1}, "
              f"unit {best.index}; wrote {args.out / REGISTERS_NAME}")
    else:
        print(f"no outliers (largest patch norm {o.ratio.max():.2f}x the median, threshold {o.factor:g}x): nothing to "
              f"repair; wrote {args.out / REGISTERS_NAME}")
    return 0
