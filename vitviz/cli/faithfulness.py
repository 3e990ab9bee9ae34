"""``python -m vitviz faithfulness INPUT ... --out DIR``: every method's perturbation curves over an image set
(resumable, local or on Ray), with bootstrap intervals against the random floor."""
from __future__ import annotations

import argparse
import sys

from ..errors import VitvizError
from ..io.output import check_writable
from .options import (Progress, add_engine, add_inputs, add_model, add_out, check_batch_size, engine_of, expand,
                      interrupted_code, no_image, read_json, spec_of, versions)
from ..words import counted


def add_parser(sub) -> None:
    from ..perturbation.curves import ORDERINGS, RANDOM_SEEDS
    from ..perturbation.protocols import CHEFER, PROTOCOLS, REPLACEMENTS
    from ..runs.faithfulness_run import DEFAULT_METHODS, METHODS

    faith = sub.add_parser(
        "faithfulness",
        help="perturbation curves of attribution maps over an image set (resumable), with bootstrap intervals",
        description="Run each method's map through MoRF (deletion), LeRF and insertion (and, for models with a head, "
                    "Chefer et al.'s positive/negative perturbation) on every image; write DIR/faithfulness.parquet "
                    "(image, method, protocol, fraction, score), DIR/auc.parquet (image, method, protocol, auc; "
                    "lerf_minus_morf is the LXT paper's summary), DIR/settings.json and DIR/summary.json (per method "
                    "a bootstrap 95 %% interval over images, paired differences). Re-running with the same DIR skips "
                    "images already in the table; Ctrl-C keeps what finished.")
    add_inputs(faith)
    add_out(faith, resume=True)
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
    add_model(faith, dtype=False, head=True, batch_size=4)
    add_engine(faith, "ray engine: actors, each holding one model", workers_default=1)


def run(args: argparse.Namespace) -> int:
    """Every method's curves on every image; finished batches are durable, tables whole; a summary at the end."""
    from ..perturbation.protocols import CHEFER, PROTOCOLS
    from ..perturbation.stats import summarise, summary_lines
    from ..runs.faithfulness_run import (AUC_NAME, METHODS, SETTINGS_NAME, SUMMARY_NAME, FaithfulnessStore,
                                         RunSettings, parse_list, run_local, run_ray, same_run)
    from ..sources.models import load_model

    check_batch_size(args)
    engine_of(args)  # --workers and --address checked, Ray present when asked for
    spec = spec_of(args)
    check_writable(args.out)
    files, problems = expand(args)
    skipped = {p.name: p.reason for p in problems}
    if not files:
        return no_image()
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
    previous = read_json(args.out / SETTINGS_NAME)
    if why := same_run(previous, settings):
        raise VitvizError(f"{args.out}: {why}")
    store = FaithfulnessStore(args.out)
    record = _record(settings, loaded)
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
        return interrupted_code(interrupted)
    if not len(auc):
        return no_image()
    print("\n".join(summary_lines(summary)))
    print(f"{counted(auc['image'].nunique(), 'image')} in {args.out / AUC_NAME}")
    return 0


def _record(settings, loaded) -> dict:
    """settings.json: the run's settings, the model's card and what the protocol, the score and the AUC are."""
    from ..perturbation.protocols import CHEFER_TEXT, REPLACEMENT_TEXT

    record = {"command": "faithfulness", "run": settings.record(), "model": loaded.card(), "versions": versions(),
              "replacement": REPLACEMENT_TEXT[settings.replacement],
              "protocol": {"ordering": "patches by descending map value, ties to the lower raster index; LeRF is "
                                       "MoRF's order reversed; k = round(f * P) patches at fraction f (halves up)",
                           "score": "softmax probability of the target class (default each image's top-1) with a "
                                    "head; else the cosine of the pooled vector with the original's",
                           "chefer": CHEFER_TEXT,
                           "auc": "trapezoid over the fractions; lerf_minus_morf = AUC(LeRF) - AUC(MoRF)"},
              "random_seeds": list(range(settings.first_seed, settings.first_seed + settings.random_seeds))
              if "random" in settings.methods else [],
              "target": {"kind": "logit" if loaded.has_head else "projection", "class": settings.target_class}}
    return record
