"""Figures of the readout (:mod:`vitviz.residual`): the layer x head heatmap of direct contributions (each cell
clickable), the contributions of the other components per layer, and the logit lens as layers x classes.

Colours reach the browser as ``rgb()`` stops (never a scale by name: Streamlit's theme rewrites #000001-#000040).
Layers and heads are 1-based on screen; every cell's hover names its layer, head and value.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .colour import DIVERGING, reference_stops
from .core import clickable_cells

SEQUENTIAL = "Viridis"


def _symmetric_limit(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    return top if top > 0 else 1.0


def heatmap_limit(values: np.ndarray, robust: bool = True) -> float:
    """The diverging heatmap's limit: ± the 95th percentile of |value| (robust: a few heads that dominate the last
    layer do not wash out the rest; the cells beyond are marked), or ± the largest |value|."""
    finite = np.abs(values[np.isfinite(values)])
    if robust and finite.size:
        top = float(np.percentile(finite, 95))
        return top if top > 0 else _symmetric_limit(values)
    return _symmetric_limit(values)


def contribution_heatmap(heads: np.ndarray, colour_bar: str, selected: tuple[int, int] | None = None,
                         names: np.ndarray | None = None, height: int = 420, robust: bool = True) -> go.Figure:
    """(L, H) direct contributions, layers down and heads across (both 1-based), on the diverging map centred on 0
    (red raises the target, blue lowers it) with limits :func:`heatmap_limit`; cells beyond the limit are drawn in
    the end colour and marked with a white ▲ (above) or ▼ (below). Each cell carries a transparent marker whose
    ``customdata`` is [layer, head] (0-based), so a click selects it (Plotly heatmaps send no clicks).

    Args:
        names: (L, H) a short text per head (its top class), shown in the hover.
        selected: (layer, head), 0-based: outlined.
    """
    L, H = heads.shape
    limit = heatmap_limit(heads, robust)
    text = names if names is not None else np.full((L, H), "", dtype=object)
    hover = [[f"layer {l + 1}, head {h + 1}<br>{heads[l, h]:+.4g}" + (f"<br>writes toward: {text[l, h]}"
                                                                     if text[l, h] else "")
              for h in range(H)] for l in range(L)]
    fig = go.Figure(go.Heatmap(
        z=heads, x=np.arange(1, H + 1), y=np.arange(1, L + 1), zmin=-limit, zmax=limit,
        colorscale=reference_stops(DIVERGING), text=hover, hoverinfo="text",
        colorbar=dict(title=dict(text=colour_bar, side="right"), thickness=14)))
    marks = np.where(heads > limit, "▲", np.where(heads < -limit, "▼", ""))
    clickable_cells(fig, (L, H), hover, max(8, min(28, 360 // max(L, H))), selected, marks)
    fig.update_layout(height=height, margin=dict(l=50, r=10, t=30, b=40), plot_bgcolor="white",
                      paper_bgcolor="white", font_color="black", clickmode="event+select", dragmode=False,
                      title=dict(text="Direct contribution of each head (click a cell for its patches)", font_size=13))
    fig.update_xaxes(title="head", tickmode="linear", dtick=1, showgrid=False, range=[0.5, H + 0.5], zeroline=False)
    fig.update_yaxes(title="layer", tickmode="linear", dtick=1, range=[L + 0.5, 0.5], showgrid=False, zeroline=False)
    return fig


def component_bars(attn_heads: np.ndarray, attn_bias: np.ndarray, mlp: np.ndarray, embed: float, bias: float,
                   unit: str, height: int = 420) -> go.Figure:
    """Per layer (1-based) the summed heads, the attention bias and the MLP side by side; the embedding and the
    readout's constant as bars of their own at the left."""
    L = len(mlp)
    layers = [f"{l + 1}" for l in range(L)]
    x = ["embed", "constant"] + layers
    fig = go.Figure()
    for name, values, colour in (("heads (sum)", attn_heads, "rgb(31, 119, 180)"),
                                 ("attention bias", attn_bias, "rgb(148, 103, 189)"),
                                 ("MLP", mlp, "rgb(255, 127, 14)")):
        fig.add_trace(go.Bar(x=layers, y=values, name=name, marker_color=colour,
                             hovertemplate=f"layer %{{x}} · {name}: %{{y:+.4g}}<extra></extra>"))
    fig.add_trace(go.Bar(x=["embed", "constant"], y=[embed, bias], name="embedding · constant",
                         marker_color="rgb(127, 127, 127)", hovertemplate="%{x}: %{y:+.4g}<extra></extra>"))
    fig.update_layout(barmode="group", height=height, margin=dict(l=50, r=10, t=30, b=90), plot_bgcolor="white",
                      paper_bgcolor="white", font_color="black",
                      legend=dict(orientation="h", y=-0.22, yanchor="top", x=0, font_size=11),
                      title=dict(text="Other components, per layer", font_size=13))
    fig.update_xaxes(title="layer", categoryorder="array", categoryarray=x, type="category")
    fig.update_yaxes(title=unit, zeroline=True, zerolinecolor="rgb(120, 120, 120)", gridcolor="rgb(230, 230, 230)")
    return fig


def logit_lens_figure(probabilities: np.ndarray, classes: list[int], labels: list[str], title: str,
                      height: int = 420) -> go.Figure:
    """(L, K) the probability of each of K classes read after each block (layers down, 1-based), 0-1 on Viridis
    with its colour bar; the columns are the classes named."""
    L, K = probabilities.shape
    names = [f"{c}: {n}" for c, n in zip(classes, labels)]
    fig = go.Figure(go.Heatmap(
        z=probabilities, x=names, y=np.arange(1, L + 1), zmin=0.0, zmax=1.0,
        colorscale=reference_stops(SEQUENTIAL), colorbar=dict(title=dict(text="probability", side="right"),
                                                               thickness=14),
        hovertemplate="layer %{y} · %{x}<br>probability %{z:.3f}<extra></extra>"))
    fig.update_layout(height=height, margin=dict(l=50, r=10, t=30, b=110), plot_bgcolor="white",
                      paper_bgcolor="white", font_color="black", title=dict(text=title, font_size=13))
    fig.update_xaxes(title="class", tickangle=-35, type="category")
    fig.update_yaxes(title="layer", tickmode="linear", dtick=1, autorange="reversed")
    return fig


def lens_classes(logits: np.ndarray, per_layer: int = 2, limit: int = 10) -> list[int]:
    """The classes a logit-lens figure shows for (L, C) logits: the final top-1 first, then each layer's top
    ``per_layer`` from the last layer up, at most ``limit``."""
    order = [int(logits[-1].argmax())]
    for row in logits[::-1]:
        for c in np.argsort(-row, kind="stable")[:per_layer]:
            if int(c) not in order:
                order.append(int(c))
    return order[:limit]
