"""Figures of :mod:`vitviz.heads`: one head's queries and keys in 2-D, every head of a layer as small multiples,
the colour wheel's key, and a layer x head heatmap of ablation or patching effects.

Colours reach the browser as ``rgb()`` strings (the Plotly theme placeholders #000001-#000040 never appear).
Queries are filled circles and keys open diamonds in every colouring; prefix tokens are drawn larger with a black
rim. Each point's ``customdata`` is [image (0-based), token (0-based), 0 for a query / 1 for a key].
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..figures.colour import reference_stops
from ..layout import TokenLayout
from .qk import HeadPicture, position_colours

KIND_COLOURS = {"query": "rgb(31, 119, 180)", "key": "rgb(214, 39, 40)"}  # tab10 blue, red
IMAGE_COLOURS = ["rgb(31, 119, 180)", "rgb(255, 127, 14)", "rgb(44, 160, 44)", "rgb(214, 39, 40)",
                 "rgb(148, 103, 189)", "rgb(140, 86, 75)", "rgb(227, 119, 194)", "rgb(127, 127, 127)",
                 "rgb(188, 189, 34)", "rgb(23, 190, 207)"]
PLURAL = {"query": "queries", "key": "keys"}
COLOUR_TEXT = {"kind": "query / key", "position": "patch position (colour wheel)", "image": "image"}


def _rgb(c) -> str:
    return f"rgb({int(c[0])}, {int(c[1])}, {int(c[2])})"


def _traces(p: HeadPicture, layout: TokenLayout, names: list[str], colour_by: str, small: bool) -> list[go.Scatter]:
    """One trace per (kind, group of colour) so the legend says what the colours are."""
    wheel = position_colours(layout)
    npt = layout.num_prefix_tokens
    traces = []
    for kind, symbol in (("query", "circle"), ("key", "diamond-open")):
        for group in (sorted(set(p.image)) if colour_by == "image" else [None]):
            chosen = (p.kind == kind) & ((p.image == group) if group is not None else True)
            idx = np.flatnonzero(chosen)
            if not len(idx):
                continue
            tokens = p.token[idx]
            if colour_by == "position":
                colour = [_rgb(wheel[t]) for t in tokens]
                name = PLURAL[kind]
            elif colour_by == "image":
                colour = IMAGE_COLOURS[int(group) % len(IMAGE_COLOURS)]
                name = f"{PLURAL[kind]} · {names[int(group)]}"
            else:
                colour = KIND_COLOURS[kind]
                name = PLURAL[kind]
            prefix = tokens < npt
            hover = [f"{names[i]}<br>{kind} · {layout.token_name(t) if t < layout.num_tokens else f'token {t}'}"
                     for i, t in zip(p.image[idx], tokens)]
            size = (4 if small else 7) + prefix * (3 if small else 6)
            traces.append(go.Scattergl(
                x=p.xy[idx, 0], y=p.xy[idx, 1], mode="markers", name=name, showlegend=not small,
                legendgroup=name,
                marker=dict(symbol=symbol, color=colour, size=size,
                            line=dict(color=np.where(prefix, "rgb(0, 0, 0)", colour).tolist() if symbol == "circle"
                                      else colour, width=np.where(prefix, 1.5, 0.0 if symbol == "circle" else 1.2)
                                      .tolist())),
                customdata=np.stack([p.image[idx], tokens, np.full(len(idx), int(kind == "key"))], 1),
                hovertext=hover, hoverinfo="text"))
    return traces


def qk_scatter(p: HeadPicture, layout: TokenLayout, names: list[str], colour_by: str = "kind",
               selected: tuple[int, int, int] | None = None, height: int = 560) -> go.Figure:
    """One head's corrected queries and keys in 2-D; ``selected`` (image, token, kind 0/1) is ringed."""
    fig = go.Figure(_traces(p, layout, names, colour_by, small=False))
    if selected is not None:
        image, token, key = selected
        hit = np.flatnonzero((p.image == image) & (p.token == token) & (p.kind == ("key" if key else "query")))
        if len(hit):
            fig.add_trace(go.Scatter(x=p.xy[hit, 0], y=p.xy[hit, 1], mode="markers", name="clicked", hoverinfo="skip",
                                     marker=dict(symbol="circle-open", size=22, color="rgb(0, 0, 0)",
                                                 line=dict(width=3))))
    method = {"pca": "PCA", "tsne": "t-SNE", "umap": "UMAP"}[p.projection]
    fig.update_layout(
        title=dict(text=f"Layer {p.layer + 1}, head {p.head + 1}: queries (●) and keys (◇), {method}<br>"
                        f"<span style='font-size:12px'>coloured by {COLOUR_TEXT[colour_by]} · distance–dot correlation "
                        f"{p.correlation_before:+.2f} → {p.correlation_after:+.2f} after the corrections; prefix "
                        "tokens large, black rim</span>", font=dict(size=15)),
        height=height, margin=dict(l=40, r=10, t=70, b=40), plot_bgcolor="rgb(250, 250, 250)",
        xaxis=dict(title=f"{method} 1", zeroline=False), yaxis=dict(title=f"{method} 2", zeroline=False),
        legend=dict(orientation="h", y=-0.12), clickmode="event+select", dragmode="pan")
    return fig


def qk_grid(pictures: list[HeadPicture], layout: TokenLayout, names: list[str], colour_by: str = "kind",
            columns: int = 6) -> go.Figure:
    """Every head of a layer as small multiples (AttentionViz's overview), titled with head and correlation."""
    from plotly.subplots import make_subplots

    rows = -(-len(pictures) // columns)
    titles = [f"head {p.head + 1} · r {p.correlation_after:+.2f}" for p in pictures]
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.08 if rows > 1 else 0.0)
    for i, p in enumerate(pictures):
        for trace in _traces(p, layout, names, colour_by, small=True):
            fig.add_trace(trace, row=i // columns + 1, col=i % columns + 1)
    fig.update_xaxes(showticklabels=False, zeroline=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, zeroline=False, showgrid=False)
    method = {"pca": "PCA", "tsne": "t-SNE", "umap": "UMAP"}[pictures[0].projection]
    fig.update_layout(title=dict(text=f"Layer {pictures[0].layer + 1}, every head: queries (●) and keys (◇), {method}<br>"
                                      f"<span style='font-size:12px'>coloured by {COLOUR_TEXT[colour_by]}; r = "
                                      "distance–dot correlation after the corrections</span>", font=dict(size=15)),
                      height=230 * rows + 90, margin=dict(l=10, r=10, t=90, b=10), plot_bgcolor="rgb(250, 250, 250)")
    return fig


def position_key(layout: TokenLayout, size: int = 180) -> go.Figure:
    """The colour wheel as the patch grid: what colour each patch position gets (row 1 at the top)."""
    gh, gw = layout.grid_size
    wheel = position_colours(layout)[layout.num_prefix_tokens:].reshape(gh, gw, 3)
    fig = go.Figure(go.Image(z=wheel, hovertemplate="row %{y}, column %{x}<extra></extra>", x0=1, y0=1))
    fig.update_layout(title=dict(text="colour = patch position<br>(prefix tokens grey)", font=dict(size=12)),
                      width=size, height=size + 40, margin=dict(l=30, r=5, t=45, b=25),
                      xaxis=dict(title="column", tickvals=[1, gw]), yaxis=dict(title="row", tickvals=[1, gh]))
    return fig


def effect_heatmap(values: np.ndarray, title: str, colour_bar: str, centre: float | None = 0.0,
                   first_layer: int = 1) -> go.Figure:
    """(L, H) effects, layers down (from ``first_layer``) and heads across, both 1-based; diverging RdBu centred on
    ``centre``, or Viridis when ``centre`` is None."""
    L, H = values.shape
    finite = values[np.isfinite(values)]
    heatmap = dict(z=values.astype(np.float32), x=np.arange(1, H + 1), y=np.arange(first_layer, first_layer + L),
                   colorbar=dict(title=dict(text=colour_bar, side="right")),
                   hovertemplate="layer %{y}, head %{x}<br>%{z:.4f}<extra></extra>")
    if centre is not None:
        reach = float(np.abs(finite - centre).max()) if len(finite) else 1.0
        reach = reach if reach > 0 else 1.0
        heatmap |= dict(colorscale=reference_stops("RdBu_r"), zmin=centre - reach, zmax=centre + reach)
    else:
        heatmap |= dict(colorscale=reference_stops("Viridis"))
    fig = go.Figure(go.Heatmap(**heatmap))
    fig.update_layout(title=dict(text=title, font=dict(size=14)),
                      xaxis=dict(title="head", tickmode="linear", tick0=1, dtick=1),
                      yaxis=dict(title="layer", autorange="reversed", tickmode="linear", tick0=first_layer, dtick=1),
                      height=max(320, 26 * L + 120), margin=dict(l=60, r=10, t=50, b=50))
    return fig
