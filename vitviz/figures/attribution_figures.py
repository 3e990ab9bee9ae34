"""Figures of the map methods (:mod:`vitviz.explainers`): signed relevance maps on a diverging scale centred on 0, and the
conservation figure (how much of the target's value reaches the pixels)."""
from __future__ import annotations

import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from PIL import Image

from ..explainers import registered
from ..explainers.base import Map
from .colour import DIVERGING, ROBUST_PERCENTILE, lookup_table, reference_stops
from .core import image_data_uri
from ..words import counted

SEQUENTIAL_MAP = "Inferno"


# Grad-CAM's value: the gradient-weighted sum of a layer's activations, negatives cut to 0 (ReLU(Σ w·A) in the
# paper's notation; the screen says it in words).
GRADCAM_UNIT = "weighted activation (≥ 0)"


def _label(method: str) -> str:
    """The map method's name as the registry (:mod:`vitviz.explainers`) gives it to every reader (``"Grad-CAM"``)."""
    return registered()[method].label


def _signed(method: str) -> bool:
    """The method's colour rule, from its registration (:mod:`vitviz.explainers`): signed maps diverging around 0."""
    return registered()[method].signed


def robust_limit(values: np.ndarray) -> float:
    """The 99th percentile of |values| (one hot patch must not flatten the rest); never 0."""
    limit = float(np.percentile(np.abs(values), ROBUST_PERCENTILE))
    return limit if limit > 0 else float(np.abs(values).max()) or 1.0


BAR_GAP_PX = 90  # right of each map: its colour bar (10 px), tick labels and the bar's title
MARGIN_L, MARGIN_B = 10, 10
TITLE_CHAR_PX = 9  # about the width of a title character: where a title as wide as the figure wraps


def maps_figure(image: Image.Image, results: list[Map], index: int = 0, pixels: bool = True,
                target_text: str = "", with_input: bool = True, wrap: int | None = None,
                plot_height: int = 265, *, cmap: str = SEQUENTIAL_MAP, style: str = "transparent where low",
                opacity: float = 0.8, smooth: bool = False, columns: int = 3,
                padding: np.ndarray | list | tuple = ()) -> go.Figure:
    """The model input and one map per method for image ``index``, each drawn over the model input as the
    attention maps are (:func:`vitviz.figures.overlay.render_maps`, the page's overlay ``style``, ``opacity`` and
    ``smooth``): signed relevance (AttnLRP, CP-LRP, Gradient × Input) on the diverging map centred on 0 with
    symmetric robust limits, LeGrad and Grad-CAM (non-negative) on the sequential ``cmap`` from 0. Each map has
    its own colour bar (the methods' units differ); each tile carries an invisible heatmap of its values
    (hover; ``z`` is the map with row 0 at the bottom, as plotly's heatmaps count).

    Args:
        with_input: False leaves the model input out (a map drawn beside another figure of the same image).
        wrap: break the title's lines at this many characters; default: the figure's width (``layout.width``, px:
            the tiles, and beside each its colour bar, :data:`BAR_GAP_PX`; show it at that width).
        plot_height: pixels of each row of maps, below the title.
        columns: at most this many panels per row (the heads tiles' size at 1440 px with 3); the rows are filled
            evenly (4 panels: 2 x 2).
        padding: patch indices (0-based raster) that hold no photo (:func:`vitviz.sources.preprocess.padding_patches`):
            hatched on the patch maps and kept out of their colour limits, as on every map page (maps at pixel
            resolution draw them as they are; the title says so).
    """
    first = 2 if with_input else 1
    n = len(results) + first - 1
    rows = -(-n // columns)
    cols = -(-n // rows)  # the rows as even as they go: 4 panels are 2 x 2, not 3 + 1 beside two empty slots
    titles = (["model input"] if with_input else []) + [
        _label(r.method) + (" (pixels)" if pixels and r.pixels is not None else "") for r in results]
    W, H = image.size
    # The figure is as wide as its tiles and the gaps that hold the colour bars: in a wider figure each tile sat
    # centred in its column and its bar at the column's edge, ~100 px away at 1440 px. Each colour bar's title runs up
    # beside its bar (side "right"): above the bar, "0–1 (min-max)" ran into the next map.
    vertical = 0.12 / rows
    tile_h = (plot_height * rows - MARGIN_B) * (1 - vertical * (rows - 1)) / rows
    plot_w = cols * tile_h * W / H + (cols - 1) * BAR_GAP_PX
    width = int(np.ceil(plot_w)) + MARGIN_L + BAR_GAP_PX
    wrap = wrap or max(40, width // TITLE_CHAR_PX)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=BAR_GAP_PX / plot_w,
                        vertical_spacing=vertical)
    if with_input:
        fig.add_trace(go.Image(source=image_data_uri(image), hoverinfo="skip"), row=1, col=1)
    notes = []
    for i, r in enumerate(results):
        row, col = divmod(i + first - 1, cols)
        note = _add_map(fig, image, r, index, pixels, row + 1, col + 1, cols, cmap, style, opacity, smooth, padding)
        if note:
            notes.append(note)
    padded = ""
    if len(padding):
        pixel_maps = [_label(r.method) for r in results if pixels and r.pixels is not None]
        padded = (f"{counted(len(padding), 'padding patch', 'padding patches')} (no photo in them) hatched, set no limit"
                  + (f" (not in the pixel maps of {', '.join(pixel_maps)})" if pixel_maps else ""))
    for axis in range(1, rows * cols + 1):
        suffix = axis if axis > 1 else ""
        fig.update_layout({f"xaxis{suffix}": dict(visible=False, range=[0, W], constrain="domain"),
                           f"yaxis{suffix}": dict(visible=False, range=[H, 0], scaleanchor=f"x{suffix}",
                                                  constrain="domain")})
    meaning = ("signed maps: red raises the target, blue lowers it, 0 lets the photo through (limits ±99th "
               "percentile of |value|)" if any(_signed(r.method) for r in results) else "")
    lines = _title_lines(f"Attribution of the {target_text}" if target_text else "Attribution",
                         [meaning, "; ".join(notes), padded], wrap)
    # The title hangs from the top; the plot keeps its height under a longer one (about 22 px a line, and room for
    # the maps' own titles).
    top = max(135, 64 + 22 * len(lines))
    fig.update_layout(title=dict(text="<br>".join(lines), y=1, yref="container", yanchor="top", pad=dict(t=24)),
                      height=plot_height * rows + top, width=width,
                      margin=dict(l=MARGIN_L, r=BAR_GAP_PX, t=top, b=MARGIN_B), template="plotly_white")
    return fig


def _add_map(fig, image: Image.Image, r: Map, index: int, pixels: bool, row: int, col: int, cols: int, cmap: str,
             style: str, opacity: float, smooth: bool, padding) -> str:
    """One method's map of image ``index`` drawn over the model input at (row, col) (1-based), with its own colour
    bar beside it and an invisible heatmap of its values for hover; returns the sentence on what was clipped, or ""."""
    from .overlay import render_maps

    W, H = image.size
    at_pixels = pixels and r.pixels is not None
    grid = r.pixels[index] if at_pixels else r.patches[index]
    signed = _signed(r.method)
    # An outline marks a clipped patch; around single pixels the outlines covered a map in cyan specks (the
    # caption still counts the clipped pixels).
    drawn = render_maps(image, grid[None], cmap=cmap, style=style, opacity=opacity, smooth=smooth, signed=signed,
                        padding=None if at_pixels else padding, outline_clipped=not at_pixels)
    scale, clipped = drawn.scales[0], len(drawn.clipped[0])
    note = (f"{_label(r.method)}: {counted(clipped, 'pixel' if at_pixels else 'patch')} "
            f"{'beyond ±' if signed else 'above '}{scale.hi:.3g} drawn at the end colour") if clipped else ""
    axis = (row - 1) * cols + col
    right = fig.layout[f"xaxis{axis if axis > 1 else ''}"].domain[1]
    bottom, top = fig.layout[f"yaxis{axis if axis > 1 else ''}"].domain
    unit = "relevance" if signed else "0–1 (min-max)" if r.method == "legrad" else GRADCAM_UNIT
    gh, gw = grid.shape
    fig.add_trace(go.Image(source=image_data_uri(drawn.tiles[0]), hoverinfo="skip"), row=row, col=col)
    fig.add_trace(go.Heatmap(
        z=grid[::-1], x0=W / gw / 2, dx=W / gw, y0=H - H / gh / 2, dy=-H / gh, opacity=0,
        zmin=scale.lo, zmax=scale.hi, colorscale=reference_stops(drawn.cmap),
        colorbar=dict(title=dict(text=unit, side="right", font=dict(size=11)), len=0.75 * (top - bottom),
                      y=(top + bottom) / 2, thickness=10, x=right + 0.004, xanchor="left", tickfont=dict(size=10)),
        hovertemplate="row %{y:.0f}, col %{x:.0f}: %{z:.4g}<extra>" + _label(r.method) + "</extra>"),
        row=row, col=col)
    return note


def _title_lines(title: str, notes: list[str], wrap: int | None) -> list[str]:
    """The title's lines, then each non-empty note's in small type (``<sup>``), broken at ``wrap`` characters."""
    lines = []
    for text, small in [(title, False)] + [(t, True) for t in notes if t]:
        # <sup> text is about 0.7 of the title's size: its lines may be longer
        parts = textwrap.wrap(text, int(wrap * 1.4) if small else wrap) if wrap else [text]
        lines += [f"<sup>{part}</sup>" if small else part for part in parts]
    return lines


def conservation_figure(results: list[Map], index: int = 0, target_text: str = "") -> go.Figure:
    """Per relevance method: the target's value beside the relevance the pixels receive (their sum). What
    is missing went to the prefix tokens, the position embedding, biases and (AttnLRP) the softmax."""
    methods = [r for r in results if r.pixels is not None]
    names = [_label(r.method) for r in methods]
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


def attribution_groups(results: list[Map], index: int = 0) -> list:
    """The methods' patch maps of image ``index`` as :func:`method_groups` arranges them."""
    return method_groups({r.method: r.patches[index] for r in results})


def method_groups(maps: dict[str, np.ndarray]) -> list:
    """Attribution maps, method name -> (gh, gw) patch map, as :class:`vitviz.figures.paper_figure.MapGroup` s side by
    side: the signed relevance methods (AttnLRP, CP-LRP, Gradient x Input: the target's value spread over the patches,
    the same unit) in one group on one symmetric scale; each non-negative method (LeGrad, Grad-CAM, units of their
    own) a group of its own on the sequential map from 0."""
    from .paper_figure import MapGroup, MapRow

    signed = [m for m in maps if _signed(m)]
    groups = []
    if signed:
        names = [_label(m) for m in signed]
        groups.append(MapGroup(" and ".join(names) if len(names) <= 2 else ", ".join(names),
                               [MapRow("", np.stack([maps[m] for m in signed]), names)],
                               "relevance (target units)", signed=True))
    for m in maps:
        if not _signed(m):
            unit = "0–1 (min-max)" if m == "legrad" else GRADCAM_UNIT
            groups.append(MapGroup(_label(m), [MapRow("", np.asarray(maps[m])[None], [_label(m)])], unit))
    return groups
