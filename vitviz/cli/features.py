"""``python -m vitviz features train|top``: sparse autoencoders on one layer's tokens (:mod:`vitviz.features`)."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from ..errors import VitvizError
from .options import (ENGINE_WORKERS_HELP, add_batch_size, add_device, add_engine, add_inputs, add_model, add_out,
                      engine_of, expand, open_lens)

CLASSES = "nearest_classes.json"  # beside the Parquet file: each latent's nearest classes (vitviz.features.classes)


def add_parser(sub) -> None:
    """The ``features`` command and its subcommands, on vitviz.cli's subparsers."""
    features = sub.add_parser("features", help="sparse autoencoders (SAEs) on a layer's tokens: train, top patches",
                              description="Sparse autoencoders on one layer's tokens of your images.")
    cmds = features.add_subparsers(dest="features_command", required=True)

    train = cmds.add_parser(
        "train", help="train a TopK SAE on one layer's patch tokens (streamed, resumable)",
        description="Stream the images through the model (each forward stopped at the point), train a TopK SAE "
                    "(Gao et al. 2024; auxiliary-k loss for dead latents) on the patch tokens and write "
                    "DIR/sae.safetensors and DIR/sae.json. DIR/checkpoint.pt holds the training state after every "
                    "batch of images: the same command continues a run that was stopped.")
    add_inputs(train)
    add_model(train, dtype=False, batch_size=8)
    train.add_argument("--point", default="resid_post",
                       help="the point read in the block (default resid_post): resid_pre, ln1, attn_out, resid_mid, "
                            "ln2, mlp_hidden, mlp_out, resid_post")
    train.add_argument("--layer", type=int, required=True, metavar="L", help="block, 1-based")
    train.add_argument("--latents", type=int, required=True, metavar="K", help="latents (dictionary size)")
    train.add_argument("--topk", type=int, required=True, metavar="k", help="latents active per token")
    train.add_argument("--epochs", type=int,
                       help="passes over the images (default: until the explained variance stops rising: at least "
                            "one pass and 2,000 steps, small image sets repeated, at most 50,000 steps)")
    train.add_argument("--batch-tokens", type=int, default=1024, metavar="T",
                       help="tokens per SAE step (default 1024)")
    train.add_argument("--prefix", action="store_true", help="train on the prefix tokens (CLS, registers) too")
    train.add_argument("--seed", type=int, default=0, help="initialisation and token order (default 0)")
    train.add_argument("--lr", type=float, help="Adam's learning rate (default 2e-4 / sqrt(K / 16384))")
    add_out(train, resume=True)
    train.add_argument("--shards", type=Path, metavar="DIR",
                       help="write the layer's tokens once as float16 shards in DIR and train from them (every epoch, "
                            "and later runs on the same images, read them instead of running the model)")
    add_engine(train, ENGINE_WORKERS_HELP)

    top = cmds.add_parser(
        "top", help="the top-activating patches of every latent over an image set (Parquet)",
        description="Encode every patch token of the images with the SAE in DIR and write DIR/top.parquet: for "
                    "each latent its top-n (image, patch, activation) rows; patch is the 0-based index in raster "
                    "order (row * grid width + column). For models with a classifier head (or --head), "
                    f"{CLASSES} beside it gives each of those latents' nearest classes: the cosine of its decoder "
                    "direction with each class's readout direction (a logit lens: final norm, pooling, head; later "
                    "blocks skipped).")
    top.add_argument("sae", type=Path, metavar="DIR", help="a folder written by features train")
    add_inputs(top)
    top.add_argument("--top", type=int, default=16, metavar="N", help="rows per latent (default 16)")
    add_batch_size(top)
    top.add_argument("--out", type=Path, metavar="FILE", help="the Parquet file (default DIR/top.parquet)")
    top.add_argument("--sheets", metavar="J,J,...",
                     help="latents (0-based) to draw as contact sheets: latent_J.png beside the Parquet file")
    add_device(top)
    top.add_argument("--head", type=Path, metavar="PROBE",
                     help="a probe.safetensors (python -m vitviz probe) as the model's classifier, for "
                          f"{CLASSES} (models with their own head need none)")


def run(args: argparse.Namespace) -> int:
    """Run ``features train`` or ``features top``; user mistakes raise VitvizError (vitviz.cli prints it)."""
    from ..io.lock import output_lock
    from ..io.output import check_writable

    files, problems = expand(args)
    if not files:
        print("error: no image could be read.", file=sys.stderr)
        return 1
    if args.features_command == "train":
        from contextlib import ExitStack

        with ExitStack() as held:
            for folder in filter(None, (args.out, args.shards)):  # the shards folder has one writer too
                check_writable(folder)
                held.enter_context(output_lock(folder, "features train"))
            return _train(args, files)
    out = args.out or args.sae / "top.parquet"
    with output_lock(out.parent, "features top"):
        return _top(args, files, out)


def _train(args, files) -> int:
    from ..features.sae import Convergence, NotConvergedWarning
    from ..features.train import TrainSettings, train

    settings = TrainSettings(point=args.point, layer=args.layer, latents=args.latents, topk=args.topk, seed=args.seed,
                             epochs=args.epochs, batch_size=args.batch_size, batch_tokens=args.batch_tokens,
                             prefix=args.prefix, lr=args.lr)
    settings.check()
    engine = engine_of(args)
    lens = open_lens(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotConvergedWarning)  # said below as a sentence, not as a Python warning
        sae = train(lens, files, settings, args.out, progress=True, engine=engine, shards=args.shards)
    m, t = sae.info["metrics"], sae.info["training"]
    over = "last epoch" if settings.epochs else f"last {Convergence().window} steps"
    why = ("when the explained variance stopped rising" if t["stop_reason"] == "plateau" else
           f"on its budget ({t['budget']})")
    print(f"wrote {args.out / 'sae.safetensors'} and sae.json: {sae.latents} latents, k = {sae.topk}; stopped {why} "
          f"after {t['steps']} steps ({t['epochs_run']:g} epochs); training explained variance "
          f"{m['explained_variance']:.3f} ({over}), L0 {m['l0']:.1f}, dead {m['dead_fraction']:.1%}", file=sys.stderr)
    if t["warning"]:
        print(f"warning: {t['warning']}", file=sys.stderr)
    return 0


def _top(args, files, out: Path) -> int:
    from ..features.classes import classes_json, why_no_classes
    from ..features.sae import SAE
    from ..features.top import latent_sheet, open_for, top_table, write_json, write_png, write_top

    if args.top < 1:
        raise VitvizError(f"--top must be 1 or more, not {args.top}.")
    try:
        sheets = [int(j) for j in args.sheets.split(",")] if args.sheets else []
    except ValueError:
        raise VitvizError(f"--sheets {args.sheets!r}: give latent numbers separated by commas, e.g. 3,17.") from None
    sae = SAE.load(args.sae)
    lens = open_for(sae, args.device, args.head)
    table = top_table(sae, files, n=args.top, batch_size=args.batch_size, lens=lens)
    write_top(table, out)
    why = why_no_classes(lens, sae)
    if why is None:
        path = write_json(classes_json(lens, sae, sorted(table["latent"].unique())), out.parent / CLASSES)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(f"no {CLASSES}: {why}", file=sys.stderr)
    for j in sheets:
        path = write_png(latent_sheet(table, j, sae, lens, files), out.parent / f"latent_{j}.png")
        print(f"wrote {path}", file=sys.stderr)
    print(f"wrote {out}: {len(table)} rows ({table['latent'].nunique()} latents that fired)", file=sys.stderr)
    return 0
