"""The command line, ``python -m vitviz COMMAND``: one module per command (analyze, stats, registers, faithfulness,
features, probe, heads and qk), the options they share and the exit codes
(:mod:`vitviz.cli.options`), and the entry point with the output lock and signals (:mod:`vitviz.cli.entry`).
A command checks its options, decodes its inputs and hands the work to :mod:`vitviz.runs` or the analyses."""
from .entry import main

__all__ = ["main"]
