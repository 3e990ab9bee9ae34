"""``analyze --report --format png,svg,pdf``: the report's figures in each asked format, with matplotlib (no browser).

PNG stays the default and is drawn as before (:mod:`vitviz.figures.report`, :func:`vitviz.figures.overlay.panel_png`);
SVG and PDF carry their titles, labels, ticks and colour bars as text. Per image the report adds two multi-panel
figures (:mod:`vitviz.figures.paper_figure`): every head of four layers spread over the depth on one colour scale,
and the run's maps side by side (rollout, gradient rollout, attribution methods), each group on its own scale.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from ..errors import VitvizError
from .paper_figure import MapGroup, MapRow, PaperFigure, heads_groups, paper_figure

FORMATS = ("png", "svg", "pdf")
LAYERS_SHOWN = 4  # rows of the heads figure: layers spread evenly from the first to the last


def parse_formats(text: str) -> tuple[str, ...]:
    """``--format``'s value, e.g. ``"svg,pdf"`` -> ("svg", "pdf"); a sentence for anything else."""
    formats = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    wrong = [f for f in formats if f not in FORMATS]
    if not formats or wrong:
        raise VitvizError(f"--format takes png, svg and pdf separated by commas (e.g. svg,pdf), not {text!r}.")
    return formats


def spread_layers(depth: int, count: int = LAYERS_SHOWN) -> list[int]:
    """``count`` 0-based layers evenly from the first to the last (all of them for shallower models)."""
    return sorted({int(round(x)) for x in np.linspace(0, depth - 1, min(count, depth))})


def panel_file(tiles: list[Image.Image], titles: list[str], title: str, scale, cmap: str, *, value_name: str,
               fmt: str, columns: int, relative: bool) -> bytes:
    """One map panel as the report's PNG (:func:`vitviz.figures.overlay.panel_png`, as before) or as SVG/PDF
    (:func:`vitviz.figures.vector_figures.panel_vector`)."""
    from .overlay import colour_bar, panel_png
    from .vector_figures import panel_vector

    if fmt == "png":
        bar = colour_bar(scale, cmap, value_name + (" / tile's top" if relative else ""), tiles[0].height,
                         relative=relative)
        buf = io.BytesIO()
        panel_png(tiles, titles, title, bar, columns=columns).save(buf, "PNG")
        return buf.getvalue()
    return panel_vector(tiles, titles, title, scale, cmap, value_name=value_name, fmt=fmt, columns=columns,
                        relative=relative)


def heads_figure(image: Image.Image, attention: np.ndarray, layout, name: str, sinks=None) -> PaperFigure:
    """Every head of :func:`spread_layers` (CLS query, or the mean patch query without CLS), one scale for all.

    attention: (L, H, N, N) one image's; sinks: its :class:`vitviz.analyses.tokens.AttentionSinks` or None.
    """
    query = "cls" if layout.has_class_token else "mean"
    layers = spread_layers(attention.shape[0])
    groups = heads_groups(attention, layout, layers, query, sinks=sinks, one_scale=True)
    return paper_figure(image, groups, title=f"{name}: every head, {'CLS' if query == 'cls' else 'mean patch'} query")


def methods_figure(image: Image.Image, arrays: dict[str, np.ndarray], i: int, name: str) -> PaperFigure | None:
    """Image ``i``'s maps side by side: rollout, gradient rollout (models with a head), the attribution methods run
    (``attribution_<method>`` arrays), each group on its own scale (signed relevance methods share one). None when
    the run made only rollout (the rollout panel shows it)."""
    from ..explainers import registered
    from .attribution_figures import method_groups

    known = {m.replace("-", "_"): m for m in registered()}
    attribution = {known[k[len("attribution_"):]]: arrays[k][i] for k in arrays
                   if k.startswith("attribution_") and k[len("attribution_"):] in known}
    groups = [MapGroup("rollout", [MapRow("", arrays["rollout"][i][None], ["attention rollout"])], "rollout mass")]
    if "gradient_rollout" in arrays:
        groups.append(MapGroup("gradient rollout", [MapRow("", arrays["gradient_rollout"][i][None],
                                                           ["gradient rollout"])], "relevance"))
    groups += method_groups(attribution)
    if len(groups) == 1:
        return None
    return paper_figure(image, groups, title=f"{name}: maps side by side", arrange="across", with_input=True)


def distance_file(distance: np.ndarray, receptive_field: np.ndarray | None, fmt: str) -> bytes:
    """ViT paper Fig. 7 right: (L, H) mean attention distance (px) against depth, one dot per head (1-based layers),
    the 3x3-conv receptive field (L,) px as a dashed line; as SVG or PDF with text as text."""
    import matplotlib
    from matplotlib.figure import Figure

    from .colour import lookup_table

    L, H = distance.shape
    colours = lookup_table("Viridis")[np.linspace(0, 255, H).astype(int)] / 255.0
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42, "font.size": 9}):
        fig = Figure(figsize=(6.0, 3.8))
        ax = fig.add_subplot()
        layers = np.arange(1, L + 1)
        for h in range(H):
            ax.scatter(layers + (h - (H - 1) / 2) * min(0.6 / H, 0.08), distance[:, h], s=14, color=colours[h],
                       label=f"head {h + 1}", zorder=3)
        if receptive_field is not None:
            ax.plot(layers, receptive_field, "--", color="grey", label="3x3 conv stack receptive field")
        ax.set_xlabel("network depth (layer)")
        ax.set_ylabel("mean attention distance (pixels)")
        ax.set_xticks(layers)
        ax.set_xlim(0.5, L + 0.5)
        ax.set_ylim(bottom=0)
        ax.set_title("Mean attention distance per head", loc="left")
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    return buf.getvalue()


def tiles_file(image: Image.Image, title: str, fmt: str, bar: tuple | None = None) -> bytes:
    """A tile grid (filter PCA, position-embedding similarity) as SVG or PDF: the grid embedded at its own pixels,
    the title as text; ``bar`` = (ColourScale, colour map name, label) adds a colour bar for what colours mean."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.figure import Figure

    from .colour import lookup_table

    width = 6.0
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42, "font.size": 9}):
        fig = Figure(figsize=(width + (0.9 if bar else 0), width * image.height / image.width + 0.5))
        ax = fig.add_axes((0.02, 0.02, width / fig.get_figwidth() - 0.03, 1 - 0.5 / fig.get_figheight() - 0.02))
        ax.imshow(np.asarray(image.convert("RGB")), interpolation="nearest")
        ax.set_axis_off()
        fig.suptitle(title, x=0.02, ha="left", fontsize=10)
        if bar:
            scale, cmap, label = bar
            cax = fig.add_axes((width / fig.get_figwidth() + 0.01, 0.1, 0.025, 0.75))
            fig.colorbar(ScalarMappable(Normalize(scale.lo, scale.hi), ListedColormap(lookup_table(cmap) / 255.0)),
                         cax=cax, label=label)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    return buf.getvalue()
