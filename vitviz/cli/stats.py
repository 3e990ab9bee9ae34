"""``python -m vitviz stats INPUT ... --model M --out DIR``: per-head attention statistics over image sets (resumable,
local or on Ray), one row per (image, layer, head)."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ..errors import VitvizError
from ..io.output import check_writable
from .options import (ENGINE_WORKERS_HELP, Progress, add_engine, add_inputs, add_model, add_out, check_batch_size,
                      engine_of, expand, interrupted_code, no_image, read_json, specs_of, versions)
from ..words import counted

COLUMN_DOCS = {
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


def add_parser(sub) -> None:
    stats = sub.add_parser(
        "stats",
        help="per-head attention statistics over an image set (thousands of images, resumable)",
        description="Stream images through one or more ViTs and write one row per (image, layer, head) to "
                    "DIR/stats.parquet (mean attention distance in both prefix conventions, entropy, CLS focus, "
                    "attention on prefix tokens), attention sinks to DIR/sinks.parquet and DIR/summary.json. "
                    "Re-running with the same DIR skips images already in the table; Ctrl-C keeps what finished. "
                    "Bad files are reported on stderr and skipped; the exit status is non-zero only when no "
                    "image could be analysed.")
    add_inputs(stats)
    add_model(stats, labels=True, head=True, per_model=True)
    add_out(stats, resume=True)
    add_engine(stats, ENGINE_WORKERS_HELP)


def run(args: argparse.Namespace) -> int:
    """Per-head statistics of every image for each model; finished batches are durable, tables whole."""
    from ..runs.stats_store import STATS_NAME, StatsStore

    check_batch_size(args)
    workers = engine_of(args).workers
    specs = specs_of(args)
    check_writable(args.out)
    files, problems = expand(args)
    skipped = {p.name: p.reason for p in problems}
    if not files:
        return no_image()

    previous = read_json(args.out / "summary.json")  # checked before the store makes its parts folder
    store = StatsStore(args.out)
    try:
        store.consolidate()  # a run killed outright leaves parts: they count as done
    except VitvizError:
        store.close()  # a table refused unread: leave the folder as it was
        raise
    cards, counts, interrupted, failed = dict(previous.get("models", {})), {}, None, None
    try:
        for spec in specs:
            _add_model(args, spec, files, skipped, store, cards, counts, workers)
    except KeyboardInterrupt as exc:
        interrupted = exc
    except VitvizError as exc:
        if not any(c["added"] for c in counts.values()):
            store.close()  # nothing of this run to keep: the folder stays as it was, the sentence says why
            raise
        failed = exc  # e.g. the second --model cannot be loaded: the first one's rows are kept, as on Ctrl-C
    table = store.consolidate().result()
    in_table = {} if table.empty else table.groupby(level="model")["images"].max().to_dict()
    _write_summary(args, store, table, in_table, specs, workers, cards, files, skipped, counts,
                   complete=interrupted is None and failed is None)
    store.close()
    held = ", ".join(f"{counted(n, 'image')} for {m}" for m, n in in_table.items()) or "no image"
    if interrupted is not None:
        print(f"\ninterrupted: {args.out / STATS_NAME} holds every finished batch ({held}); "
              "run the same command again to go on.", file=sys.stderr)
        return interrupted_code(interrupted)
    if failed is not None:
        print(f"{args.out / STATS_NAME} holds {held}", file=sys.stderr)
        raise failed
    if not in_table:
        return no_image()
    added = sum(c["added"] for c in counts.values())
    print(f"analysed {counted(added, 'new image')} over {counted(len(specs), 'model')}; {args.out / STATS_NAME} holds {held}")
    return 0


def _add_model(args, spec, files: list, skipped: dict, store, cards: dict, counts: dict, workers: int) -> None:
    """One model's rows for the images not yet in the table, batch by batch (each durable once written); the files it
    could not read join ``skipped``, its card ``cards``, its numbers ``counts``."""
    from ..runs.stats_run import run_local, run_ray
    from ..runs.stats_store import STATS_NAME
    from ..sources.models import load_model

    done = store.done_images(spec.name)
    todo = [f for f in files if f.name not in done and f.name not in skipped]
    counts[spec.name] = {"already_in_table": sum(f.name in done for f in files), "added": 0}
    if not todo:
        print(f"{spec.name}: every image is already in {args.out / STATS_NAME}", file=sys.stderr)
        return
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


def _write_summary(args, store, table, in_table: dict, specs: list, workers: int, cards: dict, files: list,
                   skipped: dict, counts: dict, complete: bool) -> None:
    """DIR/summary.json: the settings, the models' cards, the counts, the skipped files, per (layer, head) means."""
    from ..analyses.stats import STATISTICS

    store.write_summary({
        "command": "stats",
        "complete": complete,
        "versions": versions(),
        "settings": {"inputs": list(args.inputs), "models": [s.name for s in specs], "engine": args.engine,
                     "address": args.address, "batch_size": args.batch_size, "workers": workers,
                     "img_size": args.img_size, "device": args.device, "dtype": args.dtype,
                     "heads": [s.head for s in specs]},
        "models": cards,
        "counts": {"files": len(files), "bad_files": len(skipped),
                   "images_in_table": {m: int(n) for m, n in in_table.items()},
                   "this_run": counts},
        "skipped": [{"name": n, "reason": r} for n, r in skipped.items()],
        "layer_head": layer_head_records(table),
        "columns": COLUMN_DOCS,
        "statistics": list(STATISTICS),
    })


def layer_head_records(table) -> dict[str, list[dict]]:
    """LayerHeadSummary.result() as JSON: per model, one record per (layer, head), NaN as null."""
    if table.empty:
        return {}
    records: dict[str, list[dict]] = {}
    for (model, layer, head), row in table.iterrows():
        values = {k: None if np.isnan(v) else float(v) for k, v in row.items()}
        records.setdefault(model, []).append({"layer": int(layer), "head": int(head)} | values
                                             | {"images": int(row["images"])})
    return records
