"""Plotly figure builders: arrays in, ``go.Figure`` out. No Streamlit, no maths beyond display scaling."""
from __future__ import annotations

import base64
import io

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from .layout import TokenLayout


def png_data_uri(image: Image.Image) -> str:
    """The image as an inline PNG: a few kB to the browser instead of a JSON array of pixels."""
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def attention_overlay(image: Image.Image, grid_map: np.ndarray, layout: TokenLayout, *,
                      opacity: float = 0.6, colorscale: str = "Inferno", title: str = "") -> go.Figure:
    """A (gh, gw) map drawn over the model-input image, one cell per patch.

    The image goes to the browser as a PNG; the map as gh x gw values, never upsampled.
    """
    ph, pw = layout.patch_size
    fig = go.Figure(go.Image(source=png_data_uri(image)))
    fig.add_trace(go.Heatmap(
        z=grid_map, x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=opacity, colorscale=colorscale,
        colorbar=dict(title="attention", thickness=12),
        hovertemplate="row %{customdata[0]}, col %{customdata[1]}<br>attention %{z:.4f}<extra></extra>",
        customdata=np.stack(np.indices(grid_map.shape), axis=-1),
    ))
    fig.update_layout(title=title, margin=dict(l=0, r=0, t=30 if title else 0, b=0),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, scaleanchor="x"))
    return fig
