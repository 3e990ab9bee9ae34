"""Figures of the explanatory views: token clusters, and the steps of one attention row.

Arrays in, ``go.Figure`` out, like :mod:`vitviz.figures.core`; pixels come from :mod:`vitviz.analyses.clusters`
and :mod:`vitviz.figures.overlay`, so the colours are exact.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from PIL import Image
from plotly.colors import hex_to_rgb

from ..analyses.anatomy import AttentionAnatomy
from ..analyses.clusters import cluster_overlay
from .colour import ColourScale
from .core import image_data_uri, map_panel
from ..words import counted
from ..layout import TokenLayout
from .overlay import render_overlay

WHITE = dict(plot_bgcolor="white", paper_bgcolor="white", font_color="black")
SCALED_COLOUR, UNSCALED_COLOUR = "#1f77b4", "#ff7f0e"
# A right-hand axis overlaying the left one gets plotly.js's synced ticks by default: fractions of the left axis's
# range, so the tick meant as 0 could read 2.2e-17 (with ".2g"). "auto" gives the right axis its own round ticks.
RIGHT_AXIS_TICKS = "auto"


def cluster_colours(k: int) -> list[tuple[int, int, int]]:
    """k distinguishable RGB colours (Plotly's D3, then Set3 for the 11th and 12th cluster)."""
    from plotly.colors import qualitative

    palette = qualitative.D3 + ["#ffed6f", "#b15928"]
    return [hex_to_rgb(c) for c in palette[:k]]


def cluster_figure(image: Image.Image, labels: np.ndarray, layout: TokenLayout, *, title: str = "",
                   opacity: float = 0.55, height: int = 460) -> go.Figure:
    """Clusters as coloured regions over the image, a legend with each cluster's size, hover per patch.

    labels: (gh, gw) ints 0..K-1 (0 = largest); shown 1-based.
    """
    k = int(labels.max()) + 1
    colours = cluster_colours(k)
    tile = cluster_overlay(image, labels, colours, opacity=opacity, zoom=2)
    ph, pw = layout.patch_size
    rows, cols = np.indices(labels.shape)
    token = rows * labels.shape[1] + cols + layout.num_prefix_tokens
    fig = go.Figure(go.Image(source=image_data_uri(tile), dx=0.5, dy=0.5, hoverinfo="skip"))
    fig.add_trace(go.Heatmap(
        z=(labels + 1).astype(np.float32), x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=0, showscale=False,
        customdata=np.stack([token, rows + 1, cols + 1], axis=-1), name="cluster",
        hovertemplate="token %{customdata[0]} · patch row %{customdata[1]}, col %{customdata[2]}"
                      "<br>cluster %{z}<extra></extra>"))
    sizes = np.bincount(labels.ravel(), minlength=k)
    for c in range(k):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{c + 1}: {counted(int(sizes[c]), 'patch')} "
                                 f"({sizes[c] / labels.size:.0%})",
                                 marker=dict(symbol="square", size=14, color="rgb(%d, %d, %d)" % colours[c])))
    fig.update_xaxes(visible=False, range=[0, image.width])
    fig.update_yaxes(visible=False, range=[image.height, 0], scaleanchor="x")
    fig.update_layout(title=dict(text=title, font_size=14, x=0), height=height, margin=dict(l=0, r=0, t=40, b=0),
                      legend=dict(title="cluster (by size)", itemclick=False, itemdoubleclick=False), **WHITE)
    return fig


def score_map_figure(image: Image.Image, scores: np.ndarray, layout: TokenLayout, *, query: int | None,
                     title: str, value_name: str = "q·k", cmap: str = "Viridis") -> go.Figure:
    """Scores over the patches (prefix tokens left out), coloured from the row's lowest to its highest.

    The softmax is unchanged by a constant added to every score, so the row's own range is the
    informative one. scores: (N,) one value per token; query: the query patch (raster index) to outline.
    """
    from .overlay import Marks

    grid = layout.patch_grid(scores)
    lo, hi = float(grid.min()), float(grid.max())
    scale = ColourScale(lo, hi if hi > lo else lo + 1.0, rule="the row's lowest to highest score over the patches")
    tile = render_overlay(image, grid, scale, cmap=cmap, style="heatmap", opacity=0.85, marks=Marks(query=query))
    return map_panel([tile], grid[None], [scale], [""], layout, cmap=cmap, value_name=value_name,
                     columns=1, tile_px=380, title=title)


def sorted_scores_figure(a: AttentionAnatomy, layout: TokenLayout, top: int = 30) -> go.Figure:
    """The ``top`` highest scores q·k_j as sorted bars, each token's attention weight as a dot beside them."""
    order = np.argsort(-a.scores, kind="stable")[:top]
    names = [layout.token_name(int(j)).split(" (")[0] for j in order]
    fig = go.Figure([
        go.Bar(x=names, y=a.scores[order], marker_color=SCALED_COLOUR, name="score q·k<sub>j</sub>",
               customdata=a.scaled[order],
               hovertemplate="%{x}<br>q·k = %{y:.3f}<br>" + ("scaled + bias" if np.any(a.bias) else "scaled")
                             + " = %{customdata:.3f}<extra></extra>"),
        go.Scatter(x=names, y=a.weights[order], mode="markers", yaxis="y2", name="attention weight (after step 4)",
                   marker=dict(color="black", size=7), hovertemplate="%{x}<br>attention = %{y:.4f}<extra></extra>"),
    ])
    fig.update_layout(title=dict(text=f"The {len(order)} highest scores q·k<sub>j</sub> of {len(a.scores)}, sorted",
                                 font_size=14, x=0),
                      xaxis=dict(title="key token j", tickangle=-60, tickfont_size=10),
                      yaxis=dict(title="q·k (unscaled)", zeroline=True, zerolinecolor="black", gridcolor="#e5e5e5"),
                      yaxis2=dict(title="attention weight", overlaying="y", side="right", rangemode="tozero",
                                  showgrid=False, tickmode=RIGHT_AXIS_TICKS),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      height=400, margin=dict(l=60, r=60, t=60, b=90), **WHITE)
    return fig


def softmax_figure(a: AttentionAnatomy, layout: TokenLayout, top: int = 20) -> go.Figure:
    """Softmax of the scores without and with the 1/sqrt(d) scaling, for the ``top`` tokens by weight."""
    order = np.argsort(-a.weights, kind="stable")[:top]
    names = [layout.token_name(int(j)).split(" (")[0] for j in order]
    d = len(a.q)
    b = " + b" if np.any(a.bias) else ""  # BEiT's relative position bias is in both rows
    fig = go.Figure([
        go.Bar(x=names, y=a.unscaled_weights[order], name=f"softmax(q·k{b}): no scaling, H = "
               f"{a.entropy(a.unscaled_weights):.2f} nats", marker_color=UNSCALED_COLOUR,
               hovertemplate="%{x}<br>%{y:.4f}<extra>no scaling</extra>"),
        go.Bar(x=names, y=a.weights[order], name=f"softmax(q·k / √{d}{b}): the model's row, H = "
               f"{a.entropy(a.weights):.2f} nats", marker_color=SCALED_COLOUR,
               hovertemplate="%{x}<br>%{y:.4f}<extra>scaled (the model)</extra>"),
    ])
    fig.update_layout(barmode="group", title=dict(text=f"Softmax before and after scaling, the {len(order)} "
                                                       "tokens with the largest attention", font_size=14, x=0),
                      xaxis=dict(title="key token j", tickangle=-60, tickfont_size=10),
                      yaxis=dict(title="attention weight (row sums to 1)", rangemode="tozero", gridcolor="#e5e5e5"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
                      height=360, margin=dict(l=60, r=10, t=70, b=90), **WHITE)
    return fig


def contributions_figure(a: AttentionAnatomy, layout: TokenLayout, top: int = 15) -> go.Figure:
    """The ``top`` tokens by weight: weight and the norm of their contribution w_j v_j, side by side."""
    order = a.top_contributors(top)
    names = [layout.token_name(int(j)).split(" (")[0] for j in order]
    norms = np.linalg.norm(a.contributions[order], axis=1)
    fig = go.Figure([
        go.Bar(x=names, y=a.weights[order], name="weight w<sub>j</sub>", marker_color=SCALED_COLOUR,
               offsetgroup=0, hovertemplate="%{x}<br>w = %{y:.4f}<extra></extra>"),
        go.Bar(x=names, y=norms, name="‖w<sub>j</sub> v<sub>j</sub>‖", marker_color="#2ca02c", yaxis="y2",
               offsetgroup=1, hovertemplate="%{x}<br>‖w v‖ = %{y:.3f}<extra></extra>"),
    ])
    fig.update_layout(title=dict(text=f"The {len(order)} largest weights and the size of what each token adds",
                                 font_size=14, x=0),
                      xaxis=dict(title="value token j", tickangle=-60, tickfont_size=10),
                      yaxis=dict(title="weight w<sub>j</sub>", rangemode="tozero", gridcolor="#e5e5e5"),
                      yaxis2=dict(title="‖w<sub>j</sub> v<sub>j</sub>‖ (contribution norm)", overlaying="y",
                                  side="right", rangemode="tozero", showgrid=False, tickmode=RIGHT_AXIS_TICKS),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
                      height=400, margin=dict(l=60, r=85, t=70, b=90), **WHITE)
    return fig


def vector_figure(vector: np.ndarray, title: str, y_title: str) -> go.Figure:
    """A vector's components as bars (dimension 1..d on x)."""
    fig = go.Figure(go.Bar(x=np.arange(1, len(vector) + 1), y=vector, marker_color="#555555",
                           hovertemplate="dim %{x}: %{y:.3f}<extra></extra>"))
    fig.update_layout(title=dict(text=title, font_size=14, x=0), xaxis_title="dimension (1-based)",
                      yaxis=dict(title=y_title, zeroline=True, zerolinecolor="black", gridcolor="#e5e5e5"),
                      height=260, margin=dict(l=60, r=10, t=40, b=45), bargap=0.1, **WHITE)
    return fig
