"""Every figure gets a data download (npz or CSV) and its settings as JSON; images also as PNG, map panels also
as SVG and PDF."""
from __future__ import annotations

import hashlib
import io
import json
from typing import Callable

import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


PREPARED = "download_bytes"  # session key: (name, kind) -> (content digest, file bytes)


def _digest(arrays: dict[str, np.ndarray] | None = None, image: Image.Image | None = None) -> str:
    h = hashlib.sha256()
    for key, value in (arrays or {}).items():
        value = np.ascontiguousarray(value)
        h.update(f"{key}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes() if value.dtype != object else repr(value.tolist()).encode())
    if image is not None:
        h.update(f"{image.mode}|{image.size}|".encode())
        h.update(image.tobytes())
    return h.hexdigest()


def _once(name: str, kind: str, digest: str, build: Callable[[], bytes]) -> bytes:
    """The file's bytes, built once per content and kept for the session (one entry per button)."""
    held = st.session_state.setdefault(PREPARED, {})
    entry = held.get((name, kind))
    if entry is None or entry[0] != digest:
        entry = held[(name, kind)] = (digest, build())
    return entry[1]


def built_once(build: Callable[[], bytes | str]) -> Callable[[], bytes | str]:
    """``build`` run once, on the first call; later calls (more clicks on the same button) get the same bytes."""
    held: list = []

    def once():
        if not held:
            held.append(build())
        return held[0]
    return once


def button_row(key: str):
    """A row for download buttons: each button as wide as its label, the row wrapping onto a second line only where
    the column is too narrow for all of them (equal columns cut the labels in a half-width column: "Settings …")."""
    return st.container(horizontal=True, gap="xsmall", key=key)


def download_row(name: str, arrays: dict[str, np.ndarray] | pd.DataFrame, settings: dict | None,
                 png: Image.Image | Callable[[], Image.Image] | None = None, *, prepared: bool = False) -> None:
    """Buttons under a figure, files named ``name.*``. Plotly's own toolbar also saves any chart as PNG.

    The files are built only when a button is first clicked (deferred data), not on every rerun, and a click
    reruns nothing (``on_click="ignore"``);
    ``arrays`` may be a table (saved as CSV), ``png`` a function returning the image; ``settings`` None: no
    settings button (a second row under the same figure, whose settings the first row already offers).
    ``prepared``: plain buttons holding the files' bytes, built once per content (hashed) and kept in the
    session, for small files: the click is then an ordinary browser download that reruns nothing
    (``on_click="ignore"``; the filters page's deferred npz, with its rerun of the page, once left a
    spinner that never ended).
    """
    row = button_row(f"downloads-{name}")
    if prepared and not isinstance(arrays, pd.DataFrame):
        image = png() if callable(png) else png
        row.download_button("Data (npz)", _once(name, "npz", _digest(arrays), lambda: npz_bytes(arrays)),
                            f"{name}.npz", "application/octet-stream", key=f"npz-{name}", on_click="ignore")
        row.download_button("Settings (json)", json.dumps(settings, indent=2, default=str), f"{name}.json",
                            "application/json", key=f"json-{name}", on_click="ignore")
        if image is not None:
            row.download_button("Image (png)", _once(name, "png", _digest(image=image), lambda: png_bytes(image)),
                                f"{name}.png", "image/png", key=f"png-{name}", on_click="ignore")
        return
    # Deferred files: built by Streamlit's file handler on the first click, kept for further clicks on the same
    # view (``built_once``), and ``on_click="ignore"``: a click is an ordinary browser download that reruns nothing.
    if isinstance(arrays, pd.DataFrame):
        row.download_button("Data (csv)", built_once(lambda: arrays.to_csv(index=False)), f"{name}.csv", "text/csv",
                            key=f"csv-{name}", on_click="ignore")
    else:
        row.download_button("Data (npz)", built_once(lambda: npz_bytes(arrays)), f"{name}.npz",
                            "application/octet-stream", key=f"npz-{name}", on_click="ignore")
    if settings is not None:
        row.download_button("Settings (json)", json.dumps(settings, indent=2, default=str), f"{name}.json",
                            "application/json", key=f"json-{name}", on_click="ignore")
    if png is not None:
        image = built_once(lambda: png_bytes(png() if callable(png) else png))
        row.download_button("Image (png)", image, f"{name}.png", "image/png", key=f"png-{name}", on_click="ignore")
    vector = getattr(png, "vector", None)  # a map panel (ui.display.PanelImage): also SVG and PDF with vector text
    if vector is not None:
        for fmt, mime in (("svg", "image/svg+xml"), ("pdf", "application/pdf")):
            row.download_button(f"Image ({fmt})", built_once(lambda fmt=fmt: vector(fmt)), f"{name}.{fmt}", mime,
                                key=f"{fmt}-{name}", on_click="ignore",
                                help="For papers: titles, tick labels and the colour bar as vector text; the maps "
                                     "embedded at the model input's resolution.")
