""""Figure for a paper": a multi-panel figure (:mod:`vitviz.figures.paper_figure`) as PNG, SVG and PDF downloads."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from vitviz.figures.paper_figure import FORMATS, PaperFigure

from .downloads import built_once, button_row

MIME = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}


def paper_downloads(name: str, build: Callable[[], PaperFigure]) -> None:
    """Three buttons, files ``name.png/.svg/.pdf``; the figure is composed on the first click (once for the three)
    and a click reruns nothing."""
    held: list[PaperFigure] = []

    def figure() -> PaperFigure:
        if not held:
            held.append(build())
        return held[0]

    row = button_row(f"paper-row-{name}")
    for fmt in FORMATS:
        row.download_button(f"Figure ({fmt})", built_once(lambda fmt=fmt: figure().file(fmt)), f"{name}.{fmt}",
                            MIME[fmt], key=f"paper-{fmt}-{name}", on_click="ignore",
                            help="Titles, labels, colour-bar ticks and the scale note as text in the SVG and PDF; "
                                 "the maps embedded at the model input's resolution; the PNG at 200 dpi.")
