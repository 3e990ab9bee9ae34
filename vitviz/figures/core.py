"""Plotly figure builders: arrays in, ``go.Figure`` out. No Streamlit here.

Images travel to the browser as PNG/JPEG data URIs; maps as their gh x gw values (never
upsampled), so a figure stays small.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from .colour import ColourScale, reference_stops
from ..layout import TokenLayout
from .overlay import colour_bar_ticks


AXES_OFF = dict(visible=False)


def image_data_uri(image: Image.Image, fmt: str = "PNG", quality: int = 90) -> str:
    """The image inline: a few kB to the browser instead of a JSON array of pixels."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _hover_trace(grid_map: np.ndarray, layout: TokenLayout, value_name: str) -> go.Heatmap:
    """An invisible heatmap over the tile: hover names the patch as every page does (its 0-based raster number, row
    and column from 1: :meth:`vitviz.layout.TokenLayout.token_name`) and its value; tests read ``z``."""
    ph, pw = layout.patch_size
    rows, cols = np.indices(grid_map.shape)
    patch = rows * grid_map.shape[1] + cols
    return go.Heatmap(
        z=np.asarray(grid_map, dtype=np.float32), x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=0,
        showscale=False, name=value_name, hoverongaps=False,
        customdata=np.stack([patch, rows + 1, cols + 1], axis=-1),
        hovertemplate="patch %{customdata[0]} (row %{customdata[1]}, col %{customdata[2]})<br>"
                      + value_name + " %{z:.4g}<extra></extra>",
    )


def colour_bar_trace(scale: ColourScale, cmap: str, title: str, *, relative: bool = False) -> go.Scatter:
    """A trace that draws only a colour bar: exactly ``cmap``'s reference stops, ticks for ``scale``.

    relative: the bar spans 0..1 of each tile's own scale top (per-tile scales share one bar).
    """
    lo, hi = (0.0, 1.0) if relative else (scale.lo, scale.hi)
    ticks = colour_bar_ticks(scale, relative)
    return go.Scatter(
        x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
        marker=dict(colorscale=reference_stops(cmap), cmin=lo, cmax=hi, color=[lo], showscale=True,
                    colorbar=dict(title=dict(text=title, side="right"), thickness=14, len=0.9,
                                  tickvals=[lo + p * (hi - lo) for p, _ in ticks], ticktext=[t for _, t in ticks])),
    )


def map_panel(tiles: list[Image.Image], maps: np.ndarray, scales: list[ColourScale], titles: list[str],
              layout: TokenLayout, *, cmap: str, value_name: str, columns: int, tile_px: int = 240,
              title: str = "", colour_bar: bool = True, highlight: int | None = None) -> go.Figure:
    """Finished tiles (see :func:`vitviz.figures.overlay.render_overlay`) in a grid with one colour bar.

    The tiles travel as ONE image on one pair of axes (no subplots): the browser decodes one JPEG
    and Plotly lays out one plot, which keeps a slider move close to the framework's floor.

    tiles: k images of the model-input size; maps: (k, gh, gw) their values (one invisible hover
    heatmap per tile); scales: one per tile, all equal when the tiles share a scale; titles: one
    per tile, drawn above it; colour_bar: False when no colour carries a value (a DINO mask over
    the plain image); highlight: a tile index to outline.
    """
    k = len(tiles)
    columns = min(columns, k)
    rows = -(-k // columns)
    tw, th = tiles[0].size
    lines = max(t.count("<br>") + 1 for t in titles) if any(titles) else 0
    # The title band above each tile, in tile pixels: 16 screen pixels a line also when tiles are drawn smaller.
    band = round((16 * lines + (4 if lines else 0)) * max(1.0, th / tile_px))
    gap = 8
    width, height = columns * (tw + gap) - gap, rows * (th + band + gap) - gap
    canvas = Image.new("RGB", (width, height), "white")
    origins = []
    for i, tile in enumerate(tiles):
        r, c = divmod(i, columns)
        origins.append((c * (tw + gap), r * (th + band + gap) + band))
        canvas.paste(tile, origins[-1])
    fig = go.Figure(go.Image(source=image_data_uri(canvas, "JPEG", quality=85), hoverinfo="skip"))
    for (x0, y0), grid_map, text in zip(origins, maps, titles):
        trace = _hover_trace(grid_map, layout, value_name)
        trace.update(x0=x0 + trace.x0, y0=y0 + trace.y0)
        fig.add_trace(trace)
        if text:
            fig.add_annotation(x=x0 + tw / 2, y=y0 - 2, text=text, showarrow=False, yanchor="bottom",
                               font=dict(size=12, color="black"))
    if highlight is not None:
        x0, y0 = origins[highlight]
        fig.add_shape(type="rect", x0=x0 - 3, x1=x0 + tw + 3, y0=y0 - 3, y1=y0 + th + 3,
                      line=dict(color="#00c853", width=4))
    if colour_bar:
        shared = all(s == scales[0] for s in scales)
        bar_title = value_name if shared else f"{value_name} / tile's top"
        fig.add_trace(colour_bar_trace(scales[0], cmap, bar_title, relative=not shared))
    top = 34 if title else 24  # the toolbar appears in this band on hover, not over a tile title
    scale = tile_px / th
    fig.update_layout(title=dict(text=title, font_size=14, x=0, y=0.995, yanchor="top"),
                      xaxis=dict(visible=False, range=[-4, width + 4]),
                      yaxis=dict(visible=False, range=[height + 2, -2], scaleanchor="x"),
                      height=round(height * scale) + top, margin=dict(l=0, r=0, t=top, b=0),
                      plot_bgcolor="white", paper_bgcolor="white", font_color="black")
    return fig


COLOUR_BAR_PX = 110  # screen px right of a panel's tiles for its colour bar: the gap, the bar, tick labels, title


def panel_width(fig: go.Figure, colour_bar_px: int = COLOUR_BAR_PX) -> int:
    """The screen width (px) at which a :func:`map_panel` figure's tiles fill its plot at the figure's fixed height,
    plus ``colour_bar_px`` when it has a colour bar. Shown wider (a full-width column), the tiles keep their height and
    sit centred while the colour bar stays at the figure's right edge, hundreds of px away."""
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    margin = fig.layout.margin
    plot_h = fig.layout.height - (margin.t or 0) - (margin.b or 0)
    tiles_w = (xr[1] - xr[0]) * plot_h / abs(yr[0] - yr[1])  # equal scale on x and y (scaleanchor)
    bar = any(getattr(t, "marker", None) is not None and t.marker.showscale for t in fig.data)
    return int(np.ceil(tiles_w)) + (colour_bar_px if bar else 0)


def patch_grid_image(image: Image.Image, layout: TokenLayout, show_indices: bool = True) -> go.Figure:
    """The model-input image with the patch grid, each patch labelled with its patch number: the 0-based raster
    index over the patches alone (row by row), the number every page and download uses for a patch (the prefix
    tokens come before the patches in the token sequence: token index = patch number + ``num_prefix_tokens``)."""
    gh, gw = layout.grid_size
    ph, pw = layout.patch_size
    fig = go.Figure(go.Image(source=image_data_uri(image)))
    # One trace of segments split by None, not a shape per line: a 56x56 Swin grid's 114 shapes took seconds.
    xs = [v for r in range(gh + 1) for v in (0, gw * pw, None)] + [v for c in range(gw + 1) for v in (c * pw, c * pw, None)]
    ys = [v for r in range(gh + 1) for v in (r * ph, r * ph, None)] + [v for c in range(gw + 1) for v in (0, gh * ph, None)]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="white", width=1), hoverinfo="skip",
                             showlegend=False))
    if show_indices:
        centres = layout.patch_centres()
        patches = np.arange(layout.num_patches)
        fig.add_trace(go.Scatter(x=centres[:, 1], y=centres[:, 0], mode="text", text=[str(p) for p in patches],
                                 textfont=dict(color="yellow", size=8), hoverinfo="text",
                                 hovertext=[layout.token_name(int(p) + layout.num_prefix_tokens) for p in patches],
                                 showlegend=False))
    # showlegend off on the layout too: an unnamed trace once drew a stray "Aa trace 2" legend beside the image.
    fig.update_layout(showlegend=False, margin=dict(l=0, r=0, t=0, b=0), xaxis=dict(visible=False, range=[0, image.width]),
                      yaxis=dict(visible=False, scaleanchor="x", range=[image.height, 0]))
    return fig


def rgb_image(array: np.ndarray | Image.Image, title: str = "", scale: int = 1) -> go.Figure:
    """An image, or an (h, w, 3) array in [0, 1] or uint8, enlarged ``scale`` times without smoothing."""
    if isinstance(array, Image.Image):
        im = array
    else:
        im = Image.fromarray(array if array.dtype == np.uint8 else np.round(np.clip(array, 0, 1) * 255).astype(np.uint8))
    if scale > 1:
        im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
    fig = go.Figure(go.Image(source=image_data_uri(im)))
    fig.update_layout(title=title, margin=dict(l=0, r=0, t=30 if title else 0, b=0),
                      xaxis=AXES_OFF, yaxis=dict(visible=False, scaleanchor="x"))
    return fig


def distance_scatter(distance: np.ndarray, receptive_field: np.ndarray | None = None,
                     spread: np.ndarray | None = None, uniform: float | None = None,
                     n_images: int = 1) -> go.Figure:
    """ViT paper Fig. 7 right: network depth on x, mean attention distance on y, one dot per head.

    distance: (L, H) pixels; receptive_field: (L,) pixels; spread: (L, H) std over images, drawn
    as error bars; uniform: the distance of uniform attention on this grid (a reference line).
    Every point's customdata is [layer (1-based), head (1-based)], for click handling.
    """
    L, H = distance.shape
    colours = qualitative_colours(H)
    fig = go.Figure()
    for h in range(H):
        layers = np.arange(1, L + 1)
        x = layers + (h - (H - 1) / 2) * min(0.6 / H, 0.08)  # a small offset so heads do not hide each other
        custom = np.stack([layers, np.full(L, h + 1)] + ([spread[:, h]] if spread is not None else []), -1)
        hover = "layer %{customdata[0]}, head %{customdata[1]}<br>%{y:.1f} px"
        if spread is not None:
            hover += f" (± %{{customdata[2]:.1f}} std over {n_images} images)"
        fig.add_trace(go.Scatter(
            x=x, y=distance[:, h], mode="markers", name=f"head {h + 1}", customdata=custom,
            marker=dict(color=colours[h], size=10, line=dict(color="white", width=0.5)),
            error_y=dict(type="data", array=spread[:, h], thickness=1, width=2, color=colours[h])
            if spread is not None else None,
            hovertemplate=hover + "<extra></extra>"))
    if uniform is not None:
        fig.add_trace(go.Scatter(x=[0.5, L + 0.5], y=[uniform, uniform], mode="lines", hoverinfo="skip",
                                 name=f"uniform attention on this grid ({uniform:.0f} px)",
                                 line=dict(color="black", dash="dot", width=1.5)))
    if receptive_field is not None:
        fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=receptive_field, mode="lines", hoverinfo="skip",
                                 name="3x3 conv stack receptive field", line=dict(color="grey", dash="dash")))
    fig.update_layout(xaxis=dict(title="network depth (layer)", tickmode="linear", dtick=1, range=[0.5, L + 0.5]),
                      yaxis=dict(title="mean attention distance (pixels)", rangemode="tozero"),
                      legend=dict(title="head", orientation="v"), height=460,
                      margin=dict(l=70, r=10, t=10, b=50), plot_bgcolor="white", paper_bgcolor="white",
                      font_color="black", clickmode="event+select")
    fig.update_xaxes(showgrid=False, linecolor="black", ticks="outside")
    fig.update_yaxes(gridcolor="#e5e5e5", linecolor="black", ticks="outside")
    return fig


def qualitative_colours(n: int) -> list[str]:
    """n distinguishable colours for categories (heads): Plotly's D3 / Alphabet palettes."""
    from plotly.colors import qualitative

    palette = qualitative.D3 if n <= 10 else qualitative.Alphabet
    return [palette[i % len(palette)] for i in range(n)]


def layer_head_heatmap(values: np.ndarray, title: str, colorbar: str) -> go.Figure:
    """(L, H) values, layers down, heads across (1-based labels)."""
    L, H = values.shape
    fig = go.Figure(go.Heatmap(z=values.astype(np.float32), x=np.arange(1, H + 1), y=np.arange(1, L + 1),
                               colorscale=reference_stops("Viridis"), colorbar=dict(title=colorbar),
                               hovertemplate="layer %{y}, head %{x}<br>%{z:.2f}<extra></extra>"))
    # Every layer and head labelled (Plotly's automatic ticks label only every other layer of 12).
    fig.update_layout(title=title, xaxis=dict(title="head", tickmode="linear", tick0=1, dtick=1),
                      yaxis=dict(title="layer", autorange="reversed", tickmode="linear", tick0=1, dtick=1),
                      margin=dict(l=60, r=10, t=30, b=50))
    return fig


def bars(values: np.ndarray, title: str, x_title: str, y_title: str, labels=None) -> go.Figure:
    x = labels if labels is not None else np.arange(1, len(values) + 1)
    fig = go.Figure(go.Bar(x=x, y=values))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, margin=dict(l=60, r=10, t=30, b=50))
    if labels is None:  # whole first and last bars, not half of each
        fig.update_xaxes(range=[0.4, len(values) + 0.6])
    return fig


def clickable_cells(fig: go.Figure, shape: tuple[int, int], hover, size: int,
                    selected: tuple[int, int] | None = None, marks: np.ndarray | None = None) -> None:
    """Give a heatmap of R x C cells on 1-based axes one transparent square marker per cell, which carries the hover
    and the clicks (Plotly heatmaps send no clicks to Streamlit): its ``customdata`` is [row, column], 0-based.

    Args:
        shape: (R, C).
        hover: (R, C) or R * C texts, row by row.
        size: the markers' side in pixels (about a cell's).
        selected: (row, column), 0-based: outlined in green.
        marks: (R, C) a short white text drawn on each cell (``""``: none), e.g. ▲ where a value is clipped.
    """
    rows, cols = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    text = {} if marks is None else {"text": np.asarray(marks).ravel(), "textfont": dict(color="white", size=11)}
    fig.add_trace(go.Scatter(
        x=cols.ravel() + 1, y=rows.ravel() + 1, mode="markers" if marks is None else "markers+text", showlegend=False,
        hovertext=np.asarray(hover, dtype=object).ravel(), hoverinfo="text",
        marker=dict(size=size, color="rgba(0, 0, 0, 0)", symbol="square"),
        customdata=np.stack([rows.ravel(), cols.ravel()], 1), **text))
    if selected is not None:
        r, c = selected
        fig.add_shape(type="rect", x0=c + 0.5, x1=c + 1.5, y0=r + 0.5, y1=r + 1.5,
                      line=dict(color="rgb(0, 200, 83)", width=3))


def similarity_grid(similarity: np.ndarray, selected: tuple[int, int] | None = None, *, height: int = 660,
                    image_px: int = 1400) -> go.Figure:
    """ViT paper Fig. 7 centre: every position's cosine-similarity map as a small tile, with gaps.

    similarity: (gh, gw, gh, gw); tile [r, c] is position (r, c)'s map. The tiles are one image
    coloured here with RdBu_r on a fixed -1..1 scale (no front-end theme can change a stop), under a
    colour bar, 1-based row/column labels and one invisible marker per tile centre whose
    ``customdata`` is [row, col] 0-based (then 1-based row, col and the hovered value), so a click
    on a tile can select it (``on_select``). ``selected`` (0-based) is outlined; hovering a tile
    tells its cosine similarity with the selected position.

    Args:
        height: figure height in pixels; the grid is square inside it.
        image_px: about how many pixels wide the tile image is drawn (the toolbar PNG scales it).
    """
    from .colour import DIVERGING, lookup_table, reference_stops

    gh, gw = similarity.shape[:2]
    cell = max(1, round(image_px / (gw * gw)))
    th, tw = gh * cell, gw * cell
    gap = max(2, round(0.12 * tw))
    idx = np.round((np.clip(similarity, -1, 1) + 1) * 127.5).astype(np.intp)
    tiles = lookup_table(DIVERGING)[idx].repeat(cell, axis=2).repeat(cell, axis=3)  # (gh, gw, th, tw, 3)
    tiles = np.pad(tiles, ((0, 0), (0, 0), (0, gap), (0, gap), (0, 0)), constant_values=255)
    canvas = tiles.transpose(0, 2, 1, 3, 4).reshape(gh * (th + gap), gw * (tw + gap), 3)[:-gap, :-gap]

    sel = selected if selected is not None else (gh // 2, gw // 2)
    rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    values = similarity[sel[0], sel[1]].ravel()
    custom = np.stack([rows.ravel(), cols.ravel(), rows.ravel() + 1, cols.ravel() + 1, values], axis=1)
    yc, xc = rows.ravel() * (th + gap) + th / 2, cols.ravel() * (tw + gap) + tw / 2
    plot_px = height - 70
    fig = go.Figure(go.Image(source=image_data_uri(Image.fromarray(canvas)), hoverinfo="skip"))
    fig.add_trace(go.Scatter(
        x=xc, y=yc, mode="markers", showlegend=False, customdata=custom,
        marker=dict(symbol="square", size=max(6.0, 0.9 * plot_px / gw), opacity=0, color=values,
                    colorscale=reference_stops(DIVERGING), cmin=-1, cmax=1, showscale=True,
                    colorbar=dict(title=dict(text="cosine similarity", side="right"), thickness=16, len=0.85,
                                  tickvals=[-1, -0.5, 0, 0.5, 1])),
        hovertemplate=f"position (row %{{customdata[2]}}, col %{{customdata[3]}})<br>cosine similarity with "
                      f"row {sel[0] + 1}, col {sel[1] + 1}: %{{customdata[4]:.3f}}<br>click to enlarge<extra></extra>",
    ))
    x0, y0 = sel[1] * (tw + gap) - gap / 2, sel[0] * (th + gap) - gap / 2
    fig.add_shape(type="rect", x0=x0, x1=x0 + tw + gap, y0=y0, y1=y0 + th + gap, line=dict(color="black", width=2))
    step = 1 if max(gh, gw) <= 20 else (5 if max(gh, gw) <= 60 else 10)
    ticks = lambda n, pitch, size: dict(  # noqa: E731 - 1-based labels at tile centres: 1, then every step
        tickvals=[i * pitch + size / 2 for i in range(n) if i == 0 or (i + 1) % step == 0],
        ticktext=[str(i + 1) for i in range(n) if i == 0 or (i + 1) % step == 0],
        showgrid=False, zeroline=False, ticks="", tickfont=dict(size=11))
    fig.update_layout(
        xaxis=dict(side="top", title=dict(text="column (1-based)", standoff=4),
                   range=[-gap, canvas.shape[1] + gap], **ticks(gw, tw + gap, tw)),
        yaxis=dict(title=dict(text="row (1-based)", standoff=4), scaleanchor="x", autorange=False,
                   range=[canvas.shape[0] + gap, -gap], **ticks(gh, th + gap, th)),
        height=height, margin=dict(l=55, r=10, t=55, b=10), plot_bgcolor="white", paper_bgcolor="white",
        dragmode=False, hoverlabel=dict(bgcolor="white"),
    )
    return fig


def similarity_map(grid_map: np.ndarray, position: tuple[int, int], *, height: int = 420) -> go.Figure:
    """One position's cosine-similarity map, enlarged: (gh, gw) on a fixed -1..1 RdBu_r scale.

    position: (row, col) 0-based; drawn, titled and hovered 1-based.
    """
    from .colour import DIVERGING, reference_stops

    gh, gw = grid_map.shape
    r, c = position
    fig = go.Figure(go.Heatmap(
        z=grid_map.astype(np.float32), x=np.arange(1, gw + 1), y=np.arange(1, gh + 1), zmin=-1, zmax=1,
        colorscale=reference_stops(DIVERGING),
        colorbar=dict(title=dict(text="cosine similarity", side="right"), thickness=16, tickvals=[-1, -0.5, 0, 0.5, 1]),
        hovertemplate=f"row %{{y}}, col %{{x}}<br>cosine similarity with row {r + 1}, col {c + 1}: "
                      "%{z:.3f}<extra></extra>"))
    fig.add_shape(type="rect", x0=c + 0.5, x1=c + 1.5, y0=r + 0.5, y1=r + 1.5, line=dict(color="black", width=2))
    fig.update_layout(
        title=dict(text=f"position (row {r + 1}, col {c + 1})", x=0.5, xanchor="center"),
        xaxis=dict(title="column (1-based)", constrain="domain", showgrid=False, zeroline=False),
        yaxis=dict(title="row (1-based)", autorange="reversed", scaleanchor="x", constrain="domain",
                   showgrid=False, zeroline=False),
        height=height, margin=dict(l=50, r=10, t=40, b=40), plot_bgcolor="white", paper_bgcolor="white")
    return fig


def tile_grid_figure(tiles: np.ndarray, labels: list[str], title: str, *, columns: int, tile_px: int,
                     gap: int | None = None, font_size: int = 13) -> go.Figure:
    """ViT paper Fig. 7 left on the page: small RGB tiles in a grid, each labelled underneath, a title on top.

    tiles: (k, h, w, 3) floats in [0, 1] or uint8, enlarged to ``tile_px`` high by a whole factor (every weight a
    square block, no smoothing). The tiles are one image drawn at its own size (the figure's ``width`` is set, so the
    browser does not rescale it); the title and labels are the chart's text (sharp on screen, text in the SVG/PDF).
    The label under tile i is at (x, y) of the text trace's point i; ``meta`` records the pixels per weight.
    """
    from .report import tile_grid

    k, h, w, _ = tiles.shape
    factor = max(1, round(tile_px / h))
    th, tw = h * factor, w * factor
    label_px = max(int(0.62 * font_size * max(len(s) for s in labels)) + 6, tw)  # room for the widest label
    gap = max(gap if gap is not None else 8, label_px - tw)
    columns = max(1, min(columns, k))
    rows = -(-k // columns)
    label_h = font_size + 10
    image = tile_grid(tiles, columns, scale=factor, gap=gap)  # tiles only; rows spaced below for the labels
    canvas = Image.new("RGB", (image.width, rows * (th + label_h)), "white")  # the last row's labels inside it
    for r in range(rows):
        canvas.paste(image.crop((0, r * (th + gap), image.width, r * (th + gap) + th)), (0, r * (th + label_h)))
    xs = [(i % columns) * (tw + gap) + tw / 2 for i in range(k)]
    ys = [(i // columns) * (th + label_h) + th + 3 for i in range(k)]
    margin = dict(l=10, r=10, t=16 + 2 * font_size, b=8)
    fig = go.Figure(go.Image(source=image_data_uri(canvas), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="text", text=labels, textposition="bottom center",
                             textfont=dict(size=font_size, color="black"), hoverinfo="text", hovertext=labels,
                             showlegend=False, cliponaxis=False))
    fig.update_layout(
        title=dict(text=title, x=0, xref="paper", xanchor="left", y=1, yref="container", yanchor="top",
                   pad=dict(t=6), font=dict(size=font_size + 3)),
        width=canvas.width + margin["l"] + margin["r"], height=canvas.height + margin["t"] + margin["b"],
        margin=margin, showlegend=False, plot_bgcolor="white", paper_bgcolor="white", dragmode=False,
        xaxis=dict(visible=False, range=[-0.5, canvas.width - 0.5], fixedrange=True),
        yaxis=dict(visible=False, range=[canvas.height - 0.5, -0.5], fixedrange=True),
        meta=dict(pixels_per_weight=factor, tile_px=[th, tw], columns=columns))
    return fig


def whole_pixel_tile(filter_px: int, target_px: int) -> int:
    """A tile size near ``target_px`` that draws each of a ``filter_px``-pixel filter's weights as the same whole
    number of pixels (at least one pixel per weight)."""
    return max(filter_px, target_px // filter_px * filter_px)


def labelled_tile_image(tiles: np.ndarray, labels: list[str], title: str, *, columns: int, tile_px: int = 84,
                        gap: int = 10, font_size: int = 15) -> Image.Image:
    """ViT paper Fig. 7 left: small RGB tiles in a grid, each with its label underneath, a title on top.

    tiles: (k, h, w, 3) floats in [0, 1] or uint8, enlarged to ``tile_px`` without smoothing.
    One Pillow image, so the PNG download is the picture on the screen.
    """
    from PIL import ImageDraw

    tiles = tiles if tiles.dtype == np.uint8 else np.round(np.clip(tiles, 0, 1) * 255).astype(np.uint8)
    k, h, w, _ = tiles.shape
    th, tw = tile_px, round(tile_px * w / h)
    font, title_font = _label_font(font_size), _label_font(font_size + 2)
    cell_w = max(tw, max(int(font.getlength(label)) + 4 for label in labels))  # labels never overlap
    label_h, head = font_size + 8, font_size + 18
    rows = -(-k // columns)
    width = max(columns * (cell_w + gap) + gap, int(title_font.getlength(title)) + 2 * gap)
    out = Image.new("RGB", (width, head + rows * (th + label_h + gap)), "white")
    draw = ImageDraw.Draw(out)
    draw.text((gap, 6), title, fill="black", font=title_font)
    for i, (tile, label) in enumerate(zip(tiles, labels)):
        x, y = gap + (i % columns) * (cell_w + gap) + (cell_w - tw) // 2, head + (i // columns) * (th + label_h + gap)
        out.paste(Image.fromarray(tile).resize((tw, th), Image.NEAREST), (x, y))
        draw.text((x + tw / 2, y + th + 3), label, fill="black", font=font, anchor="mt")
    return out


def _label_font(size: int):
    """DejaVu Sans where installed (it has × and –, Pillow's built-in font does not)."""
    from PIL import ImageFont

    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size=size)
