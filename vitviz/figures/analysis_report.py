"""``analyze --report``'s figures: per image its rollout and its last layer's heads over the model input, and per run
the mean attention distance, the filters' PCA and the position-embedding similarity (as the app draws them), as PNG.

``--format png,svg,pdf`` writes each figure in each format named (SVG and PDF with titles, labels, ticks and colour
bars as text, drawn with matplotlib: no browser) and adds two multi-panel figures per image
(:mod:`vitviz.figures.paper_figure`): every head of four layers spread over the depth on one colour scale
(``heads_layers_*``), and the run's maps side by side (``maps_*``: rollout, gradient rollout, attribution methods),
each group on its own stated scale.
"""
from __future__ import annotations

import io
from pathlib import Path

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
    groups = [MapGroup("attention rollout", [MapRow("", arrays["rollout"][i][None], ["attention rollout"])],
                       "rollout mass")]
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


def _panel(image, maps: np.ndarray, titles: list[str], title: str, sinks: np.ndarray, fmt: str) -> bytes:
    """Maps over the image as on screen: robust per-map scale, sinks crossed, titles, colour bar (in shares of each
    tile's top); PNG at 2x as before, SVG/PDF with the tiles at the model input's resolution and text as text."""
    from .overlay import colour_bar, panel_png, render_maps
    from .vector_figures import panel_vector

    rendered = render_maps(image, maps, sinks=sinks, zoom=2 if fmt == "png" else 1)
    labels = [f"{t} · top {s.hi:.3g}" for t, s in zip(titles, rendered.scales)]
    columns = min(len(maps), 6)
    if fmt != "png":
        return panel_vector(rendered.tiles, labels, title, rendered.scales[0], "Inferno", value_name="value",
                            fmt=fmt, columns=columns, relative=True)
    bar = colour_bar(rendered.scales[0], "Inferno", "value / tile's top", rendered.tiles[0].height, relative=True)
    return _png(panel_png(rendered.tiles, labels, title, bar, columns=columns))


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def write_image_report(arrays: dict[str, np.ndarray], images, names: list[str], layout, path, first: int = 0,
                       formats: tuple[str, ...] = ("png",), paper: bool = False) -> None:
    """Rollout and last-layer-head figures of one batch; ``path(name)`` says where each file goes.

    arrays: the batch's arrays (with attention); images, names: its model-input images and file
    names; first: the run-wide index of its first image (file names count over the run); formats: the files'
    formats (:data:`FORMATS`); paper: also the multi-panel figures (:func:`heads_figure`, :func:`methods_figure`).
    """
    from ..analyses.maps import query_attention_map
    from ..analyses.tokens import attention_sinks

    a = arrays
    for i, (name, im) in enumerate(zip(names, images)):
        stem, n = Path(name).stem, first + i
        sinks = attention_sinks(a["attention"][i], layout)
        maps = [a["rollout"][i]] + ([a["gradient_rollout"][i]] if "gradient_rollout" in a else [])
        titles = ["attention rollout"] + (["gradient rollout"] if "gradient_rollout" in a else [])
        query = "cls" if layout.has_class_token else "mean"
        heads = np.stack([query_attention_map(a["attention"][i], layout, -1, h, query)
                          for h in range(a["attention"].shape[2])])
        figures = [heads_figure(im, a["attention"][i], layout, name, sinks), methods_figure(im, a, i, name)] \
            if paper else []
        for fmt in formats:
            path(f"rollout_{n:03d}_{stem}.{fmt}").write_bytes(
                _panel(im, np.stack(maps), titles, f"{name}: rollout (all layers)", sinks.patch_sinks(layout), fmt))
            path(f"last_layer_heads_{n:03d}_{stem}.{fmt}").write_bytes(
                _panel(im, heads, [f"head {h + 1}" for h in range(len(heads))], f"{name}: last layer, {query} query",
                       sinks.patch_sinks(layout, [-1]), fmt))
            for kind, figure in zip(("heads_layers", "maps"), figures):
                if figure is not None:
                    path(f"{kind}_{n:03d}_{stem}.{fmt}").write_bytes(figure.file(fmt))


def write_run_report(arrays: dict[str, np.ndarray], path, formats: tuple[str, ...] = ("png",)) -> None:
    """The run-wide figures: mean distance, filter PCA, position-embedding similarity, in each of ``formats``."""
    from . import report
    from .colour import DIVERGING, ColourScale, colourise
    from ..analyses.distance import conv_receptive_field
    from ..analyses.filters import minmax_tiles

    a = arrays
    receptive = conv_receptive_field(len(a["mean_distance"]))
    grids = {}
    if "filter_pca" in a:
        grids["filter_pca"] = (report.tile_grid(minmax_tiles(a["filter_pca"]), columns=7, scale=4),
                               f"First {len(a['filter_pca'])} principal components of the patch filters "
                               "(each min-max scaled)", None)
    if "posembed_similarity" in a:
        sim = a["posembed_similarity"]
        gh, gw = sim.shape[:2]
        maps = np.stack([colourise(sim[r, c], ColourScale(-1.0, 1.0), DIVERGING) for r in range(gh) for c in range(gw)])
        grids["posembed_similarity"] = (report.tile_grid(maps, columns=gw, scale=2, gap=1),
                                        "Position-embedding similarity (tile: row, column of the grid, 1-based, "
                                        "row by row)", (ColourScale(-1.0, 1.0), DIVERGING, "cosine similarity"))
    for fmt in formats:
        if fmt == "png":
            path("mean_distance.png").write_bytes(_png(report.distance_plot(a["mean_distance"], receptive)))
        else:
            path(f"mean_distance.{fmt}").write_bytes(distance_file(a["mean_distance"], receptive, fmt))
        for name, (grid, title, bar) in grids.items():
            path(f"{name}.{fmt}").write_bytes(_png(grid) if fmt == "png" else tiles_file(grid, title, fmt, bar))
