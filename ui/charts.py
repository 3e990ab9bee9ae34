"""Data figures on the page: exact colours, a meaningful file name for the toolbar's PNG.

Streamlit's default Plotly theme rewrites the colours #000001-#000040 in a figure to theme
colours, and Inferno's lowest stop is #000004: every data figure goes through here with
``theme=None`` so the colour maps reach the browser unaltered.
"""
from __future__ import annotations

import re

import plotly.graph_objects as go
import streamlit as st

IMAGE_SUFFIX = re.compile(r"\.(jpe?g|png|webp|bmp|tiff?|gif)$", re.IGNORECASE)
PRINT_SCALE = 3  # the toolbar PNG at 3x the screen size: ~300 dpi at a column's width


def file_stem(*parts) -> str:
    """A file name from its parts: ``file_stem("heads", "coffee.jpg", "layer 12")`` -> heads_coffee_layer12."""
    text = "_".join(IMAGE_SUFFIX.sub("", str(p)) for p in parts if p != "")
    return re.sub(r"[^A-Za-z0-9_-]+", "", text.replace(" ", ""))[:120] or "vitviz"


def show_chart(fig: go.Figure, key: str, filename: str, **kwargs):
    """``st.plotly_chart`` with the theme off and the toolbar PNG named ``filename`` at print size."""
    config = {"displaylogo": False,
              "toImageButtonOptions": {"format": "png", "filename": filename, "scale": PRINT_SCALE}}
    return st.plotly_chart(fig, theme=None, key=key, config=config, **kwargs)


def point_customdata(point) -> list:
    """A selected point's customdata as a list: Streamlit sends it as a list or as a dict {"0": ..., "1": ...}."""
    data = point.get("customdata") if isinstance(point, dict) else getattr(point, "customdata", None)
    if isinstance(data, dict):
        return [data[k] for k in sorted(data, key=lambda k: int(k))]
    return list(data) if data is not None else []
