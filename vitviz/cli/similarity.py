"""``python -m vitviz similarity INPUT ... --model A [--model B] --out DIR``: CKA between every layer of A and every
layer of B (of A alone: the within-model map) over an image set, as ``DIR/cka.parquet`` and ``DIR/settings.json``.

Minibatches run on the engine (:mod:`vitviz.runs.engines`: here, or on Ray with ``--engine ray``); after each, the
sums so far are durable in ``DIR/.vitviz-similarity-parts/sums.npz`` ((1 + bootstrap) x L_a x L_b numbers, whatever
the number of images), so a killed run's next run goes on from there and ends with the numbers of an uninterrupted
one. The two result files are written together, whole, at the end; an interrupted run leaves the previous ones as
they were."""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from ..errors import VitvizError
from ..io.atomic import atomic_write_bytes, signals_held
from ..io.output import check_writable
from .options import (ENGINE_WORKERS_HELP, Progress, add_engine, add_inputs, add_model, add_out, engine_of, expand,
                      interrupted_code, no_image, read_json, spec_of, versions)
from ..words import counted

CKA_NAME = "cka.parquet"
SETTINGS_NAME = "settings.json"
SEED = 0  # of the bootstrap: the library's default, so the command and vitviz.similarity give the same numbers
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
                    "are compared. --batch-size is the minibatch (4 or more). Re-running with the same DIR goes on "
                    "from the minibatches a killed run finished; --engine ray runs them on Ray actors.")
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
    add_out(p, resume=True)
    add_engine(p, ENGINE_WORKERS_HELP)


def run(args: argparse.Namespace) -> int:
    """CKA over the images on the engine; each finished minibatch is durable, the two result files written whole."""
    from ..analyses.similarity import MinibatchCKA
    from ..runs.engines import run_batches
    from ..runs.similarity_run import MIN_BATCH, minibatch_sizes, result_of
    from ..runs.similarity_work import CKASums, CKAWork, SidesSpec

    models, checkpoints = _models(args, MIN_BATCH)
    engine = engine_of(args)
    check_writable(args.out)
    files, problems = expand(args)
    if not files:
        return no_image()
    # Absolute weights: a Ray actor may start in another folder.
    specs = [spec_of(args, m, None if c == "-" else str(Path(c).expanduser().resolve()))
             for m, c in zip(models, checkpoints)]
    sides = SidesSpec(specs[0], specs[1] if len(specs) == 2 else None, args.point)
    sizes = minibatch_sizes(len(files), args.batch_size)
    work = CKAWork(args.pooling, args.kernel, args.rbf_threshold, args.bootstrap, SEED)
    key = _run_key(args, models, specs, files, sizes, work)
    if read_json(args.out / SETTINGS_NAME).get("run") == key and (args.out / CKA_NAME).exists():
        print(f"{args.out / CKA_NAME} already holds these images with these settings.", file=sys.stderr)
        return 0
    sums = CKASums(args.out, key)
    state, stale = sums.read()
    if stale:
        print(f"{args.out} held the sums of a run with other images or settings: they were removed.", file=sys.stderr)
    state = state or {"next": 0, "accumulator": None, "sides": None, "skipped": {}}
    if state["next"]:
        print(f"resuming: {state['next']} of {counted(len(sizes), 'minibatch')} already done.", file=sys.stderr)
    skipped = state["skipped"] | {p.name: p.reason for p in problems}
    accumulator, described = state["accumulator"], state["sides"]
    progress = Progress(len(files), desc="similarity")
    seen = sum(sizes[:state["next"]])
    try:
        runner = sides.open() if engine.kind == "local" else sides
        for batch in run_batches(work, runner, [(f.path, f.name) for f in files], sizes, engine,
                                 skip=range(state["next"])):
            for name, reason in batch.bad:
                print(f"skipped {name}: {reason}", file=sys.stderr)
                skipped[name] = reason
            if batch.value is None:
                for name in batch.names:
                    skipped[name] = f"its minibatch had fewer than {MIN_BATCH} readable images"
                    print(f"skipped {name}: {skipped[name]}", file=sys.stderr)
            else:
                terms, described = batch.value
                if accumulator is None:
                    accumulator = MinibatchCKA(*terms[0].shape[1:], replicates=args.bootstrap, seed=SEED)
                accumulator.add(*terms, images=len(batch.names))
            if accumulator is not None:
                sums.write(batch.index + 1, accumulator, described, skipped)
            seen += batch.files
            progress.update(seen)
    except KeyboardInterrupt as exc:
        progress.close()
        done = sums.read()[0]
        print(f"\ninterrupted: {args.out} keeps {done['next'] if done else 0} of {counted(len(sizes), 'minibatch')} "
              "finished; run the same command again to go on.", file=sys.stderr)
        return interrupted_code(exc)
    progress.close()
    if accumulator is None:
        sums.clear()
        return _too_few_readable(len(files), len(skipped), MIN_BATCH)
    result = result_of(accumulator, described, point=args.point, pooling=args.pooling, kernel=args.kernel,
                       threshold=args.rbf_threshold, batch_size=args.batch_size, seed=SEED,
                       skipped=list(skipped.items()))
    settings = {"command": "similarity", "versions": versions(),
                "inputs": list(args.inputs), "models": models, "checkpoints": [s.checkpoint for s in specs],
                "img_size": args.img_size, "device": args.device, "dtype": args.dtype,
                "engine": args.engine, "workers": engine.workers, "address": args.address,
                "layers_a": list(result.layers_a), "layers_b": list(result.layers_b),
                "columns": COLUMN_DOCS, "minibatches_planned": sizes,
                "skipped": [{"name": n, "reason": r} for n, r in skipped.items()]}
    _write_results(args.out, result, settings, key)
    sums.clear()
    shape = result.cka.shape
    print(f"{shape[0]} x {shape[1]} layers over {counted(result.images, 'image')} in "
          f"{counted(result.settings['minibatches'], 'minibatch')}: {args.out / CKA_NAME}")
    return 0


def _models(args: argparse.Namespace, min_batch: int) -> tuple[list[str], list[str]]:
    """The --model names (default the bundled model) and one --checkpoint each ('-': none), checked: one or two
    models, as many checkpoints, and a --batch-size of ``min_batch`` or more."""
    models = args.model or ["bundled"]
    if len(models) > 2:
        raise VitvizError(f"{len(models)} --model: similarity compares one model with itself or two models.")
    checkpoints = args.checkpoint or ["-"] * len(models)
    if len(checkpoints) != len(models):
        raise VitvizError(f"{len(checkpoints)} --checkpoint for {len(models)} --model: give one per --model, in the "
                          "same order ('-' for a model without).")
    if args.batch_size < min_batch:
        raise VitvizError(f"--batch-size {args.batch_size}: minibatch CKA needs {min_batch} or more images per "
                          "minibatch.")
    return models, checkpoints


def _run_key(args: argparse.Namespace, models: list[str], specs: list, files: list, sizes: list[int], work) -> str:
    """What makes two runs the same (their images, models, minibatches and settings), as settings.json's ``run`` and
    the key of the durable sums: a run whose key matches goes on from them or finds its result already there."""
    return json.dumps({"models": models, "checkpoints": [s.checkpoint for s in specs], "img_size": args.img_size,
                       "dtype": args.dtype, "point": args.point, "files": [str(f.path) for f in files],
                       "minibatches": sizes, "work": [work.pooling, work.kernel, work.threshold, work.replicates,
                                                      work.seed]})


def _too_few_readable(files: int, skipped: int, min_batch: int) -> int:
    """The error when no minibatch could be measured (too few readable images in all, or in every minibatch)."""
    if files - skipped < min_batch:
        print(f"error: fewer than {min_batch} of the {files} images could be read: CKA needs {min_batch}.",
              file=sys.stderr)
    else:
        print(f"error: no minibatch held {min_batch} readable images: CKA needs {min_batch} per minibatch.",
              file=sys.stderr)
    return no_image()


def _write_results(out: Path, result, settings: dict, key: str) -> None:
    """``out/cka.parquet`` and ``out/settings.json`` (``settings`` then the result's own, less its skipped list,
    then the run's ``key``), each whole, and both renamed or neither."""
    buffer = io.BytesIO()
    result.table().to_parquet(buffer, index=False)
    settings = settings | {k: v for k, v in result.settings.items() if k != "skipped"} | {"run": key}
    with signals_held():
        atomic_write_bytes(out / CKA_NAME, buffer.getvalue())
        atomic_write_bytes(out / SETTINGS_NAME, (json.dumps(settings, indent=2) + "\n").encode())
