"""``python -m vitviz COMMAND``: the parser of every command, the output folder's lock, signals and exit codes."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path

from ..errors import VitvizError
from ..io.lock import output_lock
from .options import EXIT_USER_ERROR, Interrupted, interrupted_code

# Commands that write their --out folder: each holds it for one writer from before it computes anything
# (vitviz.io.lock); a second run on the same folder is refused at once.
WRITES_FOLDER = {"analyze", "stats", "faithfulness", "registers", "qk", "heads", "probe", "readout", "similarity"}
# Commands whose tables keep the finished batches when interrupted (the rest write one result whole or not at all).
RESUMABLE = ("stats", "faithfulness", "features", "probe", "similarity")


def _commands() -> dict:
    """command -> (add_parser(sub), run(args)), in the order ``--help`` lists them."""
    from .analyze import add_parser as analyze_parser, run as analyze_run
    from .faithfulness import add_parser as faithfulness_parser, run as faithfulness_run
    from .features import add_parser as features_parser, run as features_run
    from .heads import add_parsers as heads_parsers, run_heads, run_qk
    from .probe import add_parser as probe_parser, run as probe_run
    from .readout import add_parser as readout_parser, run as readout_run
    from .registers import add_parser as registers_parser, run as registers_run
    from .similarity import add_parser as similarity_parser, run as similarity_run
    from .stats import add_parser as stats_parser, run as stats_run

    return {"analyze": (analyze_parser, analyze_run), "stats": (stats_parser, stats_run),
            "registers": (registers_parser, registers_run), "features": (features_parser, features_run),
            "faithfulness": (faithfulness_parser, faithfulness_run), "probe": (probe_parser, probe_run),
            "qk": (heads_parsers, run_qk), "heads": (None, run_heads), "readout": (readout_parser, readout_run),
            "similarity": (similarity_parser, similarity_run)}
    # heads_parsers adds both qk and heads


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vitviz", description="Vision Transformer interpretability, headless.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in _commands().values():
        if add is not None:
            add(sub)
    return parser


def _on_sigterm(signum, frame):
    raise Interrupted()


def _folder_to_hold(argv: list[str]) -> tuple[str, Path] | None:
    """(command, --out) of a command that writes a folder, read before the full parser: building that one imports
    torch (the faithfulness options' choices), seconds a second run must not spend before it is refused."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("command", nargs="?")
    pre.add_argument("--out", type=Path)
    try:
        known, _ = pre.parse_known_args(argv)
    except SystemExit:  # left to the full parser to explain
        return None
    return (known.command, known.out) if known.command in WRITES_FOLDER and known.out else None


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (:mod:`vitviz.cli.options`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with contextlib.ExitStack() as stack:
        if (held := _folder_to_hold(argv)) is not None:
            command, out = held
            try:
                stack.enter_context(output_lock(out, command))
            except VitvizError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return EXIT_USER_ERROR
        return run(argv)


def run(argv: list[str]) -> int:
    """The command without the output lock (:func:`main` holds it)."""
    args = parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return _commands()[args.command][1](args)
    except VitvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        if args.command in RESUMABLE:
            print(f"\ninterrupted while writing the tables: {args.out} keeps the previous ones and the finished "
                  "batches; run the same command again to go on.", file=sys.stderr)
        else:
            print(f"\ninterrupted: {args.out} holds a complete result (the previous one, or this run's if it had "
                  "finished writing); no partial file was left.", file=sys.stderr)
        return interrupted_code(exc)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
