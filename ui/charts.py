"""Data figures on the page: exact colours, a meaningful file name for the toolbar's PNG, SVG and PDF for papers.

Streamlit's default Plotly theme rewrites the colours #000001-#000040 in a figure to theme
colours, and Inferno's lowest stop is #000004: every data figure goes through here with
``theme=None`` so the colour maps reach the browser unaltered.
"""
from __future__ import annotations

import re

import plotly.graph_objects as go
import streamlit as st

from vitviz.figures.chart_export import chart_file, unavailable_reason

from .downloads import built_once, button_row

IMAGE_SUFFIX = re.compile(r"\.(jpe?g|png|webp|bmp|tiff?|gif)$", re.IGNORECASE)
PRINT_SCALE = 3  # the toolbar PNG at 3x the screen size: ~300 dpi at a column's width


def file_stem(*parts) -> str:
    """A file name from its parts: ``file_stem("heads", "coffee.jpg", "layer 12")`` -> heads_coffee_layer12."""
    text = "_".join(IMAGE_SUFFIX.sub("", str(p)) for p in parts if p != "")
    return re.sub(r"[^A-Za-z0-9_-]+", "", text.replace(" ", ""))[:120] or "vitviz"


def show_chart(fig: go.Figure, key: str, filename: str, *, vector: bool = True, **kwargs):
    """``st.plotly_chart`` with the theme off and the toolbar PNG named ``filename`` at print size, and under it the
    chart as SVG and PDF (:func:`chart_downloads`). ``vector=False`` for a map panel whose download row has its own
    SVG and PDF (:class:`ui.display.PanelImage`: the maps at their native resolution)."""
    config = {"displaylogo": False,
              "toImageButtonOptions": {"format": "png", "filename": filename, "scale": PRINT_SCALE}}
    event = st.plotly_chart(fig, theme=None, key=key, config=config, **kwargs)
    if vector:
        chart_downloads(fig, key, filename)
    return event


@st.cache_resource(show_spinner=False)
def _export_unavailable() -> str | None:
    """Whether this server can export charts (kaleido and a browser), looked up once per process."""
    return unavailable_reason()


def chart_downloads(fig: go.Figure, key: str, filename: str) -> None:
    """"Chart (svg)" and "Chart (pdf)" buttons: the figure through Plotly's own export, text as vector text, built on
    the first click (a few seconds: the export starts a headless browser) and kept for later clicks; a click reruns
    nothing. Disabled, with the reason as their help, where the server has no browser for the export."""
    reason = _export_unavailable()
    row = button_row(f"chart-export-{key}")
    for fmt, mime in (("svg", "image/svg+xml"), ("pdf", "application/pdf")):
        row.download_button(f"Chart ({fmt})", built_once(lambda fmt=fmt: chart_file(fig, fmt)), f"{filename}.{fmt}", mime,
                            key=f"chart-{fmt}-{key}", on_click="ignore", disabled=reason is not None,
                            help=reason or "For papers: the chart as drawn here, titles and tick labels as vector "
                                           "text (built on the first click, a few seconds).")


def point_customdata(point) -> list:
    """A selected point's customdata as a list: Streamlit sends it as a list or as a dict {"0": ..., "1": ...}."""
    data = point.get("customdata") if isinstance(point, dict) else getattr(point, "customdata", None)
    if isinstance(data, dict):
        return [data[k] for k in sorted(data, key=lambda k: int(k))]
    return list(data) if data is not None else []
