"""Every figure gets a data download (npz or CSV) and its settings as JSON; images also as PNG."""
from __future__ import annotations

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


def download_row(name: str, arrays: dict[str, np.ndarray] | pd.DataFrame, settings: dict,
                 png: Image.Image | Callable[[], Image.Image] | None = None) -> None:
    """Buttons under a figure, files named ``name.*``. Plotly's own toolbar also saves any chart as PNG.

    The files are built only when a button is clicked (deferred data), not on every rerun;
    ``arrays`` may be a table (saved as CSV), ``png`` a function returning the image.
    """
    cols = st.columns(3)
    if isinstance(arrays, pd.DataFrame):
        cols[0].download_button("Data (csv)", lambda: arrays.to_csv(index=False), f"{name}.csv", "text/csv",
                                key=f"csv-{name}")
    else:
        cols[0].download_button("Data (npz)", lambda: npz_bytes(arrays), f"{name}.npz", "application/octet-stream",
                                key=f"npz-{name}")
    cols[1].download_button("Settings (json)", lambda: json.dumps(settings, indent=2, default=str), f"{name}.json",
                            "application/json", key=f"json-{name}")
    if png is not None:
        cols[2].download_button("Image (png)", lambda: png_bytes(png() if callable(png) else png), f"{name}.png", "image/png", key=f"png-{name}")
