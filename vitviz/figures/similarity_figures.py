"""Figures of :func:`vitviz.similarity`: the layer x layer CKA map (Kornblith et al. 2019, Fig. 1; Raghu et al. 2021,
Fig. 1) and the curve along its diagonal."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .colour import reference_stops
from .core import clickable_cells

CMAP = "Inferno"


def _axis(names: tuple[str, ...], model: str) -> dict:
    """Every layer labelled 1-based (a ViT's blocks), or by its stage's module name (a CNN's)."""
    blocks = all(n == f"block {i + 1}" for i, n in enumerate(names))
    ticks = [str(i + 1) for i in range(len(names))] if blocks else list(names)
    return dict(title=f"{model}: {'layer (1-based)' if blocks else 'stage'}", tickmode="array",
                tickvals=list(range(1, len(names) + 1)), ticktext=ticks, showgrid=False, zeroline=False)


def cka_heatmap(result, label_a: str = "model A", label_b: str = "model B", *, height: int = 560,
                selected: tuple[int, int] | None = None) -> go.Figure:
    """Layer x layer CKA on one 0-1 scale with its colour bar: model A's layers up the y axis (layer 1 at the bottom),
    model B's along x; hover gives the pair, the value and its interval. Values below 0 (the unbiased estimate can
    fall there on few images) take the lowest colour and keep their value in the hover. Each cell carries a
    transparent marker whose ``customdata`` is [layer_a, layer_b] (0-based), so a click selects it (Plotly heatmaps
    send no clicks).

    Args:
        result: a :class:`vitviz.Similarity` (cka, low, high (L_a, L_b)).
        label_a: model A in words (the y axis title).
        label_b: model B in words (the x axis title).
        height: pixels.
        selected: (layer_a, layer_b), 0-based: outlined.
    """
    la, lb = result.cka.shape
    interval = np.stack([result.low, result.high], -1)
    names_a, names_b = _axis(result.layers_a, label_a)["ticktext"], _axis(result.layers_b, label_b)["ticktext"]
    rows, cols = np.meshgrid(np.arange(la), np.arange(lb), indexing="ij")
    # The hover lives on the cells' markers, which take the clicks (and with them the hover) from the heatmap.
    hover = [f"{label_a} {names_a[i]}, {label_b} {names_b[j]}<br>CKA {result.cka[i, j]:.3f} "
             f"(95 %: {interval[i, j, 0]:.3f} to {interval[i, j, 1]:.3f})<br>click: both layers' token clusters"
             for i, j in zip(rows.ravel(), cols.ravel())]
    fig = go.Figure(go.Heatmap(
        z=result.cka, x=np.arange(1, lb + 1), y=np.arange(1, la + 1), zmin=0, zmax=1,
        colorscale=reference_stops(CMAP), hoverinfo="skip",
        colorbar=dict(title=dict(text="CKA", side="right"), tickvals=[0, 0.25, 0.5, 0.75, 1])))
    clickable_cells(fig, (la, lb), hover, max(8, min(30, 400 // max(la, lb))), selected)
    fig.update_layout(clickmode="event+select", dragmode=False, plot_bgcolor="white", paper_bgcolor="white",
                      font_color="black")
    fig.update_layout(title=f"CKA over {result.images} images: {label_a} (rows) against {label_b} (columns)",
                      # square cells; both axes constrained, so the y axis stays beside the map when x shrinks
                      xaxis=_axis(result.layers_b, label_b) | dict(constrain="domain"),
                      yaxis=_axis(result.layers_a, label_a) | dict(scaleanchor="x", constrain="domain"),
                      height=height, margin=dict(l=70, r=10, t=50, b=60))
    return fig


def cka_diagonal(result, label_a: str = "model A", label_b: str = "model B", *, height: int = 360) -> go.Figure:
    """The curve along the map (:meth:`vitviz.Similarity.diagonal`) with its 95 % interval as a band: two models, each
    layer of A with B's layer at the same relative depth; one model, each layer with the next."""
    diagonal = result.diagonal()
    same = bool(result.settings.get("same_model"))
    x = diagonal["layer_a"].to_numpy() + 1
    fig = go.Figure()
    if np.isfinite(diagonal["low"]).all():
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                 y=np.concatenate([diagonal["high"], diagonal["low"][::-1]]), fill="toself",
                                 fillcolor="rgba(31, 119, 180, 0.2)", line=dict(width=0), hoverinfo="skip",
                                 name="95 % interval"))
    paired = [result.layers_b[j] for j in diagonal["layer_b"]]
    what = "the next layer" if same else f"{label_b}'s layer at the same relative depth"
    fig.add_trace(go.Scatter(x=x, y=diagonal["cka"], mode="lines+markers", name="CKA",
                             line=dict(color="rgb(31, 119, 180)"), customdata=np.stack(
                                 [paired, diagonal["low"], diagonal["high"]], -1),
                             hovertemplate=f"{label_a} layer %{{x}} with {'' if same else label_b + ' '}"
                                           "%{customdata[0]}<br>CKA %{y:.3f} (95 %: %{customdata[1]:.3f} to "
                                           "%{customdata[2]:.3f})<extra></extra>"))
    values = diagonal[["cka", "low", "high"]].to_numpy()
    low = min(0.0, float(np.nanmin(values))) if np.isfinite(values).any() else 0.0
    high = max(1.0, float(np.nanmax(values))) if np.isfinite(values).any() else 1.0
    fig.update_layout(title=f"Each layer of {label_a} with {what}",
                      xaxis=dict(title=f"{label_a}: layer (1-based)", tickmode="linear", tick0=1, dtick=1),
                      yaxis=dict(title="CKA", range=[low - 0.02, high + 0.02]), height=height,
                      margin=dict(l=70, r=10, t=50, b=50), showlegend=False)
    return fig


def median_interval_width(low: np.ndarray, high: np.ndarray) -> float | None:
    """The median width ``high - low`` of a CKA map's intervals over its finite cells, or None when none is finite.

    Args:
        low, high: (La, Lb) interval bounds per pair of layers; NaN where a cell has no interval.
    """
    widths = np.asarray(high, dtype=float) - np.asarray(low, dtype=float)
    widths = widths[np.isfinite(widths)]
    return float(np.median(widths)) if widths.size else None
