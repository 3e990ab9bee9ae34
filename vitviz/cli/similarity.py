"""``python -m vitviz similarity INPUT ... --model A [--model B] --out DIR``: CKA between every layer of A and every
layer of B (of A alone: the within-model map) over an image set, as ``DIR/cka.parquet`` and ``DIR/settings.json``.

One result written whole or not at all (not resumable: the estimate's sums are kept in memory, a few kB, and an
interrupted run leaves the previous files as they were)."""
from __future__ import annotations

import argparse
import io
import json
import sys

from ..errors import VitvizError
from ..io.atomic import atomic_write_bytes, signals_held
from ..io.output import check_writable
from .options import Progress, add_inputs, add_model, add_out, expand, no_image, spec_of, versions

CKA_NAME = "cka.parquet"
SETTINGS_NAME = "settings.json"
COLUMN_DOCS = {
    "layer_a, layer_b": "0-based layer of the first and second --model (the app shows 1-based); a CNN's stages in "
                        "forward order (their module names: settings.json layers_a / layers_b)",
    "cka": "minibatch CKA with the unbiased HSIC, 0 (unrelated) to 1 (the same up to rotation and scale)",
    "low, high": "the 95 % Bayesian bootstrap interval over images (settings.json interval); empty with --bootstrap 0",
    "images": "images the estimate used",
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "similarity",
        help="how layers relate: CKA of every layer against every layer, within one model or between two",
        description="Run the images through one or two models and write the centred kernel alignment (CKA) of every "
                    "layer of the first --model against every layer of the second (or of the first again) to "
                    "DIR/cka.parquet (layer_a, layer_b, cka, low, high, images) and DIR/settings.json. The estimate "
                    "is minibatch CKA with the unbiased HSIC (Nguyen, Raghu & Kornblith, ICLR 2021): memory does "
                    "not grow with the number of images. Give --model once for the within-model map, twice to "
                    "compare two models; a timm CNN (resnet50, convnext_tiny, ...) may be either model: its stages "
                    "are compared. --batch-size is the minibatch (4 or more).")
    add_inputs(p)
    add_model(p, per_model=True, batch_size=32)  # --batch-size: images per minibatch and per forward (4 or more)
    p.add_argument("--point", default="resid_post",
                   help="a ViT's token point per block (default resid_post: each block's output; also resid_pre, "
                        "resid_mid, ln1, ln2, attn_out, mlp_out, mlp_hidden)")
    p.add_argument("--pooling", default="tokens", choices=["tokens", "mean", "cls"],
                   help="one image's features: its patch tokens flattened position by position (tokens), their mean "
                        "(mean), or its CLS token (cls)")
    p.add_argument("--kernel", default="linear", choices=["linear", "rbf"],
                   help="linear CKA, or RBF with a width of --rbf-threshold x the median distance")
    p.add_argument("--rbf-threshold", type=float, default=1.0, metavar="T", help="RBF width (default 1.0)")
    p.add_argument("--bootstrap", type=int, default=200, metavar="R",
                   help="bootstrap replicates of the interval (default 200; 0: none)")
    add_out(p)


def run(args: argparse.Namespace) -> int:
    from ..runs.similarity_run import TooFewImages, open_features, similarity

    models = args.model or ["bundled"]
    if len(models) > 2:
        raise VitvizError(f"{len(models)} --model: similarity compares one model with itself or two models.")
    checkpoints = args.checkpoint or ["-"] * len(models)
    if len(checkpoints) != len(models):
        raise VitvizError(f"{len(checkpoints)} --checkpoint for {len(models)} --model: give one per --model, in the "
                          "same order ('-' for a model without).")
    checkpoints = [None if c == "-" else c for c in checkpoints]
    check_writable(args.out)
    files, problems = expand(args)
    if not files:
        return no_image()
    side_a = open_features(spec_of(args, models[0], checkpoints[0]))
    side_b = side_a if len(models) == 1 else open_features(spec_of(args, models[1], checkpoints[1]))
    progress = Progress(len(files), desc="similarity")
    try:
        result = similarity(side_a, side_b, [f.path for f in files], point=args.point, pooling=args.pooling,
                            batch_size=args.batch_size, kernel=args.kernel, threshold=args.rbf_threshold,
                            bootstrap=args.bootstrap, progress=lambda done, _total: progress.update(done))
    except TooFewImages as exc:
        for name, reason in exc.skipped:
            print(f"skipped {name}: {reason}", file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return no_image()
    finally:
        progress.close()
    for name, reason in result.settings["skipped"]:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    buffer = io.BytesIO()
    result.table().to_parquet(buffer, index=False)
    settings = {"command": "similarity", "versions": versions(),
                "inputs": list(args.inputs), "models": models, "checkpoints": checkpoints,
                "img_size": args.img_size, "device": args.device, "dtype": args.dtype,
                "layers_a": list(result.layers_a), "layers_b": list(result.layers_b),
                "columns": COLUMN_DOCS,
                "skipped": [{"name": n, "reason": r} for n, r in result.settings["skipped"]]
                + [{"name": p.name, "reason": p.reason} for p in problems]} | {
        k: v for k, v in result.settings.items() if k != "skipped"}
    with signals_held():  # the two files belong together: both renamed, or neither
        atomic_write_bytes(args.out / CKA_NAME, buffer.getvalue())
        atomic_write_bytes(args.out / SETTINGS_NAME, (json.dumps(settings, indent=2) + "\n").encode())
    shape = result.cka.shape
    print(f"{shape[0]} x {shape[1]} layers over {result.images} image(s) in {result.settings['minibatches']} "
          f"minibatch(es): {args.out / CKA_NAME}")
    return 0
