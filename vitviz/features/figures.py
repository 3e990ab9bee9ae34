"""Figures of the Features page, on the project's colour rules (:mod:`vitviz.figures.colour`, :mod:`vitviz.figures.overlay`): latent
activations over the patches drawn on the model-input image in Inferno with a colour bar that says what the colours
mean."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from ..figures.colour import ColourScale
from ..figures.core import map_panel
from ..layout import TokenLayout
from ..figures.overlay import Marks, render_maps, render_overlay

VALUE = "activation (SAE units)"


def image_latents_figure(image: Image.Image, maps: np.ndarray, latents: list[int], layout: TokenLayout, *,
                         columns: int = 4, tile_px: int = 220) -> go.Figure:
    """One image's top latents: (n, gh, gw) activation maps of ``latents`` (0-based; titles 0-based too, as the
    tables are) each on its own scale from its minimum (0: a latent is silent on most patches) to its maximum, given
    in its title: a latent fires on a few patches, and a percentile top would clip exactly those."""
    rendered = render_maps(image, maps, scale_mode="full range per map")
    titles = [f"latent {j} · max {m.max():.3g}" for j, m in zip(latents, maps)]
    return map_panel(rendered.tiles, maps, rendered.scales, titles, layout, cmap="Inferno", value_name=VALUE,
                     columns=columns, tile_px=tile_px,
                     title="Top latents of this image (each tile on its own scale: 0 to its maximum)")


def latent_patches_figure(images: list[Image.Image], maps: np.ndarray, patches: list[int], activations: list[float],
                          names: list[str], latent: int, layout: TokenLayout, *, columns: int = 4,
                          tile_px: int = 220) -> go.Figure:
    """One latent across the set: the images where it fires most, each with the latent's map (one scale shared by all
    tiles, 0 to the strongest activation) and its strongest patch outlined in green; (n, gh, gw) ``maps``."""
    scale = ColourScale(0.0, max(float(maps.max()), 1e-12), rule="0 to the strongest activation shown, shared")
    tiles = [render_overlay(im, m, scale, marks=Marks(query=p)) for im, m, p in zip(images, maps, patches)]
    gw = layout.grid_size[1]
    titles = [f"{n} · patch ({p // gw + 1}, {p % gw + 1}) · {a:.3g}" for n, p, a in zip(names, patches, activations)]
    return map_panel(tiles, maps, [scale] * len(tiles), titles, layout, cmap="Inferno", value_name=VALUE,
                     columns=columns, tile_px=tile_px,
                     title=f"Latent {latent}: the images where it fires most, its strongest patch outlined (one shared scale)")


def activation_histogram(values: np.ndarray, latent: int, frequency: float, tokens: int) -> go.Figure:
    """The latent's non-zero activations over the set's patch tokens, with its firing frequency."""
    fig = go.Figure(go.Histogram(x=values, nbinsx=40, marker_color="rgb(120, 28, 109)"))
    fig.update_layout(title=dict(text=f"Latent {latent}: fires on {frequency:.2%} of {tokens} patch tokens; "
                                      "histogram of its non-zero activations", font_size=14),
                      xaxis_title=VALUE, yaxis_title="patch tokens", height=300, margin=dict(l=60, r=20, t=50, b=50),
                      plot_bgcolor="white", paper_bgcolor="white", font_color="black", bargap=0.05)
    return fig


def latent_scores_figure(scores: np.ndarray, target_text: str, n: int = 12) -> go.Figure:
    """The ``n`` latents with the largest |score| (activation × gradient of the target), signed bars: red pushes the
    target up, blue down; latents 0-based."""
    order = np.argsort(-np.abs(scores), kind="stable")[:n]
    order = order[scores[order] != 0]
    colours = ["rgb(178, 24, 43)" if scores[j] > 0 else "rgb(33, 102, 172)" for j in order]
    fig = go.Figure(go.Bar(x=[f"latent {j}" for j in order], y=scores[order], marker_color=colours,
                           hovertemplate="%{x}: %{y:.4g}<extra></extra>"))
    fig.update_layout(title=dict(text=f"Latents that drive {target_text} (red raises it, blue lowers it)", font_size=14),
                      yaxis_title="activation × gradient", height=320, margin=dict(l=70, r=20, t=50, b=60),
                      plot_bgcolor="white", paper_bgcolor="white", font_color="black")
    fig.update_yaxes(zeroline=True, zerolinecolor="black", gridcolor="rgb(230, 230, 230)")
    return fig


def contact_sheet(images: list[Image.Image], maps: np.ndarray, patches: list[int], activations: list[float],
                  names: list[str], latent: int, layout: TokenLayout, *, context: int = 2, zoom: int = 3,
                  columns: int = 4) -> Image.Image:
    """A latent's top patches as crops: each (2·context + 1)² patches around the patch, the latent's map over it on
    one shared Inferno scale (0 to the strongest activation), the patch outlined in green; a colour bar in SAE units.
    ``maps`` (n, gh, gw) the latent over each tile's image; ``patches`` 0-based raster; under each title the patch
    named as on every page ("patch 147 (row 10, col 4)")."""
    from ..figures.overlay import colour_bar, panel_png

    scale = ColourScale(0.0, max(max(activations, default=0.0), 1e-12), rule="0 to the strongest activation, shared")
    (gh, gw), (ph, pw) = layout.grid_size, layout.patch_size
    tiles, titles, notes = [], [], []
    for im, m, p, a, n in zip(images, maps, patches, activations, names):
        full = render_overlay(im, m, scale, marks=Marks(query=p), zoom=zoom)
        r, c = divmod(int(p), gw)
        r0, c0 = min(max(r - context, 0), max(gh - 2 * context - 1, 0)), min(max(c - context, 0), max(gw - 2 * context - 1, 0))
        side = 2 * context + 1
        box = (c0 * pw * zoom, r0 * ph * zoom, (c0 + side) * pw * zoom, (r0 + side) * ph * zoom)
        tiles.append(full.crop(box))
        titles.append(f"{n} · {a:.3g}")
        notes.append(layout.token_name(int(p) + layout.num_prefix_tokens))
    bar = colour_bar(scale, "Inferno", VALUE, tiles[0].height if tiles else 200)
    return panel_png(tiles, titles, f"Latent {latent}: its top patches (patch outlined; one shared scale)", bar,
                     columns=min(columns, max(len(tiles), 1)), font_size=14, notes=notes)


def deletion_figure(curves, target_text: str) -> go.Figure:
    """Concept deletion curves (rows image, order, step, value of :class:`vitviz.features.deletion.Deletion`): the
    mean over images of the target after zeroing the top m latents, and of as many random active ones (each seed a
    thin line, their mean dashed)."""
    fig = go.Figure()
    mean = curves.groupby(["order", "step"]).value.mean().reset_index()
    randoms = sorted(o for o in mean.order.unique() if o.startswith("random_seed_"))
    for o in randoms:
        m = mean[mean.order == o]
        fig.add_trace(go.Scatter(x=m.step, y=m.value, mode="lines", line=dict(color="rgb(170, 170, 170)", width=1),
                                 name="random latents, one seed", showlegend=o == randoms[0]))
    if randoms:
        r = mean[mean.order.isin(randoms)].groupby("step").value.mean()
        fig.add_trace(go.Scatter(x=r.index, y=r.values, mode="lines", name="random latents, mean over seeds",
                                 line=dict(color="rgb(90, 90, 90)", dash="dash", width=2)))
    top = mean[mean.order == "top"]
    fig.add_trace(go.Scatter(x=top.step, y=top.value, mode="lines+markers", name="top latents by score",
                             line=dict(color="rgb(178, 24, 43)", width=3)))
    fig.update_layout(title=dict(text=f"Concept deletion: {target_text}, mean over images", font_size=14),
                      xaxis_title="latents zeroed (at every patch)", yaxis_title="target value", height=340,
                      margin=dict(l=70, r=20, t=50, b=50), plot_bgcolor="white", paper_bgcolor="white",
                      font_color="black", legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(dtick=1, gridcolor="rgb(230, 230, 230)")
    fig.update_yaxes(gridcolor="rgb(230, 230, 230)")
    return fig
