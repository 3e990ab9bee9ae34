"""Figures of :mod:`vitviz.attribution`: signed relevance maps on a diverging scale centred on 0, and the
conservation figure (how much of the target's value reaches the pixels)."""
from __future__ import annotations

import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from PIL import Image

from ..attribution import LABELS, Attribution
from .colour import DIVERGING, ROBUST_PERCENTILE, lookup_table, reference_stops

SEQUENTIAL_MAP = "Inferno"


def _signed(method: str) -> bool:
    return method not in ("legrad", "gradcam")


def robust_limit(values: np.ndarray) -> float:
    """The 99th percentile of |values| (one hot patch must not flatten the rest); never 0."""
    limit = float(np.percentile(np.abs(values), ROBUST_PERCENTILE))
    return limit if limit > 0 else float(np.abs(values).max()) or 1.0


def maps_figure(image: Image.Image, results: list[Attribution], index: int = 0, pixels: bool = True,
                target_text: str = "", with_input: bool = True, wrap: int | None = None,
                plot_height: int = 265) -> go.Figure:
    """The model input and one map per method for image ``index``: signed relevance (AttnLRP, CP-LRP,
    Gradient × Input) on a diverging scale centred on 0 with symmetric robust limits, LeGrad and Grad-CAM
    (non-negative) on Inferno from 0. Each map has its own colour bar (the methods' units differ).

    Args:
        with_input: False leaves the model input out (a map drawn beside another figure of the same image).
        wrap: break the title's lines at this many characters (a figure narrower than the page).
        plot_height: pixels of the maps' area, below the title.
    """
    first = 2 if with_input else 1
    n = len(results) + first - 1
    titles = (["model input"] if with_input else []) + [
        LABELS[r.method] + (" (pixels)" if pixels and r.pixels is not None else "") for r in results]
    # Each colour bar's title runs up beside its bar (side "right"): above the bar, "0–1 (min-max)" ran into the next
    # map; the gap between maps holds the bar, its ticks and that one line.
    fig = make_subplots(rows=1, cols=n, subplot_titles=titles, horizontal_spacing=0.09)
    if with_input:
        fig.add_trace(go.Image(z=np.asarray(image.convert("RGB"))), row=1, col=1)
    notes = []
    for i, r in enumerate(results):
        at_pixels = pixels and r.pixels is not None
        grid = r.pixels[index] if at_pixels else r.patches[index]
        signed = _signed(r.method)
        limit = robust_limit(grid)
        clipped = int((np.abs(grid) > limit).sum()) if signed else int((grid > limit).sum())
        if clipped:
            notes.append(f"{LABELS[r.method]}: {clipped} {'pixels' if at_pixels else 'patches'} "
                         f"{'beyond ±' if signed else 'above '}{limit:.3g} drawn at the end colour")
        col = i + first
        right = fig.layout[f"xaxis{col if col > 1 else ''}"].domain[1]
        unit = "relevance" if signed else "0–1 (min-max)" if r.method == "legrad" else "ReLU(Σ w·A)"
        fig.add_trace(go.Heatmap(
            z=grid[::-1], zmin=-limit if signed else 0.0, zmax=limit,
            colorscale=reference_stops(DIVERGING) if signed else reference_stops(SEQUENTIAL_MAP),
            colorbar=dict(title=dict(text=unit, side="right", font=dict(size=11)), len=0.75, thickness=10,
                          x=right + 0.004, xanchor="left", tickfont=dict(size=10)),
            hovertemplate="row %{y}, col %{x}: %{z:.4g}<extra>" + LABELS[r.method] + "</extra>"),
            row=1, col=col)
        fig.update_yaxes(scaleanchor=f"x{col if col > 1 else ''}", row=1, col=col)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    meaning = ("signed maps: red raises the target, blue lowers it, white is 0 (limits ±99th percentile of |value|)"
               if any(_signed(r.method) for r in results) else "")
    title = f"Attribution of the {target_text}" if target_text else "Attribution"
    lines = []
    for text, small in [(title, False)] + [(t, True) for t in (meaning, "; ".join(notes)) if t]:
        # <sup> text is about 0.7 of the title's size: its lines may be longer
        parts = textwrap.wrap(text, int(wrap * 1.4) if small else wrap) if wrap else [text]
        lines += [f"<sup>{part}</sup>" if small else part for part in parts]
    # The title hangs from the top; the plot keeps its height under a longer one (about 22 px a line, and room for
    # the maps' own titles).
    top = max(135, 64 + 22 * len(lines))
    fig.update_layout(title=dict(text="<br>".join(lines), y=1, yref="container", yanchor="top", pad=dict(t=24)),
                      height=plot_height + top, margin=dict(l=10, r=50, t=top, b=10), template="plotly_white")
    return fig


def conservation_figure(results: list[Attribution], index: int = 0, target_text: str = "") -> go.Figure:
    """Per relevance method: the target's value beside the relevance the pixels receive (their sum). What
    is missing went to the prefix tokens, the position embedding, biases and (AttnLRP) the softmax."""
    methods = [r for r in results if r.pixels is not None]
    names = [LABELS[r.method] for r in methods]
    value = [float(r.target_value[index]) for r in methods]
    at_pixels = [float(r.pixel_sum[index]) for r in methods]
    share = [p / v if v else float("nan") for p, v in zip(at_pixels, value)]
    fig = go.Figure([
        go.Bar(name="target value", x=names, y=value, marker_color="rgb(120, 120, 120)",
               hovertemplate="%{x}: target value %{y:.4g}<extra></extra>"),
        go.Bar(name="relevance at the pixels", x=names, y=at_pixels, marker_color="rgb(178, 24, 43)",
               text=[f"{s:.1%} of the value" for s in share], textposition="outside",
               hovertemplate="%{x}: the pixels receive %{y:.4g}<extra></extra>"),
    ])
    fig.update_traces(width=0.25)
    fig.update_layout(barmode="group", template="plotly_white", height=340, bargroupgap=0.1,
                      title=dict(text="Conservation: how much of the target reaches the pixels"
                                      + (f"<br><sup>target: {target_text}</sup>" if target_text else "")),
                      yaxis_title="target units", margin=dict(l=10, r=10, t=80, b=10),
                      legend=dict(orientation="h", y=-0.15))
    return fig


def relevance_overlay(image: Image.Image, grid: np.ndarray, limit: float | None = None) -> Image.Image:
    """The model input blended with a signed patch or pixel map on the diverging scale (for downloads)."""
    limit = limit or robust_limit(grid)
    lut = lookup_table(DIVERGING)
    idx = np.clip((grid / limit + 1) / 2 * 255, 0, 255).astype(np.uint8)
    colours = Image.fromarray(lut[idx]).resize(image.size, Image.NEAREST)
    return Image.blend(image.convert("RGB"), colours, 0.6)
