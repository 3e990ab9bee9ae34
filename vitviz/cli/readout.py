"""``python -m vitviz readout``: what each head, MLP and the embedding wrote into the answer (the direct readout), and
the head read after every block (the logit lens); the computations are :mod:`vitviz.residual`."""
from __future__ import annotations

import argparse
import io
import json
import sys

from ..errors import ImageError, VitvizError
from .options import (ENGINE_WORKERS_HELP, Progress, add_engine, add_inputs, add_model, add_out, batch_inputs, decode,
                      no_image, open_lens, skipped_records, versions)
from ..words import counted

READOUT, LOGIT_LENS, HEAD_MAPS, TUNED, SETTINGS = ("readout.parquet", "logit_lens.parquet", "head_patches.npz",
                                                   "tuned_lens.parquet", "settings.json")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "readout", help="each head's, MLP's and the embedding's direct share of a logit; the logit lens",
        description="Split a target (a class logit; a probe's class with --head) into the direct contributions of the "
                    "embedding, every attention head, every attention bias, every MLP and the readout's constant, "
                    "with the final norm's scale frozen at each image's own (they add up to the model's own logit), "
                    "and read the head after every block (logit lens). Writes DIR/readout.parquet (image, name, "
                    "component, layer, head, value; layer and head 0-based, empty where they do not apply), "
                    "DIR/logit_lens.parquet (image, name, layer, class, label, logit, prob, rank: each layer's top "
                    "classes and the final top-1), DIR/head_patches.npz (per image, layer and head, what the head "
                    "moved from each patch: (B, L, H, gh, gw)) and DIR/settings.json.")
    add_inputs(p)
    p.add_argument("--target", metavar="CLASS",
                   help="the class whose logit is split: its 0-based index or its name (default: each image's top-1)")
    p.add_argument("--text", action="append", metavar="TEXT",
                   help="CLIP: split the image-text score for this text instead (repeat for several: each image is "
                        "scored against its best match); needs a whole CLIP model (its text tower)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="classes per layer in logit_lens.parquet")
    p.add_argument("--tuned", action="store_true",
                   help="also fit a tuned lens (one affine map per block, ridge least squares, 25%% of the images held "
                        "out; at least 2 images) and write its held-out fit to DIR/tuned_lens.parquet")
    add_out(p)
    add_model(p, labels=True, head=True)
    add_engine(p, ENGINE_WORKERS_HELP, workers_default=0)


def _class(lens, text: str | None) -> int | None:
    """--target as a 0-based class index (None: each image's top-1, or a headless model's pooled projection)."""
    if text is None:
        return None
    if not lens.has_head:
        raise VitvizError(f"--target {text}: {lens.label} has no classifier head (give one with --head probe.safetensors).")
    if text.lstrip("-").isdigit():
        cls = int(text)
        if not 0 <= cls < lens.num_classes:
            raise VitvizError(f"--target {cls} is not a class of this model (0 to {lens.num_classes - 1}).")
        return cls
    matches = [i for i, name in enumerate(lens.class_labels or ()) if name.lower() == text.lower()]
    if not matches:
        raise VitvizError(f"--target {text!r} is neither a class index nor a class name of this model.")
    return matches[0]


def _parquet(table) -> bytes:
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _tuned_lens(args, lens, files: list):
    """``--tuned``: the tuned lens fitted on the images (:class:`vitviz.residual.TunedLens`), or None."""
    from .. import residual

    if not args.tuned:
        return None
    decoded, _, _ = decode(files)
    if not lens.has_head or len(decoded) < 2:
        raise VitvizError("--tuned needs a model with a classifier head and at least 2 images.")
    return residual.TunedLens.fit_images(lens, lens.preprocess([im.image for im in decoded]),
                                         batch_size=args.batch_size)


def _settings(args, lens, engine_kind: str, names: list, bad: list, described, text, residuals: list,
              with_lens: bool, tuned) -> dict:
    """settings.json: the model, the images, the target and what every file's columns mean."""
    import numpy as np

    settings = {
        "command": "readout", "model": lens.loaded.card(), "versions": versions(), "images": names,
        "skipped": skipped_records(bad), "target": described, "target_text": text,
        "token_layout": lens.layout.to_dict(), "batch_size": args.batch_size, "engine": engine_kind,
        "indices": "image, layer, head and class 0-based in every file (on screen layers and heads are 1-based)",
        "components": {"embed": "patch + position embeddings and prefix tokens entering block 1",
                       "attn_head": "one head's slice of the attention output projection applied to its context z "
                                    "(times LayerScale where the model has it)",
                       "attn_bias": "the attention output projection's bias (times LayerScale)",
                       "mlp": "the MLP branch's output", "bias": "the readout's constant: the final norms' beta and "
                                                                 "the head's bias"},
        "definition": "target = sum of the components' direct contributions; each is the readout's gradient with the "
                      "final norm's scale frozen at the image's own value, dotted with the component (exact: the "
                      "readout is then affine in the tokens)",
        "largest_residual": float(np.concatenate(residuals).max()),
        "head_patches": "what each head moved from each patch into the target, (image, layer, head, row, col); the "
                        "prefix tokens' shares are in readout.parquet's head rows but not on the grid",
        "logit_lens": ("the model's final norm, pooling and head applied after every block (the last layer equals "
                       "the logits)") if with_lens else "not written: the model has no classifier head",
    }
    if tuned is not None:
        settings["tuned_lens"] = {"fit": "ridge least squares of the last block's tokens on each block's tokens",
                                  "ridge": tuned.ridge, "held_out": int(tuned.fit.images_held_out.iloc[0])}
    return settings


def run(args: argparse.Namespace) -> int:
    """Every image's direct contributions to the target, its logit lens and head maps, written into ``--out``."""
    import numpy as np
    import pandas as pd

    from .. import residual
    from ..io.atomic import atomic_write_bytes
    from ..runs.engines import run_batches
    from ..runs.readout_run import ReadoutWork

    engine, files, problems = batch_inputs(args)
    if not files:
        return no_image()
    lens = open_lens(args)
    why = residual.why_not(lens)
    if why:
        raise VitvizError(why)
    if args.text and args.target is not None:
        raise VitvizError("give --target (a class) or --text (CLIP's score for a text), not both.")
    cls = None if args.text else _class(lens, args.target)
    if args.text and not lens.has_text:
        raise VitvizError(f"--text needs a whole CLIP model with its text tower; {lens.label} has none.")
    tuned = _tuned_lens(args, lens, files)
    work = ReadoutWork(cls, args.top, tuple(args.text or ()))
    tables, lenses, maps, residuals, names, bad = [], [], [], [], [], list(problems)
    progress, seen = Progress(len(files), desc="readout"), 0
    try:
        for batch in run_batches(work, lens, files, args.batch_size, engine):
            for name, reason in batch.bad:
                print(f"skipped {name}: {reason}", file=sys.stderr)
                bad.append(ImageError(name, reason))
            if batch.value is not None:
                value, offset = batch.value, len(names)
                tables.append(value.table.assign(image=value.table.image + offset))
                if value.lens is not None:
                    lenses.append(value.lens.assign(image=value.lens.image + offset))
                maps.append(value.maps)
                residuals.append(value.residual)
                names += list(batch.names)
                described, text = value.target, value.target_text
            seen += batch.files
            progress.update(seen)
    finally:
        progress.close()
    if not names:
        raise VitvizError("no image could be read from the inputs given.")
    readout_table = pd.concat(tables, ignore_index=True)
    atomic_write_bytes(args.out / READOUT, _parquet(readout_table))
    if lenses:
        atomic_write_bytes(args.out / LOGIT_LENS, _parquet(pd.concat(lenses, ignore_index=True)))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, head_patches=np.concatenate(maps), images=np.array(names))
    atomic_write_bytes(args.out / HEAD_MAPS, buffer.getvalue())
    if tuned is not None:
        atomic_write_bytes(args.out / TUNED, _parquet(tuned.fit))
    settings = _settings(args, lens, engine.kind, names, bad, described, text, residuals, bool(lenses), tuned)
    atomic_write_bytes(args.out / SETTINGS, (json.dumps(settings, indent=2, default=float) + "\n").encode())
    top = readout_table[readout_table.component == "attn_head"].groupby(["layer", "head"]).value.mean()
    best = top.abs().idxmax()
    print(f"{counted(len(names), 'image')}, target {text}: the head with the largest mean direct share is layer "
          f"{best[0] + 1} head {best[1] + 1} ({top[best]:+.4g}); wrote {args.out / READOUT}")
    return 0
