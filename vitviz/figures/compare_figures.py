"""Figures comparing models: a per-head statistic against depth, several models overlaid (ViT paper Fig. 7 right)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, label_rgb

from ..analyses.compare import Statistic, model_overview, relative_depth
from .core import qualitative_colours

# Share of one layer's width the models' columns of dots spread over, and the most one model moves.
JITTER_SPAN, JITTER_MAX = 0.5, 0.15
# A shape per model as well as a colour: models stay apart in greyscale print and for colour-blind readers.
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "hexagon", "star")


def model_colours(n: int) -> list[str]:
    """n qualitative colours as rgb() strings (hex ones can be swapped by Streamlit's theme)."""
    return [label_rgb(hex_to_rgb(c)) for c in qualitative_colours(n)]


def depth_comparison(heads: pd.DataFrame, layers: pd.DataFrame, statistic: Statistic, *,
                     relative: bool = False) -> go.Figure:
    """One statistic against depth for several models: each head a dot, a line through each layer's head mean.

    Args:
        heads: :func:`vitviz.analyses.compare.head_summary` (model, layer, head 0-based, mean, std, n_images).
        layers: :func:`vitviz.analyses.compare.layer_summary` of the same (model, layer, depth, mean, n_heads).
        statistic: what the values are (axis title with its unit).
        relative: x = (layer + 1) / L, so models of different depth line up at their last layer;
            otherwise x = layer, 1-based.

    Each model's dots sit slightly left or right of the layer so models do not hide each other;
    error bars are the spread (std) over images. A dot's customdata is [model, layer, head
    (1-based), std, n_images]; the lines' names are ``"<model>: mean over heads"``.
    """
    overview = model_overview(heads, layers)
    colours = model_colours(len(overview))
    max_depth = int(overview["layers"].max()) if len(overview) else 1
    scale = 1 / max_depth if relative else 1.0
    step = min(JITTER_SPAN / max(len(overview), 1), JITTER_MAX) * scale
    fig = go.Figure()
    for m, (model, depth, n_images) in enumerate(overview.itertuples()):
        colour = colours[m]
        h, per_layer = heads[heads["model"] == model], layers[layers["model"] == model]
        offset = (m - (len(overview) - 1) / 2) * step

        def x_of(layer):
            layer = layer.to_numpy()
            return (relative_depth(layer, depth) if relative else layer + 1.0) + offset

        custom = np.stack([np.full(len(h), model, dtype=object), h["layer"].to_numpy() + 1,
                           h["head"].to_numpy() + 1, h["std"].to_numpy(), h["n_images"].to_numpy()], axis=-1)
        fig.add_trace(go.Scatter(
            x=x_of(h["layer"]), y=h["mean"].to_numpy(), mode="markers", customdata=custom, legendgroup=model,
            name=f"{model} ({depth} layers, {n_images} image{'s' if n_images != 1 else ''})",
            marker=dict(color=colour, size=7, opacity=0.85, symbol=SYMBOLS[m % len(SYMBOLS)],
                        line=dict(color="white", width=0.5)),
            # Every statistic here is >= 0 (pixels, nats, shares): the bar stops at 0, not below it.
            error_y=dict(type="data", array=h["std"].to_numpy(), thickness=0.8, width=0, color=colour,
                         arrayminus=np.minimum(h["std"].to_numpy(), h["mean"].to_numpy())),
            hovertemplate="%{customdata[0]}<br>layer %{customdata[1]}" + f" of {depth}"
                          + ", head %{customdata[2]}<br>%{y:.4g} " + statistic.unit
                          + " ± %{customdata[3]:.3g} (std over %{customdata[4]} images)<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=x_of(per_layer["layer"]), y=per_layer["mean"].to_numpy(), mode="lines", legendgroup=model,
            name=f"{model}: mean over heads", showlegend=False, line=dict(color=colour, width=2),
            hovertemplate=f"{model}<br>layer %{{text}} of {depth}: mean over heads %{{y:.4g}} {statistic.unit}"
                          "<extra></extra>", text=(per_layer["layer"] + 1).astype(str).tolist()))
    # What the marks mean, in the legend, so the downloaded PNG explains itself.
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name="dot: one head, bar: ± std over "
                             "images; line: mean over heads", line=dict(color="black", width=2),
                             marker=dict(color="black", size=7), hoverinfo="skip"))
    if relative:
        xaxis = dict(title="relative depth (layer / L)", range=[0, 1 + 0.6 * scale], tickvals=[0, 0.25, 0.5, 0.75, 1])
    else:
        xaxis = dict(title="network depth (layer, 1-based)", tickmode="linear", dtick=1 if max_depth <= 24 else 2,
                     range=[0.5, max_depth + 0.5])
    # The legend above the plot: the models' names are on screen with the dots, not a scroll away.
    fig.update_layout(xaxis=xaxis, yaxis=dict(title=statistic.axis_title, rangemode="tozero"), height=500,
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"),
                      margin=dict(l=70, r=10, t=10, b=50), plot_bgcolor="white", paper_bgcolor="white",
                      font_color="black")
    fig.update_xaxes(showgrid=False, linecolor="black", ticks="outside", zeroline=False)
    fig.update_yaxes(gridcolor="#e5e5e5", linecolor="black", ticks="outside", zeroline=False)
    return fig
