"""``python -m vitviz qk`` (queries and keys of a layer's heads in 2-D) and ``python -m vitviz heads`` (heads
ablated or patched); the analyses are :mod:`vitviz.heads`."""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from ..errors import VitvizError
from .options import (ENGINE_WORKERS_HELP, Progress, add_engine, add_inputs, add_model, add_out, batch_inputs,
                      decode, expand, open_lens, skipped_records, versions)
from ..words import counted

QK_POINTS, QK_CORRELATIONS, EFFECTS, SETTINGS = "qk.parquet", "correlations.json", "effects.parquet", "settings.json"


def add_parsers(sub) -> None:
    qk = sub.add_parser(
        "qk", help="one layer's queries and keys in 2-D, per head (AttentionViz)",
        description="Embed the queries and keys of one layer's heads over an image set together (AttentionViz's "
                    "corrections: keys translated by mean(q) - mean(k), then keys x c and queries / c; attention "
                    "unchanged) and write DIR/qk.parquet (one row per image, token, query/key and head: x, y, patch "
                    "row and column), DIR/correlations.json (per head: correlation of query-key distance and dot "
                    "product before and after the corrections) and DIR/settings.json.")
    add_inputs(qk)
    qk.add_argument("--layer", type=int, required=True, metavar="L", help="the layer, 1-based")
    qk.add_argument("--head", dest="head_index", type=int, metavar="H", help="one head, 1-based (default: every head of the layer)")
    qk.add_argument("--projection", default="pca", choices=["pca", "tsne", "umap"],
                    help="pca (instant), tsne (scikit-learn, cosine, perplexity 20) or umap (umap-learn, cosine)")
    qk.add_argument("--seed", type=int, default=0, help="random state of t-SNE and UMAP")
    add_out(qk)
    add_model(qk, batch_size=8)
    add_engine(qk, ENGINE_WORKERS_HELP, workers_default=0)
    heads = sub.add_parser(
        "heads", help="switch heads off (ablation) or swap them between two images (patching)",
        description="--ablate: set heads' context z to zero or to its mean over the images given and write the "
                    "output change per image; --patch: run the second image with each head's z from the first and "
                    "write how far its output moves towards the first's. Writes DIR/effects.parquet (image, layer, "
                    "head, kind, effect; layers and heads 1-based) and DIR/settings.json.")
    add_inputs(heads, "IMAGE", "--ablate: the image set; --patch: image A then B")
    what = heads.add_mutually_exclusive_group(required=True)
    what.add_argument("--ablate", metavar="HEADS", help="1-based heads: 3.2 (layer 3 head 2), 3 (layer 3), all, "
                                                        "comma-separated")
    what.add_argument("--patch", metavar="HEADS", help="the heads to patch from A into B, each alone (as --ablate)")
    heads.add_argument("--mode", default="zero", choices=["zero", "mean"], help="ablation: zero or the image-set mean")
    heads.add_argument("--together", action="store_true",
                       help="ablation: every given head at once (default: each head alone)")
    heads.add_argument("--batch", type=int, default=1, metavar="K",
                       help="patching: heads per forward (1 exact; more: faster, equal to float32 rounding)")
    add_out(heads)
    add_model(heads, batch_size=None)


def _open(args):
    """The command's Lens, the decoded images and their names, and the skipped files' records."""
    from ..io.output import check_writable

    check_writable(args.out)
    files, problems = expand(args)
    images, names, bad = decode(files)
    if not images:
        raise VitvizError("no image could be read from the inputs given.")
    return open_lens(args), [im.image for im in images], names, skipped_records(problems + bad)


def _write(out: Path, table, name: str, settings: dict, extra: dict[str, bytes] | None = None) -> None:
    """The table, any extra files, then settings.json: each file whole or not at all."""
    from ..io.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    atomic_write_bytes(out / name, buffer.getvalue())
    for extra_name, data in (extra or {}).items():
        atomic_write_bytes(out / extra_name, data)
    atomic_write_bytes(out / SETTINGS, (json.dumps(settings, indent=2, default=float) + "\n").encode())


def run_qk(args: argparse.Namespace) -> int:
    from ..heads import qk
    from ..runs.engines import run_batches

    engine, files, problems = batch_inputs(args)
    if not files:
        raise VitvizError("no image could be read from the inputs given.")
    lens = open_lens(args)
    if not 1 <= args.layer <= lens.num_layers:
        raise VitvizError(f"--layer {args.layer} is not a layer of this model (1 to {lens.num_layers}).")
    heads = None
    if args.head_index is not None:
        count = lens.adapter.num_heads(lens.model, args.layer - 1)
        if not 1 <= args.head_index <= count:
            raise VitvizError(f"--head {args.head_index} is not a head of layer {args.layer} (1 to {count}).")
        heads = (args.head_index - 1,)
    # Queries, keys and scores of the asked heads, batch by batch (here or on Ray actors); the pictures need them
    # all at once (one projection per head over every image).
    parts, names, skipped = [], [], skipped_records(problems)
    for batch in run_batches(qk.QKWork(args.layer - 1, heads), lens, files, args.batch_size, engine):
        for name, reason in batch.bad:
            print(f"skipped {name}: {reason}", file=sys.stderr)
            skipped.append({"name": name, "reason": reason})
        if batch.value is not None:
            parts.append(batch.value)
            names += batch.names
    if not parts:
        raise VitvizError("no image could be read from the inputs given.")
    arrays = qk.QKArrays.join(parts)
    pictures = qk.pictures_of(arrays, args.layer - 1, args.projection, args.seed,
                              Progress(len(arrays.heads), desc=f"{args.projection} per head", unit="head",
                                       lines=False).callback())
    layout = arrays.layout
    correlations = pictures.correlations()
    settings = {
        "command": "qk", "model": lens.loaded.card(), "versions": versions("scikit-learn", "umap-learn"), "images": names, "skipped": skipped,
        "layer": args.layer, "heads": [c["head"] for c in correlations], "projection": args.projection,
        "batch_size": args.batch_size, "engine": args.engine,
        "projection_text": qk.PROJECTION_TEXT[args.projection], "seed": args.seed,
        "token_layout": layout.to_dict(), "columns": qk.POINT_COLUMNS,
        "corrections": "keys translated by mean(q) - mean(k) over every token of every image, then keys x c and "
                       "queries / c with c = sqrt(mean|q| / mean|k|) (key norms after the translation): attention "
                       "rows unchanged",
        "correlation": "Pearson r between |q_i - k_j| and q_i . k_j over every query-key pair of the same image, in "
                       "the head's d dimensions (AttentionViz's target: close to -1)",
        "bias": "score_bias_share: the share of the scores' within-row spread carried by a bias added to q . k "
                "(relative position bias); such a bias is not in the picture",
        "indices": "layer and head 1-based (as on screen); token, row and column 0-based",
    }
    _write(args.out, qk.points_table(pictures, layout, names), QK_POINTS, settings,
           {QK_CORRELATIONS: (json.dumps(correlations, indent=2) + "\n").encode()})
    for c in correlations:
        bias = " (a bias added to the scores is not in the picture)" if c["bias_not_in_picture"] else ""
        print(f"layer {c['layer']} head {c['head']}: distance-dot correlation {c['correlation_before']:+.3f} -> "
              f"{c['correlation_after']:+.3f}{bias}")
    print(f"wrote {args.out / QK_POINTS}")
    return 0


def run_heads(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..heads import patching

    if args.batch < 1:
        raise VitvizError(f"--batch must be 1 or more, not {args.batch}.")
    lens, images, names, skipped = _open(args)
    heads_of = lambda l: lens.adapter.num_heads(lens.model, l)  # noqa: E731
    spec = args.ablate or args.patch
    pairs = patching.parse_heads(spec, lens.num_layers, heads_of)
    x = lens.preprocess(images)
    settings = {"model": lens.loaded.card(), "versions": versions("scikit-learn", "umap-learn"), "images": names, "skipped": skipped,
                "heads": [[l + 1, h + 1] for l, h in pairs],
                "indices": "layer and head 1-based (as on screen); head empty for every given head at once",
                "kinds": patching.__doc__.split("Outputs and effects (per image):")[1].split("Layers and heads")[0]
                .strip()}
    if args.ablate:
        effects = patching.ablate(lens, x, pairs, args.mode, each=not args.together,
                                  progress=Progress(1 if args.together else len(pairs), desc="ablations", unit="head", lines=False).callback())
        settings |= {"command": "heads --ablate", "mode": args.mode, "ablation": patching.ABLATION_TEXT[args.mode],
                     "each": not args.together}
        image_names = names
    else:
        if len(images) != 2:
            raise VitvizError(f"--patch takes two images, A then B (B is run with A's heads); {len(images)} given.")
        effects = patching.patch(lens, x.tensor[:1], x.tensor[1:], pairs, args.batch,
                                 progress=Progress(len(pairs), desc="patched heads", unit="head", lines=False).callback())
        settings |= {"command": "heads --patch", "image_a": names[0], "image_b": names[1], "batch": args.batch}
        image_names = [names[1]]
    table = pd.DataFrame({
        "image": [image_names[i] for i, *_ in effects.rows],
        "layer": pd.array([l + 1 if l >= 0 else None for _, l, *_ in effects.rows], dtype="Int32"),
        "head": pd.array([h + 1 if h >= 0 else None for _, _, h, *_ in effects.rows], dtype="Int32"),
        "kind": [k for *_, k, _ in effects.rows], "effect": [e for *_, e in effects.rows]})
    _write(args.out, table, EFFECTS, settings)
    print(f"{counted(len(pairs), 'head')}, {counted(len(table), 'effect')}; wrote {args.out / EFFECTS}")
    return 0


COMMANDS = {"qk": run_qk, "heads": run_heads}
