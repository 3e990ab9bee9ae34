"""The command line's shared options are declared once (vitviz/cli/options.py) and mean the same in every command."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from vitviz.cli.entry import parser

ROOT = Path(__file__).resolve().parent.parent
SHARED = ("--model", "--checkpoint", "--img-size", "--device", "--dtype", "--batch-size", "--workers", "--engine",
          "--address")


def declarations(text: str) -> list[str]:
    """The shared options a module's source declares with add_argument."""
    return [o for o in SHARED if re.search(rf'add_argument\(\s*"{re.escape(o)}"', text)]


def test_the_shared_options_are_declared_only_in_cli_options():
    found = {str(f.relative_to(ROOT)): declarations(f.read_text()) for f in (ROOT / "vitviz").rglob("*.py")}
    found = {f: opts for f, opts in found.items() if opts}
    assert set(found) == {"vitviz/cli/options.py"}, found
    # the check sees a planted second declaration
    planted = 'p.add_argument("--device", default="cpu")\n'
    assert declarations(planted) == ["--device"]


def _commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its name as typed: 'analyze', 'features train', ..."""
    out = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub)
                out |= {f"{name} {k}": v for k, v in nested.items()} if nested else {name: sub}
    return out


def test_every_command_that_loads_a_model_takes_the_same_model_options():
    commands = _commands(parser())
    assert {"analyze", "stats", "registers", "faithfulness", "probe", "qk", "heads", "features train",
            "features top", "readout", "similarity"} == set(commands)
    helps: dict[str, set] = {}
    for name, p in commands.items():
        options = {o: a for a in p._actions for o in a.option_strings}
        takes = {"--device"} if name == "features top" else {"--model", "--checkpoint", "--img-size", "--device"}
        assert takes <= set(options), (name, takes - set(options))
        for o in takes:
            helps.setdefault(o, set()).add(options[o].help.split("; with several")[0].split("; repeat")[0])
    assert all(len(h) == 1 for h in helps.values()), helps


@pytest.mark.parametrize("argv, dest, value", [
    (["probe", "--labels", "l.csv", "--out", "o"], "labels", Path("l.csv")),   # probe's --labels: its label file
    (["qk", "x.jpg", "--layer", "1", "--head", "2", "--out", "o"], "head_index", 2),
])
def test_options_of_the_same_name_that_are_not_model_options_stay_out_of_the_model_spec(argv, dest, value):
    from vitviz.cli.options import spec_of

    args = parser().parse_args(argv)
    assert getattr(args, dest) == value
    spec = spec_of(args)
    assert spec.labels is None and spec.head is None
