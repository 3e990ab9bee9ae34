"""The floor for browser_interactivity.py: the least a Streamlit page with one slider and one Plotly figure costs.

One 224 px image with a 16x16 heatmap over it, in a figure about the heads grid's size, laid out
like the heads page (controls column | figure column). Moving the slider redraws the heatmap.
Run: .venv/bin/python -m streamlit run benchmarks/floor_app.py
"""
import base64
import io
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from PIL import Image

INFERNO = [[0.0, "rgb(0, 0, 4)"], [0.1111, "rgb(27, 12, 65)"], [0.2222, "rgb(74, 12, 107)"],
           [0.3333, "rgb(120, 28, 109)"], [0.4444, "rgb(165, 44, 96)"], [0.5556, "rgb(207, 68, 70)"],
           [0.6667, "rgb(237, 105, 37)"], [0.7778, "rgb(251, 155, 6)"], [0.8889, "rgb(247, 209, 61)"],
           [1.0, "rgb(252, 255, 164)"]]


@st.cache_data
def image_uri() -> str:
    image = Image.open(Path(__file__).resolve().parent.parent / "assets" / "astronaut.jpg").convert("RGB")
    buf = io.BytesIO()
    image.resize((224, 224)).save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


st.set_page_config(page_title="floor", layout="wide")
st.header("Floor: one slider, one figure")
controls, right = st.columns([1, 3.3])
value = controls.slider("Layer", 1, 12, 12, key="floor_layer")
z = np.random.default_rng(value).random((16, 16)).astype(np.float32)
fig = go.Figure([go.Image(source=image_uri(), hoverinfo="skip"),
                 go.Heatmap(z=z, x0=7, dx=14, y0=7, dy=14, opacity=0.6, colorscale=INFERNO)])
fig.update_xaxes(visible=False, range=[0, 224])
fig.update_yaxes(visible=False, range=[224, 0], scaleanchor="x")
fig.update_layout(height=560, margin=dict(l=0, r=0, t=30, b=0), title=f"value {value}",
                  plot_bgcolor="white", paper_bgcolor="white")
right.plotly_chart(fig, theme=None, key="floor_chart")
