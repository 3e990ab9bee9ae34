"""Map panels as SVG and PDF for papers: titles, tile titles, tick labels and the colour bar as vector text.

The tiles are the same pixels as the screen and the PNG export (:func:`vitviz.figures.overlay.render_maps`: the map
over the model input), embedded as rasters at their own resolution; everything that is text stays text
(SVG ``<text>`` elements, PDF text with the font embedded), so a journal's figure editor can restyle it and
a reader can search it. Drawn with matplotlib's SVG and PDF backends, which need no browser and no network.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from ..errors import OptionError
from .colour import ColourScale, lookup_table
from .overlay import colour_bar_ticks

FORMATS = ("svg", "pdf")
TILE_INCHES = 2.0  # a tile's width in the figure; a two-column journal page is about 7 inches wide


def panel_vector(tiles: list[Image.Image], titles: list[str], title: str, scale: ColourScale, cmap: str, *,
                 value_name: str, fmt: str, columns: int = 3, relative: bool = False,
                 colour_bar: bool = True) -> bytes:
    """One map panel as an SVG or PDF file.

    Args:
        tiles: k finished tiles (the model input with its map), all the same size.
        titles: one per tile, drawn above it; title: the panel's, above all.
        scale: the colour scale of the bar (the tiles' shared one, or the first tile's when ``relative``).
        cmap: the colour map the tiles were drawn with (its exact 256-step lookup table colours the bar).
        value_name: the bar's label (its unit).
        fmt: ``"svg"`` or ``"pdf"``.
        columns: tiles per row.
        relative: the tiles have scales of their own: the bar is in shares of each tile's top (as on screen).
        colour_bar: False when no colour carries a value (a DINO mask over the plain image).

    Returns:
        The file's bytes.
    """
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.figure import Figure

    if fmt not in FORMATS:
        raise OptionError(f"format must be one of {FORMATS}, not {fmt!r}")
    k = len(tiles)
    columns = max(1, min(columns, k))
    rows = -(-k // columns)
    w, h = tiles[0].size
    tile_h = TILE_INCHES * h / w
    # svg.fonttype "none": text as <text> elements; pdf.fonttype 42: TrueType text (searchable, editable), not paths.
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42, "font.size": 9}):
        fig = Figure(figsize=(columns * TILE_INCHES + (1.1 if colour_bar else 0.2), rows * (tile_h + 0.35) + 0.45))
        grid = fig.add_gridspec(rows, columns, left=0.02, right=(columns * TILE_INCHES) / fig.get_figwidth(),
                                top=1 - 0.45 / fig.get_figheight(), bottom=0.02, wspace=0.06, hspace=0.25)
        axes = []
        for i, (tile, text) in enumerate(zip(tiles, titles)):
            ax = fig.add_subplot(grid[i // columns, i % columns])
            ax.imshow(np.asarray(tile.convert("RGB")), interpolation="nearest")
            ax.set_title(text, fontsize=9, pad=3)
            ax.set_axis_off()
            axes.append(ax)
        fig.suptitle(title, fontsize=11, x=0.02, ha="left")
        if colour_bar:
            ticks = colour_bar_ticks(scale, relative)
            bar = fig.colorbar(ScalarMappable(Normalize(0.0, 1.0), ListedColormap(lookup_table(cmap) / 255.0)),
                               ax=axes, fraction=0.05, pad=0.03, aspect=25)
            bar.set_ticks([p for p, _ in ticks], labels=[t for _, t in ticks])
            bar.set_label(value_name if not relative else f"{value_name} / tile's top")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Title": title} if fmt == "pdf" else None)
    return buf.getvalue()
