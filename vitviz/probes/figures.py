"""The probes' figures: accuracy per layer with its cross-validated interval and the chance level; for painted
concepts, the painting picker, the patch probes' accuracy per layer and their probability maps on every image."""
from __future__ import annotations

import plotly.graph_objects as go

LINE = "rgb(31, 119, 180)"
CHANCE = "rgb(120, 120, 120)"


def accuracy_figure(table: list[dict], chance: float, head_layer: int | None = None, title: str = "") -> go.Figure:
    """Out-of-fold accuracy against layer (1-based) with 95 % Wilson intervals as error bars, chance dashed.

    Args:
        table: :attr:`vitviz.probes.ProbeResult.table` rows (``layer``, ``accuracy``, ``low``, ``high``).
        chance: the majority class's share (0..1).
        head_layer: the head's layer, marked; None for no mark.
    """
    layers = [r["layer"] for r in table]
    acc = [100 * r["accuracy"] for r in table]
    fig = go.Figure(go.Scatter(
        x=layers, y=acc, mode="lines+markers", name="probe accuracy (out-of-fold)", line=dict(color=LINE),
        error_y=dict(type="data", symmetric=False, array=[100 * r["high"] - a for r, a in zip(table, acc)],
                     arrayminus=[a - 100 * r["low"] for r, a in zip(table, acc)], color=LINE, thickness=1.2),
        customdata=[[100 * r["low"], 100 * r["high"]] for r in table],
        hovertemplate="layer %{x}<br>accuracy %{y:.1f}%<br>95%% interval %{customdata[0]:.1f}–%{customdata[1]:.1f}%"
                      "<extra></extra>"))
    fig.add_trace(go.Scatter(x=[min(layers) - 0.4, max(layers) + 0.4], y=[100 * chance] * 2, mode="lines",
                             line=dict(color=CHANCE, dash="dash"), name=f"chance (largest class) {100 * chance:.0f}%",
                             hoverinfo="skip"))
    if head_layer is not None:
        row = next(r for r in table if r["layer"] == head_layer)
        fig.add_trace(go.Scatter(x=[head_layer], y=[100 * row["accuracy"]], mode="markers", name="the head's layer",
                                 marker=dict(symbol="star", size=16, color="rgb(214, 39, 40)"), hoverinfo="skip"))
    fig.update_layout(title=title or "What each layer knows: linear-probe accuracy per layer", height=420,
                      margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.18),
                      template="plotly_white")
    fig.update_xaxes(title="layer (1-based)", dtick=1, range=[min(layers) - 0.5, max(layers) + 0.5])
    fig.update_yaxes(title="accuracy (%), 95% Wilson interval", range=[0, 102])
    return fig


# --- painted concepts ----------------------------------------------------------------------------------------------

CONCEPT_FILL, NOT_CONCEPT_FILL = (255, 140, 0), (30, 144, 255)  # orange: concept, blue: not concept
PROBABILITY_CMAP = "Viridis"


def concept_accuracy_figure(table: list[dict], chance: float, layer: int | None = None, title: str = "") -> go.Figure:
    """A patch probe's out-of-fold balanced accuracy against layer (1-based), plain accuracy dotted, their chance
    levels dashed (0.5, and the larger class's share).

    Args:
        table: :attr:`vitviz.probes.concepts.ConceptProbe.table` rows.
        chance: plain accuracy's chance (the larger class's share of painted patches).
        layer: the layer shown in the maps, marked.
    """
    layers = [r["layer"] for r in table]
    balanced = [100 * r["balanced_accuracy"] for r in table]
    fig = go.Figure(go.Scatter(x=layers, y=balanced, mode="lines+markers", line=dict(color=LINE),
                               name="balanced accuracy (out-of-fold)",
                               hovertemplate="layer %{x}<br>balanced accuracy %{y:.1f}%<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=[100 * r["accuracy"] for r in table], mode="lines+markers",
                             line=dict(color="rgb(255, 127, 14)", dash="dot"), marker=dict(size=5),
                             name="accuracy (out-of-fold)", hovertemplate="layer %{x}<br>accuracy %{y:.1f}%<extra></extra>"))
    span = [min(layers) - 0.4, max(layers) + 0.4]
    fig.add_trace(go.Scatter(x=span, y=[50, 50], mode="lines", line=dict(color=CHANCE, dash="dash"),
                             name="chance of balanced accuracy 50%", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=span, y=[100 * chance] * 2, mode="lines", line=dict(color="rgb(255, 187, 120)",
                                                                                   dash="dash"),
                             name=f"chance of accuracy {100 * chance:.0f}% (larger class)", hoverinfo="skip"))
    if layer is not None:
        row = next(r for r in table if r["layer"] == layer)
        fig.add_trace(go.Scatter(x=[layer], y=[100 * row["balanced_accuracy"]], mode="markers", name="layer shown",
                                 marker=dict(symbol="star", size=16, color="rgb(214, 39, 40)"), hoverinfo="skip"))
    fig.update_layout(title=title or "From which layer on is the concept readable: patch-probe accuracy per layer",
                      height=400, margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.2),
                      template="plotly_white")
    fig.update_xaxes(title="layer (1-based)", dtick=1, range=[min(layers) - 0.5, max(layers) + 0.5])
    fig.update_yaxes(title="accuracy over painted patches (%)", range=[0, 102])
    return fig


def painted_image(image, concept, not_concept, grid_size: tuple[int, int], scale: int = 1):
    """The model-input image enlarged ``scale`` times with the painted patches filled: concept orange, not concept
    blue (half transparent, outlined), for the click-to-paint picker.

    Args:
        concept, not_concept: raster patch indices (0-based), iterables.
    """
    from PIL import Image, ImageDraw

    out = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
    gh, gw = grid_size
    ph, pw = out.height / gh, out.width / gw
    layer = Image.new("RGBA", out.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for patches, colour in ((concept, CONCEPT_FILL), (not_concept, NOT_CONCEPT_FILL)):
        for p in patches:
            r, c = divmod(int(p), gw)
            box = [c * pw, r * ph, (c + 1) * pw - 1, (r + 1) * ph - 1]
            draw.rectangle(box, fill=(*colour, 110), outline=(*colour, 255), width=2)
    grid = ImageDraw.Draw(layer)
    for i in range(1, gw):
        grid.line([(i * pw, 0), (i * pw, out.height)], fill=(255, 255, 255, 40))
    for i in range(1, gh):
        grid.line([(0, i * ph), (out.width, i * ph)], fill=(255, 255, 255, 40))
    return Image.alpha_composite(out.convert("RGBA"), layer).convert("RGB")


def concept_maps_figure(images: list, maps, titles: list[str], layout, painted: list | None = None,
                        highlight: int | None = None, title: str = "", columns: int = 4, tile_px: int = 240,
                        opacity: float = 0.75) -> go.Figure:
    """The probe's probability on every image at one layer, one fixed 0-1 scale (Viridis) with its colour bar.

    Args:
        images: the model-input images (all of the model's input size).
        maps: (n, gh, gw) probabilities in [0, 1].
        painted: per image (gh, gw) bool of its concept patches (outlined in white), or None.
        highlight: the image to outline (the current one).
    """
    from ..figures.colour import ColourScale
    from ..figures.core import map_panel
    from ..figures.overlay import Marks, render_overlay

    scale = ColourScale(0.0, 1.0, rule="probability, fixed 0-1")
    painted = painted or [None] * len(images)
    tiles = [render_overlay(im, m, scale, cmap=PROBABILITY_CMAP, style="heatmap", opacity=opacity,
                            marks=Marks(region=r if r is not None and r.any() else None))
             for im, m, r in zip(images, maps, painted)]
    return map_panel(tiles, maps, [scale] * len(tiles), titles, layout, cmap=PROBABILITY_CMAP,
                     value_name="probability (0-1)", columns=columns, tile_px=tile_px, title=title,
                     highlight=highlight)
