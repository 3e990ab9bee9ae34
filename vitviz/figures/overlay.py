"""Maps drawn over the model-input image as finished pixels, and whole panels as publication PNGs.

The screen and the downloads use the same pixels: :func:`render_overlay` makes one tile,
:func:`panel_png` lays tiles out with titles and a colour bar, as on screen.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..errors import OptionError
from .colour import ColourScale, colourise, lookup_table

OVERLAY_STYLES = ("transparent where low", "heatmap", "DINO mask")
# What each style draws, as the Overlay choice reads on screen ("transparent where low" over an orange image
# left open whether the colour, the image or both fade). The keys stay the values kept in URLs and settings.
OVERLAY_LABELS = {
    "transparent where low": "opacity follows the value (low values transparent)",
    "heatmap": "solid heatmap (every patch at the Opacity)",
    "DINO mask": "DINO mask (image kept where the mass is, the rest dimmed)",
}
OVERLAY_HELP = ("What is drawn over the image. Opacity follows the value: each patch's colour is the colour bar's "
                "colour for its value, drawn with opacity = Opacity × √(its position on the colour scale), so the "
                "lowest values are fully transparent (the photo shows through) and the top of the scale is drawn "
                "at the Opacity setting. Solid heatmap: every patch at that opacity. DINO mask: no colour; the "
                "patches holding the kept share of mass stay clear, the rest is dimmed. The colour bar always "
                "gives a value's colour at full opacity.")
CLIPPED_COLOUR = (0, 255, 255)     # cyan outline: above the top of the colour scale
SINK_COLOUR = (255, 255, 255)      # white cross: an attention sink (excluded from the scale)
QUERY_COLOUR = (0, 255, 0)         # green outline: the query (or key) patch
PADDING_COLOUR = (210, 210, 210)   # light grey diagonal: a padding patch (no photo in it; excluded from the scale)


@dataclass
class Marks:
    """Patches to mark on a tile, raster indices over the patch grid."""

    query: int | None = None
    clipped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    sinks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    region: np.ndarray | None = None  # (gh, gw) bool, outlined in white: the cells a local attention can reach
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # hatched: padding, no photo


def upsample(grid_map: np.ndarray, size: tuple[int, int], smooth: bool = False) -> np.ndarray:
    """(gh, gw) -> (height, width) values: patch-exact blocks, or bilinear between patch centres."""
    width, height = size
    im = Image.fromarray(np.nan_to_num(np.asarray(grid_map, dtype=np.float32), nan=0.0), mode="F")
    return np.asarray(im.resize((width, height), Image.BILINEAR if smooth else Image.NEAREST), dtype=np.float64)


def render_overlay(image: Image.Image, grid_map: np.ndarray, scale: ColourScale, *, cmap: str = "Inferno",
                   style: str = "transparent where low", opacity: float = 0.8, smooth: bool = False,
                   mask: np.ndarray | None = None, marks: Marks | None = None, zoom: int = 1) -> Image.Image:
    """One map over the image, as RGB pixels.

    Args:
        image: the model-input image (after resize and crop), (W, H).
        grid_map: (gh, gw) values, one per patch.
        scale: the colour scale of this map.
        style: ``"transparent where low"`` (colour alpha = ``opacity`` x sqrt of the value's position on the scale),
            ``"heatmap"`` (the colours at a constant ``opacity``) or ``"DINO mask"`` (the image kept
            inside ``mask``, dimmed by ``opacity`` outside, the mask's contour drawn).
        mask: (gh, gw) bool, e.g. from :func:`vitviz.analyses.maps.threshold_mask`; cells outside it are not coloured.
        marks: patches to outline (query, clipped cells), cross (sinks) or hatch (padding).
        zoom: integer enlargement of the output (for print-size downloads).
    """
    if style not in OVERLAY_STYLES:
        raise OptionError(f"overlay style must be one of {OVERLAY_STYLES}, not {style!r}")
    size = (image.width * zoom, image.height * zoom)
    base = np.asarray(image.convert("RGB").resize(size, Image.BICUBIC) if zoom > 1 else image.convert("RGB"),
                      dtype=np.float64)
    gh, gw = grid_map.shape
    inside = upsample(mask.astype(np.float32), size) > 0.5 if mask is not None else np.ones(base.shape[:2], bool)
    if style == "DINO mask":
        shade = np.where(inside, 1.0, 1.0 - opacity)[..., None]
        out = base * shade
    else:
        values = upsample(grid_map, size, smooth)
        colours = colourise(values, scale, cmap).astype(np.float64)
        # sqrt: mid values stay visible while the lowest fade out completely.
        # sqrt of the distance from the scale's "nothing" end: 0 for magnitudes, the centre for signed maps.
        alpha = opacity * (np.sqrt(scale.strength(values)) if style == "transparent where low" else np.ones_like(values))
        alpha = np.where(inside, alpha, 0.0)[..., None]
        out = base * (1 - alpha) + colours * alpha
    tile = Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8))
    draw = ImageDraw.Draw(tile)
    ph, pw = size[1] / gh, size[0] / gw
    if style == "DINO mask" and mask is not None:
        _draw_contour(draw, mask, ph, pw, width=max(1, zoom))
    marks = marks or Marks()

    def box(p: int) -> list[float]:
        r, c = divmod(int(p), gw)
        return [c * pw, r * ph, (c + 1) * pw - 1, (r + 1) * ph - 1]

    for p in marks.padding:
        x0, y0, x1, y1 = box(p)
        draw.line([x0, y1, x1, y0], fill=PADDING_COLOUR, width=max(1, zoom))
    for p in marks.clipped:
        draw.rectangle(box(p), outline=CLIPPED_COLOUR, width=max(1, zoom))
    for p in marks.sinks:
        x0, y0, x1, y1 = box(p)
        draw.line([x0 + 2, y0 + 2, x1 - 2, y1 - 2], fill=SINK_COLOUR, width=max(1, zoom))
        draw.line([x0 + 2, y1 - 2, x1 - 2, y0 + 2], fill=SINK_COLOUR, width=max(1, zoom))
    if marks.region is not None:
        _draw_contour(draw, marks.region, ph, pw, width=2 * max(1, zoom))
    if marks.query is not None:
        draw.rectangle(box(marks.query), outline=QUERY_COLOUR, width=2 * max(1, zoom))
    return tile


def outline_region(image: Image.Image, region: np.ndarray, width: int = 2) -> Image.Image:
    """A copy of ``image`` with the boundary of a (gh, gw) bool region drawn in white along patch edges."""
    out = image.copy()
    gh, gw = region.shape
    _draw_contour(ImageDraw.Draw(out), region, out.height / gh, out.width / gw, width=width)
    return out


def _draw_contour(draw: ImageDraw.ImageDraw, mask: np.ndarray, ph: float, pw: float, width: int) -> None:
    """The boundary of a (gh, gw) mask along patch edges."""
    padded = np.pad(mask, 1)
    gh, gw = mask.shape
    for r in range(gh):
        for c in range(gw):
            if not mask[r, c]:
                continue
            x0, y0, x1, y1 = c * pw, r * ph, (c + 1) * pw, (r + 1) * ph
            if not padded[r, c + 1]:
                draw.line([x0, y0, x1, y0], fill="white", width=width)
            if not padded[r + 2, c + 1]:
                draw.line([x0, y1, x1, y1], fill="white", width=width)
            if not padded[r + 1, c]:
                draw.line([x0, y0, x0, y1], fill="white", width=width)
            if not padded[r + 1, c + 2]:
                draw.line([x1, y0, x1, y1], fill="white", width=width)


# Fonts with the glyphs the titles use (–, ×, →, ·): Pillow's built-in font draws a box for the first three.
FONT_FILES = ("DejaVuSans.ttf", "LiberationSans-Regular.ttf")


def _font(size: int) -> ImageFont.ImageFont:
    for name in FONT_FILES:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


def colour_bar(scale: ColourScale, cmap: str, title: str, height: int, *, relative: bool = False,
               font_size: int = 16) -> Image.Image:
    """A vertical colour bar with ticks and a title, as pixels (for PNG downloads).

    relative: ticks in shares of each map's own scale top (per-map scales), not in values.
    """
    bar_w, pad = 22, 8
    font = _font(font_size)
    ticks = colour_bar_ticks(scale, relative)
    label_w = max(int(font.getlength(t)) for _, t in ticks) + 12
    out = Image.new("RGB", (pad + bar_w + label_w + font_size + 8, height), "white")
    draw = ImageDraw.Draw(out)
    top, bottom = pad + font_size, height - pad - font_size // 2
    lut = lookup_table(cmap)
    for y in range(top, bottom):
        draw.line([pad, y, pad + bar_w, y], fill=tuple(int(v) for v in lut[round((bottom - 1 - y) / (bottom - 1 - top) * 255)]))
    draw.rectangle([pad, top, pad + bar_w, bottom - 1], outline="black")
    for position, text in ticks:
        y = bottom - 1 - position * (bottom - 1 - top)
        draw.line([pad + bar_w, y, pad + bar_w + 5, y], fill="black")
        draw.text((pad + bar_w + 8, y), text, fill="black", font=font, anchor="lm")
    title_im = Image.new("RGB", (height - 2 * pad, font_size + 6), "white")
    ImageDraw.Draw(title_im).text(((height - 2 * pad) / 2, 0), title, fill="black", font=font, anchor="ma")
    out.paste(title_im.rotate(90, expand=True), (out.width - font_size - 6, pad))
    return out


def colour_bar_ticks(scale: ColourScale, relative: bool = False) -> list[tuple[float, str]]:
    """(position in [0, 1], label) ticks for a colour bar of ``scale``."""
    if relative and scale.signed:  # each tile's own ±limit: -1 .. 1 of it
        return [(p, f"{2 * p - 1:g}" + (" (and above)" if p == 1 else " (and below)" if p == 0 else ""))
                for p in (0, .25, .5, .75, 1)]
    if relative:
        return [(p, f"{p:.2f}".rstrip("0").rstrip(".") + (" (and above)" if p == 1 else "")) for p in (0, .25, .5, .75, 1)]
    if scale.log:
        candidates = [m * 10.0 ** e for e in range(int(np.floor(scale.lo)), int(np.ceil(scale.hi)) + 1) for m in (1, 2, 5)]
        inside = [v for v in candidates if scale.lo - 1e-9 <= np.log10(v) <= scale.hi + 1e-9]
        if len(inside) < 3:
            inside = sorted(set(inside) | {10.0 ** scale.lo, 10.0 ** scale.hi})
        return [((np.log10(v) - scale.lo) / (scale.hi - scale.lo), f"{v:.2g}") for v in inside]
    values = np.linspace(scale.lo, scale.hi, 5)
    return [((v - scale.lo) / ((scale.hi - scale.lo) or 1), f"{v:.3g}") for v in values]


def panel_png(tiles: list[Image.Image], titles: list[str], title: str, bar: Image.Image, *, columns: int,
              gap: int = 10, font_size: int = 18, notes: list[str] | None = None) -> Image.Image:
    """Tiles in a grid with their titles (and a smaller note under each, as on screen), a figure title on top
    and a colour bar on the right."""
    font, title_font, note_font = _font(font_size), _font(font_size + 4), _font(font_size * 3 // 4)
    tw, th = tiles[0].size
    rows = -(-len(tiles) // columns)
    note_h = font_size if notes else 0
    cell_h = th + font_size + 8 + note_h
    head = font_size + 16
    width = columns * (tw + gap) + bar.width + gap
    height = head + rows * (cell_h + gap)
    out = Image.new("RGB", (width, max(height, bar.height + head)), "white")
    draw = ImageDraw.Draw(out)
    draw.text((gap, 4), title, fill="black", font=title_font)
    for i, (tile, text) in enumerate(zip(tiles, titles)):
        r, c = divmod(i, columns)
        x, y = gap + c * (tw + gap), head + r * (cell_h + gap)
        draw.text((x + tw / 2, y), text, fill="black", font=font, anchor="ma")
        if notes:
            draw.text((x + tw / 2, y + font_size + 4), notes[i], fill=(70, 70, 70), font=note_font, anchor="ma")
        out.paste(tile, (x, y + font_size + 6 + note_h))
    out.paste(bar.resize((bar.width, min(bar.height, out.height - head))), (columns * (tw + gap) + gap // 2, head))
    return out


@dataclass
class RenderedMaps:
    """Maps drawn as tiles, with what the colour scale did to them.

    Attributes:
        tiles: k finished images of the model-input size (times ``zoom``).
        scales: k colour scales (the same object repeated when shared).
        clipped: k arrays of patch indices above their scale's top (beyond ± it for signed maps; outlined in cyan
            when ``outlined``).
        excluded: patch indices that set no colour limit (query patch, attention sinks, padding).
        padding: the padding patches among them (hatched).
    """

    tiles: list[Image.Image]
    scales: list[ColourScale]
    clipped: list[np.ndarray]
    excluded: np.ndarray
    cmap: str = "Inferno"  # the colour map the tiles were drawn with (DIVERGING for signed maps, whatever was asked)
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    outlined: bool = True

    @property
    def shared(self) -> bool:
        return all(s == self.scales[0] for s in self.scales)

    def caption(self, excluded_what: str = "query / attention sinks") -> str:
        """One sentence for the page: how the colours were scaled and what was clipped or excluded (``excluded_what``:
        what the excluded patches are)."""
        n = sum(len(c) for c in self.clipped)
        text = f"Colours: {self.scales[0].rule}"
        beyond = "beyond ± the limit drawn in the end colours" if self.scales[0].signed else \
            "above the top drawn in the top colour"
        outline = "outlined in cyan" if self.outlined else "not outlined (Display: outlines off)"
        text += f"; {n} patch{'es' if n != 1 else ''} {beyond}, {outline}" if n else "; nothing clipped"
        others = sorted(set(int(p) for p in self.excluded) - set(int(p) for p in self.padding))
        if others:
            text += f"; patches {others} set no limit ({excluded_what})"
        if len(self.padding):
            text += f"; {len(self.padding)} padding patches (hatched, no photo in them) set no limit"
        flat = sum(s.flat for s in self.scales)
        if flat and not self.scales[0].flat:
            text += f"; {flat} map{'s' if flat != 1 else ''} flat (every value within 0.1% of its mean), drawn at mid-scale"
        return text + "."


def render_maps(image: Image.Image, maps: np.ndarray, *, scale_mode: str = "robust per head", cmap: str = "Inferno",
                style: str = "transparent where low", opacity: float = 0.8, smooth: bool = False,
                masks: np.ndarray | None = None, query: int | None = None,
                sinks: np.ndarray | list[np.ndarray] | None = None, region: np.ndarray | None = None,
                zoom: int = 1, signed: bool = False, padding: np.ndarray | None = None,
                outline_clipped: bool = True) -> RenderedMaps:
    """Colour scales and tiles for maps meant to be compared (every head of a layer, layers side by side).

    maps: (k, gh, gw); masks: (k, gh, gw) bool or None; query: the query (or key) patch, which
    never sets a limit (its self-attention would); sinks: patch indices marked with a cross and
    kept out of the limits, one array for every tile or a list with one array per tile (e.g. the
    sinks of each tile's layer; their union sets no limit); region: (gh, gw) bool, the only cells
    the maps can be non-zero on (a Swin window): only they set limits (the zeros around a window
    would pull a percentile to 0), and its border is drawn; signed: the maps are signed (relevance), drawn on the
    diverging map centred on 0 whatever ``cmap`` says (:func:`vitviz.figures.colour.signed_scales`): one colour rule per
    method on every page; padding: patch indices that hold no photo (:func:`vitviz.sources.preprocess.padding_patches`), hatched
    and kept out of the limits like sinks; outline_clipped: False leaves the cyan outlines of clipped patches off (the
    caption still counts them).
    """
    from .colour import DIVERGING, colour_scale, signed_scales

    k, gh, gw = maps.shape
    excluded = np.zeros(gh * gw, dtype=bool)
    if query is not None:
        excluded[int(query)] = True
    if sinks is None or isinstance(sinks, np.ndarray) or not len(sinks) or np.isscalar(sinks[0]):
        sinks = [np.zeros(0, dtype=int) if sinks is None else np.asarray(sinks, dtype=int)] * k
    sinks = [np.asarray(s, dtype=int) for s in sinks]
    for tile_sinks in sinks:
        excluded[tile_sinks] = True
    padding = np.zeros(0, dtype=int) if padding is None else np.asarray(padding, dtype=int)
    excluded[padding] = True
    outside = np.zeros((gh, gw), dtype=bool) if region is None else ~np.asarray(region, dtype=bool)
    scales = (signed_scales if signed else colour_scale)(maps, scale_mode, exclude=excluded.reshape(gh, gw) | outside)
    cmap = DIVERGING if signed else cmap
    tiles, clipped = [], []
    for i in range(k):
        # A DINO mask draws no colours, so nothing is clipped there.
        above = np.zeros(0, int) if style == "DINO mask" else np.flatnonzero(scales[i].above(maps[i]).ravel() & ~excluded)
        clipped.append(above)
        tiles.append(render_overlay(image, maps[i], scales[i], cmap=cmap, style=style, opacity=opacity,
                                    smooth=smooth, mask=None if masks is None else masks[i],
                                    marks=Marks(query=query, clipped=above if outline_clipped else np.zeros(0, int),
                                                sinks=sinks[i], region=region, padding=padding), zoom=zoom))
    return RenderedMaps(tiles=tiles, scales=scales, clipped=clipped, excluded=np.flatnonzero(excluded), cmap=cmap,
                        padding=padding, outlined=outline_clipped)
