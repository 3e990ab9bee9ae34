"""MkDocs hooks (mkdocs.yml ``hooks:``): pages written from the code, so nothing is written by hand twice.

- ``<!-- cli-reference -->``: every command and option of ``python -m vitviz``, from the argparse parsers
  (:func:`vitviz.cli.entry.parser`): usage, description, and a table of each option's flags, default and help.
- ``<!-- api-reference -->``: a mkdocstrings block (``::: vitviz.module.Name``) for each public name of
  ``vitviz._PUBLIC``, grouped by the module that defines it.
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", text).replace("|", "\\|").strip()


def _text(text: str) -> str:
    """argparse's plain text as Markdown that shows it as written: ``DIR/<stem>.png`` is no HTML tag."""
    return html.escape(text, quote=False)


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            names = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0:
                names += f" `{action.metavar or action.dest.upper()}`" if not isinstance(action.metavar, tuple) else ""
        else:
            names = f"`{action.metavar or action.dest}`"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        help_text = (action.help or "") % {"default": default, "prog": parser.prog} if action.help else ""
        if action.choices is not None and not isinstance(action.choices, dict):
            help_text += f" (one of: {', '.join(str(c) for c in action.choices)})"
        rows.append(f"| {_cell(names)} | {_cell(shown)} | {_cell(_text(help_text))} |")
    return rows


def _command(parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description:
        out += [_text(parser.description), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    out += _option_rows(parser) + [""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _command(sub, level + 1)
    return out


def cli_reference() -> str:
    """Markdown for every command of ``python -m vitviz``, in the order ``--help`` lists them."""
    import os

    from vitviz.cli.entry import parser

    os.environ["COLUMNS"] = "80"  # argparse wraps usage to the terminal: the page's code block fits 80 columns
    top = parser()
    out = []
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _command(sub, 2)
    return "\n".join(out)


def api_reference() -> str:
    """A mkdocstrings block for each public name of ``vitviz``, grouped by the module that defines it."""
    import vitviz

    by_module: dict[str, list[str]] = {}
    for name, module in vitviz._PUBLIC.items():
        by_module.setdefault(module, []).append(name)
    out = []
    for module, names in by_module.items():
        out += [f"## `vitviz.{module}`", ""]
        for name in names:
            out += [f"::: vitviz.{module}.{name}", "    options:", "      heading_level: 3", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", cli_reference())
    if "<!-- api-reference -->" in markdown:
        markdown = markdown.replace("<!-- api-reference -->", api_reference())
    return markdown
