"""Multi-panel figures for papers: rows of maps over one image (every head of several layers, several methods side
by side) in groups, each group on one colour scale with one colour bar, the scales stated under the figure.

A group is the set of maps a reader is meant to compare colour for colour: every tile in it is drawn with the same
:class:`~vitviz.figures.colour.ColourScale` (0 to the 99th percentile of all its maps, or ± that of |value| for
signed maps, as the pages' "shared across heads"), and its colour bar spans exactly that scale. Tiles are the pages'
own pixels (:func:`vitviz.figures.overlay.render_maps`); titles, labels, ticks and the scale note are text (SVG
``<text>``, PDF TrueType text), written with matplotlib's SVG, PDF and PNG backends, no browser needed.

Layout: ``arrange="down"`` stacks the groups (a layer per row, heads across; a vertical bar right of each group's
rows); ``arrange="across"`` puts them side by side (methods across; a horizontal bar under each group's columns).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ..errors import OptionError
from .colour import ColourScale, lookup_table
from .overlay import RenderedMaps, colour_bar_ticks, render_maps

FORMATS = ("png", "svg", "pdf")
TILE_INCHES = 1.25   # one map's width; six heads across fit a two-column page (7 in) with labels and a bar
PNG_DPI = 200


@dataclass(frozen=True)
class MapRow:
    """One row of maps over the figure's image.

    Attributes:
        label: the row's name at its left ("layer 12", "AttnLRP"); "" for none.
        maps: (k, gh, gw) values, one per tile.
        titles: k tile titles ("head 1"); drawn above a group's first row, and above any row whose titles differ.
        sinks: patch indices (0-based raster) crossed and kept out of the group's limits, or None.
    """

    label: str
    maps: np.ndarray
    titles: list[str]
    sinks: np.ndarray | None = None


@dataclass(frozen=True)
class MapGroup:
    """Rows drawn on one colour scale with one colour bar.

    Attributes:
        name: what the group holds, for the bar and the scale note ("layers 4, 8 and 12").
        rows: its rows (``arrange="across"``: every group has the same number of rows).
        value_name: the bar's label with its unit ("attention weight", "relevance (logit units)").
        signed: signed maps (relevance): the diverging map centred on 0, ± one limit.
        log: colours follow log10 of the values (non-negative maps only).
    """

    name: str
    rows: list[MapRow]
    value_name: str
    signed: bool = False
    log: bool = False


@dataclass
class PaperFigure:
    """A composed figure: ``file(fmt)`` writes it; ``scales[g]`` is group g's one scale (what its bar spans),
    ``rendered[g]`` its tiles, ``figure`` the matplotlib figure (its colour bars are ``bars[g]``)."""

    figure: object
    groups: list[MapGroup]
    scales: list[ColourScale]
    rendered: list[RenderedMaps]
    bars: list = field(default_factory=list)
    title: str = ""

    def file(self, fmt: str) -> bytes:
        """The figure as ``"png"`` (at 200 dpi), ``"svg"`` or ``"pdf"`` bytes, text as text."""
        import matplotlib

        if fmt not in FORMATS:
            raise OptionError(f"format must be one of {FORMATS}, not {fmt!r}")
        buf = io.BytesIO()
        with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}):
            self.figure.savefig(buf, format=fmt, dpi=PNG_DPI,
                                metadata={"Title": self.title} if fmt in ("pdf", "svg") else None)
        return buf.getvalue()

    def scale_note(self) -> str:
        """One sentence per group: what shares its scale, the rule and the limits (also printed under the figure)."""
        return " ".join(_scale_sentence(g, s, _clipped(r)) for g, s, r in zip(self.groups, self.scales, self.rendered))


def _scale_sentence(group: MapGroup, scale: ColourScale, clipped: int = 0) -> str:
    n = sum(len(r.maps) for r in group.rows)
    if scale.log:
        limits = f"{10 ** scale.lo:.3g} to {10 ** scale.hi:.3g}"
    else:
        limits = f"±{scale.hi:.3g}" if scale.signed else f"{scale.lo:.3g} to {scale.hi:.3g}"
    maps = "its map" if n == 1 else f"its {n} maps"
    rule = scale.rule.replace(" of all maps, shared", "" if scale.signed else " of its values") if n == 1 else scale.rule
    beyond = (f"; {clipped} patch{'es' if clipped > 1 else ''} beyond the limit{'s' if scale.signed else ''} "
              "drawn in the end colour and outlined in cyan") if clipped else ""
    return f"{group.name}: one colour scale for {maps}, {limits} ({rule}){beyond}."


def paper_figure(image: Image.Image, groups: list[MapGroup], *, title: str, arrange: str = "down",
                 cmap: str = "Inferno", style: str = "transparent where low", opacity: float = 0.8,
                 smooth: bool = False, query: int | None = None, with_input: bool = False) -> PaperFigure:
    """Compose groups of map rows over ``image`` into one figure (see the module docstring).

    Args:
        image: the model-input image every map is drawn over.
        groups: each group's maps share one colour scale, computed over all of them ("shared across heads";
            ``log`` groups: log10, 1st to 99.9th percentile); signed groups use the diverging map whatever ``cmap``.
        title: the figure's title.
        arrange: ``"down"`` (groups stacked) or ``"across"`` (groups side by side).
        cmap, style, opacity, smooth: as the pages' Display box.
        query: the query patch (0-based raster), outlined and kept out of the limits.
        with_input: ``arrange="across"``: the model input alone as the first column ("model input", no bar).

    Returns:
        The :class:`PaperFigure`.
    """
    from matplotlib.figure import Figure

    if arrange not in ("down", "across"):
        raise OptionError(f"arrange must be 'down' or 'across', not {arrange!r}")
    if not groups or any(not g.rows for g in groups):
        raise OptionError("a paper figure needs at least one group, each with at least one row")
    rendered = [_render_group(image, g, cmap, style, opacity, smooth, query) for g in groups]
    scales = [r.scales[0] for r in rendered]
    geo = _Geometry.of(image, groups, scales, rendered, title, arrange, with_input)

    fig = Figure(figsize=(geo.width, geo.height))
    fig.text(0.08 / geo.width, 1 - 0.12 / geo.height, "\n".join(geo.title_lines), ha="left", va="top", fontsize=11)
    if geo.with_input:
        for ri in range(geo.n_rows):
            ax = geo.axes(fig, geo.input_x, geo.title_band + ri * (geo.tile_h + geo.tile_title) + geo.tile_title,
                          geo.tile_w, geo.tile_h)
            ax.imshow(np.asarray(image.convert("RGB")), interpolation="nearest")
            ax.set_axis_off()
            if ri == 0:
                ax.set_title("model input", fontsize=8, pad=2)
    bars = []
    y, x_group = geo.title_band, geo.left
    for gi, (g, drawn, scale) in enumerate(zip(groups, rendered, scales)):
        group_cols = max(len(r.maps) for r in g.rows)
        y_row = _draw_rows(fig, geo, g, drawn, y if arrange == "down" else geo.title_band, x_group, first=gi == 0)
        bars.append(_colour_bar(fig, geo, g, drawn, scale, y, x_group, group_cols))
        if arrange == "down":
            y = y_row + 0.12
        else:
            x_group += group_cols * (geo.tile_w + geo.gap) + 0.2
    fig.text(0.08 / geo.width, (geo.note_h - 0.06) / geo.height, "\n".join(geo.note_lines), ha="left", va="top",
             fontsize=7, color="#333333")
    return PaperFigure(fig, list(groups), scales, rendered, bars, title)


def _render_group(image: Image.Image, group: MapGroup, cmap: str, style: str, opacity: float, smooth: bool,
                  query: int | None) -> RenderedMaps:
    """Every map of one group's rows over ``image`` on the group's one colour scale."""
    stacked = np.concatenate([np.asarray(r.maps, dtype=np.float64) for r in group.rows])
    sinks = [np.zeros(0, int) if r.sinks is None else np.asarray(r.sinks, int) for r in group.rows for _ in r.maps]
    return render_maps(image, stacked, scale_mode="log" if group.log else "shared across heads", cmap=cmap,
                       style=style, opacity=opacity, smooth=smooth, query=query, sinks=sinks, signed=group.signed)


@dataclass(frozen=True)
class _Geometry:
    """Where everything of a paper figure goes, in inches: every tile TILE_INCHES wide; text bands above the tiles,
    row labels left, colour bars right (``down``) or below (``across``), the scale note at the bottom."""

    arrange: str
    width: float
    height: float
    tile_w: float
    tile_h: float
    title_band: float
    tile_title: float
    gap: float
    left: float
    input_x: float
    with_input: bool
    columns: int
    n_rows: int
    grid_h: float
    note_h: float
    note_lines: list
    title_lines: list

    @classmethod
    def of(cls, image: Image.Image, groups: list[MapGroup], scales: list, rendered: list, title: str, arrange: str,
           with_input: bool) -> "_Geometry":
        w, h = image.size
        tile_w, tile_h = TILE_INCHES, TILE_INCHES * h / w
        title_band, tile_title, label_w, gap = 0.42, 0.2, 0.3, 0.06
        has_labels = any(r.label for g in groups for r in g.rows)
        left = 0.08 + (label_w if has_labels else 0.0)
        with_input = with_input and arrange == "across"
        input_x = left
        if with_input:
            left += tile_w + 0.2
        if arrange == "down":
            columns = max(len(r.maps) for g in groups for r in g.rows)
            n_rows = sum(len(g.rows) for g in groups)
            width = left + columns * (tile_w + gap) + 1.15
            grid_h = n_rows * (tile_h + tile_title) + (len(groups) - 1) * 0.12
            bar_band = 0.0
        else:
            if len({len(g.rows) for g in groups}) != 1:
                raise OptionError("arrange='across' needs the same number of rows in every group")
            columns = sum(max(len(r.maps) for r in g.rows) for g in groups)
            n_rows = len(groups[0].rows)
            width = left + columns * (tile_w + gap) + (len(groups) - 1) * 0.2 + 0.1
            grid_h = n_rows * (tile_h + tile_title)
            bar_band = 0.75
        note_lines = _wrap([_scale_sentence(g, s, _clipped(r)) for g, s, r in zip(groups, scales, rendered)], width)
        note_h = 0.16 * len(note_lines) + 0.1
        title_lines = _wrap([title], width, 0.085)  # 11 pt
        title_band += 0.19 * (len(title_lines) - 1)
        height = title_band + grid_h + bar_band + note_h
        return cls(arrange, width, height, tile_w, tile_h, title_band, tile_title, gap, left, input_x, with_input,
                   columns, n_rows, grid_h, note_h, note_lines, title_lines)

    def axes(self, fig, x: float, y_top: float, ww: float, hh: float):
        """An axes at x inches from the left, its top y_top inches from the top."""
        return fig.add_axes((x / self.width, 1 - (y_top + hh) / self.height, ww / self.width, hh / self.height))


def _draw_rows(fig, geo: _Geometry, group: MapGroup, drawn: RenderedMaps, y_row: float, x_group: float,
               first: bool) -> float:
    """One group's rows of tiles, titled where a row's titles differ from the row above, labelled on the left
    (``across``: only the first group's); returns the y (inches from the top) below its last row."""
    tile = 0
    previous = None
    for row in group.rows:
        x0 = geo.left if geo.arrange == "down" else x_group
        show_titles = list(row.titles) != previous
        previous = list(row.titles)
        for ti, text in enumerate(row.titles):
            ax = geo.axes(fig, x0 + ti * (geo.tile_w + geo.gap), y_row + geo.tile_title, geo.tile_w, geo.tile_h)
            ax.imshow(np.asarray(drawn.tiles[tile].convert("RGB")), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if show_titles:
                ax.set_title(text, fontsize=8, pad=2)
            tile += 1
        if row.label and (geo.arrange == "down" or first):
            fig.text((x0 - 0.06) / geo.width if geo.arrange == "down" else (geo.left - 0.06) / geo.width,
                     1 - (y_row + geo.tile_title + geo.tile_h / 2) / geo.height, row.label, rotation=90, ha="right",
                     va="center", fontsize=9)
        y_row += geo.tile_h + geo.tile_title
    return y_row


def _colour_bar(fig, geo: _Geometry, group: MapGroup, drawn: RenderedMaps, scale: ColourScale, y: float,
                x_group: float, group_cols: int):
    """The group's colour bar with its unit: right of its rows (``down``, top at ``y``) or under its columns
    (``across``, from ``x_group``), ticks thinned on a short bar."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize

    lut = ListedColormap(lookup_table(drawn.cmap) / 255.0)
    mappable = ScalarMappable(Normalize(scale.lo, scale.hi), lut)
    label = group.value_name + (" (log10 scale)" if scale.log else "")
    if geo.arrange == "down":
        block_h = len(group.rows) * (geo.tile_h + geo.tile_title) - geo.tile_title
        cax = geo.axes(fig, geo.left + geo.columns * (geo.tile_w + geo.gap) + 0.08, y + geo.tile_title, 0.12, block_h)
        bar = fig.colorbar(mappable, cax=cax, orientation="vertical")
    else:
        block_w = group_cols * (geo.tile_w + geo.gap) - geo.gap
        cax = geo.axes(fig, x_group + 0.1 * block_w, geo.title_band + geo.grid_h + 0.12, 0.8 * block_w, 0.1)
        bar = fig.colorbar(mappable, cax=cax, orientation="horizontal")
    ticks = colour_bar_ticks(scale)
    if geo.arrange == "across" and group_cols < 3 and len(ticks) > 3:  # a short bar: ends and middle, not crowded
        ticks = [ticks[0], ticks[len(ticks) // 2], ticks[-1]]
    bar.set_ticks([scale.lo + p * (scale.hi - scale.lo) for p, _ in ticks], labels=[t for _, t in ticks])
    bar.ax.tick_params(labelsize=7)
    if geo.arrange == "down":
        bar.set_label(f"{label}\n{group.name}", fontsize=8)
    else:  # under its own columns: wrapped to their width, the group's name only when the tiles do not say it
        named = label if {t for r in group.rows for t in r.titles} == {group.name} else f"{label} · {group.name}"
        bar.set_label("\n".join(_wrap([named], block_w, 0.052)), fontsize=7)
    return bar


def _clipped(rendered: RenderedMaps) -> int:
    return int(sum(len(c) for c in rendered.clipped))


def _wrap(sentences: list[str], width_inches: float, char_inches: float = 0.055) -> list[str]:
    """Text in lines that fit ``width_inches`` (a character about ``char_inches`` wide: 0.055 at 7 pt)."""
    import textwrap

    chars = max(12, int((width_inches - 0.2) / char_inches))
    return [line for s in sentences for line in textwrap.wrap(s, chars)]


def heads_groups(attention: np.ndarray, layout, layers: list[int], query: str | int = "cls",
                 direction: str = "query", *, sinks=None, one_scale: bool = True,
                 value_name: str = "attention weight") -> list[MapGroup]:
    """Every head of ``layers`` as rows (one per layer, heads across) for :func:`paper_figure`.

    Args:
        attention: (L, H, N, N) one image's attention probabilities.
        layout: its token layout.
        layers: 0-based layer indices, one row each (labelled 1-based, "layer 12").
        query, direction: as :func:`vitviz.analyses.maps.layer_maps`.
        sinks: the image's :class:`vitviz.analyses.tokens.AttentionSinks` (each row's layer's sink patches crossed
            and kept out of the limits), or None.
        one_scale: True: all layers in one group (one scale, one bar); False: a group per layer.
    """
    from ..analyses.maps import layer_maps

    heads = attention.shape[1]
    rows = [MapRow(f"layer {l + 1}", layer_maps(attention, layout, l, query, direction),
                   [f"head {h + 1}" for h in range(heads)],
                   None if sinks is None else sinks.patch_sinks(layout, [l])) for l in layers]
    if one_scale:
        names = [str(l + 1) for l in layers]
        name = f"layer {names[0]}" if len(names) == 1 else f"layers {', '.join(names[:-1])} and {names[-1]}"
        return [MapGroup(name, rows, value_name)]
    return [MapGroup(row.label, [row], value_name) for row in rows]
