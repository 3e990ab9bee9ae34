"""``analyze --report``'s PNGs: per image its rollout and its last layer's heads over the model input, and per run the
mean attention distance, the filters' PCA and the position-embedding similarity (as the app draws them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _panel(image, maps: np.ndarray, titles: list[str], title: str, sinks: np.ndarray):
    """Maps over the image as on screen: robust per-map scale, sinks crossed, titles, colour bar."""
    from .overlay import colour_bar, panel_png, render_maps

    rendered = render_maps(image, maps, sinks=sinks, zoom=2)
    labels = [f"{t} · top {s.hi:.3g}" for t, s in zip(titles, rendered.scales)]
    bar = colour_bar(rendered.scales[0], "Inferno", "value / tile's top", rendered.tiles[0].height, relative=True)
    return panel_png(rendered.tiles, labels, title, bar, columns=min(len(maps), 6))


def write_image_report(arrays: dict[str, np.ndarray], images, names: list[str], layout, path, first: int = 0) -> None:
    """Rollout and last-layer-head PNGs of one batch; ``path(name)`` says where each file goes.

    arrays: the batch's arrays (with attention); images, names: its model-input images and file
    names; first: the run-wide index of its first image (file names count over the run).
    """
    from ..analyses.maps import query_attention_map
    from ..analyses.tokens import attention_sinks

    a = arrays
    for i, (name, im) in enumerate(zip(names, images)):
        stem, n = Path(name).stem, first + i
        sinks = attention_sinks(a["attention"][i], layout)
        maps = [a["rollout"][i]] + ([a["gradient_rollout"][i]] if "gradient_rollout" in a else [])
        titles = ["attention rollout"] + (["gradient rollout"] if "gradient_rollout" in a else [])
        _panel(im, np.stack(maps), titles, f"{name}: rollout (all layers)", sinks.patch_sinks(layout)).save(
            path(f"rollout_{n:03d}_{stem}.png"))
        query = "cls" if layout.has_class_token else "mean"
        heads = np.stack([query_attention_map(a["attention"][i], layout, -1, h, query)
                          for h in range(a["attention"].shape[2])])
        _panel(im, heads, [f"head {h + 1}" for h in range(len(heads))], f"{name}: last layer, {query} query",
               sinks.patch_sinks(layout, [-1])).save(path(f"last_layer_heads_{n:03d}_{stem}.png"))


def write_run_report(arrays: dict[str, np.ndarray], path) -> None:
    """The run-wide PNGs: mean distance, filter PCA, position-embedding similarity."""
    from . import report
    from .colour import DIVERGING, ColourScale, colourise
    from ..analyses.distance import conv_receptive_field
    from ..analyses.filters import minmax_tiles

    a = arrays
    report.distance_plot(a["mean_distance"], conv_receptive_field(len(a["mean_distance"]))).save(path("mean_distance.png"))
    if "filter_pca" in a:
        report.tile_grid(minmax_tiles(a["filter_pca"]), columns=7, scale=4).save(path("filter_pca.png"))
    if "posembed_similarity" in a:
        sim = a["posembed_similarity"]
        gh, gw = sim.shape[:2]
        maps = np.stack([colourise(sim[r, c], ColourScale(-1.0, 1.0), DIVERGING) for r in range(gh) for c in range(gw)])
        report.tile_grid(maps, columns=gw, scale=2, gap=1).save(path("posembed_similarity.png"))

