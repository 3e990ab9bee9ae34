"""How maps look, chosen once per page: colour map, colour scale, overlay style, opacity, sinks.

The page asks :func:`display_controls` for the user's choices, then :func:`map_figure` for the
figure and :func:`panel_download` for the matching publication PNG (built only on click).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import streamlit as st
from PIL import Image
from streamlit_image_coordinates import streamlit_image_coordinates

from ui import keys
from ui.numbers import number
from vitviz.figures.colour import SCALE_MODES, SEQUENTIAL
from vitviz.figures.core import map_panel
from vitviz.layout import TokenLayout
from vitviz.figures.overlay import OVERLAY_HELP, OVERLAY_LABELS, OVERLAY_STYLES, RenderedMaps, colour_bar, panel_png, render_maps
from vitviz.figures.report import outline_patch
from vitviz.figures.vector_figures import panel_vector

CLICK_SCALE = 2  # the picker image is drawn at twice the model input, then fitted to the column

TILE_PX = 230
SINGLE_TILE_PX = 400
VALUE_NAME = "attention weight"
PADDING = "padding_patches"  # session: the current image's padding patches (0-based raster), set by ui.state.setup
OUTLINE_HELP = ("Patches above the top of the colour scale are drawn in the top colour; the outline says which. "
                "Off: no outlines (the caption still counts them).")
PADDING_HELP = ("With \"resize whole image (pad)\": the patches that hold only padding (not one pixel of the photo), "
                "hatched in grey and kept out of the colour scale, as sinks are.")


def padding_in_use() -> tuple[int, ...]:
    """The current image's padding patches (0-based raster; empty when it is not padded)."""
    return tuple(st.session_state.get(PADDING, ()))


@dataclass(frozen=True)
class Display:
    cmap: str = "Inferno"
    scale_mode: str = SCALE_MODES[0]
    style: str = OVERLAY_STYLES[0]
    opacity: float = 0.8
    smooth: bool = False
    exclude_sinks: bool = True
    outline_clipped: bool = True
    # The padding patches marked and kept out of the colour scale (0-based raster): empty when the image is not
    # padded or "keep padding out" is off.
    padding: tuple[int, ...] = ()

    def settings(self, rendered: RenderedMaps) -> dict:
        """What the settings JSON records about the picture: display choices and the colour scales used."""
        return {"display": asdict(self), "colour_scales": [s.to_dict() for s in rendered.scales],
                "clipped_patches": [c.tolist() for c in rendered.clipped],
                "patches_setting_no_limit": rendered.excluded.tolist(), "padding_patches": rendered.padding.tolist(),
                "patch_indices": "0-based raster order"}


def display_controls(prefix: str = "") -> Display:
    """The display choices, in an expander (shared keys, so a choice holds across pages)."""
    with st.expander("Display", expanded=False):
        cmap = st.selectbox("Colour map", SEQUENTIAL, key=f"{prefix}cmap")
        scale_mode = st.selectbox("Colour scale", SCALE_MODES, key=f"{prefix}scale_mode",
                                  help="robust: the 99th percentile sets the top colour, so one hot patch cannot "
                                       "flatten the rest; clipped patches are outlined in cyan")
        style = st.selectbox("Overlay", OVERLAY_STYLES, key=f"{prefix}style", format_func=OVERLAY_LABELS.get,
                             help=OVERLAY_HELP)
        opacity = st.slider("Opacity", 0.0, 1.0, 0.8, 0.05, key=f"{prefix}opacity")
        smooth = st.toggle("Smooth (bilinear between patch centres)", False, key=f"{prefix}smooth")
        exclude_sinks = st.toggle("Mark attention sinks, keep them out of the colour scale", True,
                                  key=f"{prefix}exclude_sinks",
                                  help="Tokens that receive a disproportionate share of attention in the layer "
                                       "(robust z-score > 8 and over 10x the uniform share)")
        outline = st.toggle("Outline patches above the top (cyan)", True, key=f"{prefix}outline_clipped",
                            help=OUTLINE_HELP)
        padding = padding_in_use()
        if padding and not st.toggle(f"Mark the {len(padding)} padding patches, keep them out of the colour scale",
                                     True, key=f"{prefix}exclude_padding", help=PADDING_HELP):
            padding = ()
    return Display(cmap, scale_mode, style, opacity, smooth, exclude_sinks, outline, padding)


def display_in_use() -> Display:
    """The display choices as the session last made them on any map page (the Display box's keys, or the browser
    explorer's view in the URL, which uses the same names), for a figure drawn without a box of its own."""
    from ui.persist import saved_view

    saved, state = saved_view(), st.session_state

    def pick(key, allowed, default):
        value = state.get(key, saved.get(key))
        return value if value in allowed else default

    opacity = min(1.0, max(0.0, number(state.get("opacity", saved.get("opacity", 0.8)), 0.8)))
    def flag(key, url_key):
        value = state.get(key, saved.get(url_key, True))
        return str(value).lower() not in ("0", "false")

    return Display(cmap=pick("cmap", SEQUENTIAL, "Inferno"), scale_mode=pick("scale_mode", SCALE_MODES, SCALE_MODES[0]),
                   style=pick("style", OVERLAY_STYLES, OVERLAY_STYLES[0]), opacity=opacity,
                   smooth=bool(state.get("smooth", False)), outline_clipped=flag("outline_clipped", "clip"),
                   padding=padding_in_use() if flag("exclude_padding", "pad") else ())


def render(image: Image.Image, maps: np.ndarray, display: Display, *, masks=None, query=None, sinks=None, region=None,
           zoom: int = 1, signed: bool = False) -> RenderedMaps:
    """(k, gh, gw) maps drawn as the display says (the tiles, their colour scales, what was clipped); ``signed`` maps
    (relevance) on the diverging map centred on 0 with the display's overlay, opacity and smoothing."""
    return render_maps(image, maps, scale_mode=display.scale_mode, cmap=display.cmap, style=display.style,
                       opacity=display.opacity, smooth=display.smooth, masks=masks, query=query, sinks=sinks,
                       region=region, zoom=zoom, signed=signed, padding=np.array(display.padding, dtype=int),
                       outline_clipped=display.outline_clipped)


def map_figure(image: Image.Image, maps: np.ndarray, layout: TokenLayout, display: Display, *, titles: list[str],
               title: str = "", notes: list[str] | None = None, masks=None, query=None, sinks=None, columns: int = 3,
               highlight: int | None = None, value_name: str = VALUE_NAME, tile_px: int | None = None, region=None,
               signed: bool = False):
    """(rendered tiles, plotly figure) for (k, gh, gw) maps drawn as the display says (``signed``: see :func:`render`)."""
    rendered = render(image, maps, display, masks=masks, query=query, sinks=sinks, region=region, signed=signed)
    shown = maps if masks is None else np.where(masks, maps, np.nan)
    labels = [_label(t, s, rendered.shared, n) for t, s, n in
              zip(titles, rendered.scales, notes or [None] * len(titles))]
    fig = map_panel(rendered.tiles, shown, rendered.scales, labels, layout, cmap=rendered.cmap, value_name=value_name,
                    columns=columns, tile_px=tile_px or (TILE_PX if len(maps) > 1 else SINGLE_TILE_PX), title=title,
                    colour_bar=display.style != "DINO mask", highlight=_tile_of_head(titles, highlight))
    return rendered, fig


def _tile_of_head(titles: list[str], head: int | None) -> int | None:
    """The tile showing ``head`` (0-based), if any: tiles may be ordered by a ranking."""
    name = None if head is None else f"head {head + 1}"
    return titles.index(name) if name in titles else None


def tile_label(title: str, scale, shared: bool) -> str:
    """A tile's title with its own scale when the tiles do not share one (a flat map says so)."""
    if shared:
        return title
    if scale.flat:
        return f"{title} · flat"
    return f"{title} · ±{scale.hi:.3g}" if scale.signed else f"{title} · top {10 ** scale.hi if scale.log else scale.hi:.3g}"


def _label(title: str, scale, shared: bool, note: str | None) -> str:
    text = tile_label(title, scale, shared)
    return f"{text}<br><span style='font-size:11px'>{note}</span>" if note else text


class PanelImage:
    """The publication files of one map panel, built when a download button is first clicked: ``image()`` the PNG
    (tiles at ``zoom``x, titles, colour bar, as the screen), ``vector(fmt)`` an SVG or PDF with vector text
    (:func:`vitviz.vector_figures.panel_vector`)."""

    def __init__(self, image: Image.Image, maps: np.ndarray, display: Display, titles: list[str], title: str, *,
                 masks=None, query=None, sinks=None, columns: int = 3, zoom: int = 2, value_name: str = VALUE_NAME,
                 region=None, notes: list[str] | None = None, signed: bool = False):
        self._draw = dict(masks=masks, query=query, sinks=sinks, region=region, signed=signed)
        self._args = (image, maps, display)
        self.titles, self.title, self.columns, self.zoom = titles, title, min(columns, len(maps)), zoom
        self.value_name, self.notes, self.display = value_name, notes, display

    def _rendered(self, zoom: int) -> RenderedMaps:
        return render(*self._args, zoom=zoom, **self._draw)

    def __call__(self) -> Image.Image:
        """The PNG's image (a callable, as :func:`ui.downloads.download_row` takes it)."""
        rendered = self._rendered(self.zoom)
        labels = [tile_label(t, s, rendered.shared) for t, s in zip(self.titles, rendered.scales)]
        bar_title = self.value_name if rendered.shared else f"{self.value_name} / tile's top"
        bar = colour_bar(rendered.scales[0], rendered.cmap, bar_title, rendered.tiles[0].height,
                         relative=not rendered.shared) if self.display.style != "DINO mask" else Image.new("RGB", (1, 1), "white")
        return panel_png(rendered.tiles, labels, self.title, bar, columns=self.columns, notes=self.notes)

    def vector(self, fmt: str) -> bytes:
        """The panel as ``"svg"`` or ``"pdf"``: tiles at the model input's resolution, text as text."""
        rendered = self._rendered(1)
        labels = [tile_label(t, s, rendered.shared) for t, s in zip(self.titles, rendered.scales)]
        return panel_vector(rendered.tiles, labels, self.title, rendered.scales[0], rendered.cmap,
                            value_name=self.value_name, fmt=fmt, columns=self.columns, relative=not rendered.shared,
                            colour_bar=self.display.style != "DINO mask")


def panel_download(image: Image.Image, maps: np.ndarray, display: Display, titles: list[str], title: str,
                   **kwargs) -> PanelImage:
    """The publication files of the same panel (see :class:`PanelImage`; keyword arguments as its)."""
    return PanelImage(image, maps, display, titles, title, **kwargs)


def patch_picker(image: Image.Image, layout: TokenLayout, key: str, shown: int | None = None,
                 scope: str = "app") -> None:
    """The model-input image at column width, one patch outlined; a click selects the patch under it.

    The selection (0-based raster index) is ``st.session_state[keys.PATCH]``, shared by every page that
    picks patches. ``shown``: the patch to outline (default the selection); ``scope``: what a click
    reruns (``"fragment"`` inside a fragment).
    """
    shown = st.session_state.get(keys.PATCH) if shown is None else shown
    click = streamlit_image_coordinates(outline_patch(image, shown, layout.grid_size, CLICK_SCALE), key=key,
                                        image_format="JPEG", jpeg_quality=85, width="stretch")
    last = f"{key}_last"
    if click and click.get("unix_time") != st.session_state.get(last):
        st.session_state[last] = click.get("unix_time")
        st.session_state[keys.PATCH] = layout.patch_at(click["x"], click["y"], click["width"] / image.width)
        st.rerun(scope=scope)
