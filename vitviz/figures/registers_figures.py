"""Figures of the registers view: token norms by layer, outliers on the image, register-neuron maps, and
maps before and after a repair side by side (see :mod:`vitviz.analyses.registers`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from PIL import Image

from .core import map_panel
from .faithfulness_figures import method_label
from ..layout import TokenLayout
from .overlay import render_maps
from ..analyses.registers import EXTRA_TOKEN, OutputChange, Outliers

# rgb() strings: Streamlit's theme swaps some hex colours (DESIGN.md)
PATCH_COLOURS = {"median": "rgb(99, 110, 250)", "99th percentile": "rgb(0, 160, 120)", "max": "rgb(239, 85, 59)"}
PREFIX_COLOURS = {"cls": "rgb(60, 60, 60)", "registers": "rgb(171, 99, 250)", EXTRA_TOKEN: "rgb(255, 161, 90)",
                  "dist": "rgb(120, 120, 120)"}


def _prefix_groups(layout: TokenLayout) -> list[tuple[str, str, list[int]]]:
    """(trace name, colour key, token indices) of the prefix tokens: CLS, distillation, trained registers as
    one group, the test-time register."""
    groups = []
    names = layout.prefix_tokens
    if "cls" in names:
        groups.append(("CLS", "cls", [names.index("cls")]))
    if "dist" in names:
        groups.append(("distillation token", "dist", [names.index("dist")]))
    regs = [i for i, n in enumerate(names) if n.startswith("reg")]
    if regs:
        groups.append((f"registers ({names[regs[0]]}-{names[regs[-1]]})" if len(regs) > 1 else f"register ({names[regs[0]]})",
                       "registers", regs))
    if EXTRA_TOKEN in names:
        groups.append(("test-time register", EXTRA_TOKEN, [names.index(EXTRA_TOKEN)]))
    return groups


def norm_by_layer(outliers: Outliers, title: str = "") -> go.Figure:
    """Token output norm by layer over an image set: the patch tokens' median, 99th percentile and max, the
    threshold of the outlier rule, and each kind of prefix token apart (its max over images and tokens).

    Log y axis: outliers sit tens of times above the median."""
    L = outliers.norms.shape[1]
    x = np.arange(1, L + 1)
    median, p99, top = outliers.percentiles((50, 99, 100))
    fig = go.Figure()
    for name, y in (("median", median), ("99th percentile", p99), ("max", top)):
        fig.add_trace(go.Scatter(x=x, y=y, name=f"patches: {name}", mode="lines+markers",
                                 line=dict(color=PATCH_COLOURS[name], width=2),
                                 hovertemplate=f"layer %{{x}}<br>patch {name}: %{{y:.3g}}<extra></extra>"))
    threshold = outliers.threshold.max(axis=0)
    fig.add_trace(go.Scatter(x=x, y=threshold, name=f"outlier threshold ({outliers.factor:g}x median, highest image)",
                             mode="lines", line=dict(color="rgb(150, 150, 150)", dash="dash"),
                             hovertemplate="layer %{x}<br>threshold: %{y:.3g}<extra></extra>"))
    for name, key, tokens in _prefix_groups(outliers.layout):
        y = outliers.norms[:, :, tokens].max(axis=(0, 2))
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers",
                                 line=dict(color=PREFIX_COLOURS[key], width=1.5, dash="dot"),
                                 marker=dict(symbol="diamond", size=7),
                                 hovertemplate=f"layer %{{x}}<br>{name} (max): %{{y:.3g}}<extra></extra>"))
    emergence = outliers.emergence_layer
    if emergence is not None:
        # The label on the side of the line with room for it: left of an early line it ran over the y ticks.
        fig.add_vline(x=emergence + 1, line=dict(color="rgb(239, 85, 59)", width=1),
                      annotation_text=f"outliers emerge (layer {emergence + 1})",
                      annotation_position="top right" if emergence + 1 <= (L + 1) / 2 else "top left")
    n = outliers.norms.shape[0]
    shown = [t.y for t in fig.data if t.y is not None and len(t.y)]
    values = np.concatenate([np.asarray(y, float) for y in shown])
    values = values[np.isfinite(values) & (values > 0)]
    decades = np.log10(values.max() / values.min()) if values.size else 0.0
    fig.update_layout(
        title=title or f"Token output norm by layer ({n} image{'s' if n != 1 else ''})",
        # A fixed range: autorange padded the markers and the line's label out to layers -1 and 12.
        xaxis=dict(title="layer (1-based)", dtick=1, range=[0.5, L + 0.5]),
        # Ticks at 1, 2, 5 per decade over a short range, at each decade over a long one: plotly's default on a
        # log axis of less than a decade labels every minor tick (2, 3, ... 9) and the labels pile up.
        yaxis=dict(title="L2 norm of the block's output", type="log", dtick="D2" if decades < 2 else 1,
                   tickformat="~g"),
        height=420, margin=dict(l=60, r=20, t=50, b=50), legend=dict(font_size=11), plot_bgcolor="white",
        paper_bgcolor="white", font_color="black")
    fig.update_xaxes(gridcolor="rgb(230, 230, 230)")
    fig.update_yaxes(gridcolor="rgb(230, 230, 230)")
    return fig


def maps_figure(image: Image.Image, maps: np.ndarray, titles: list[str], layout: TokenLayout, title: str, *,
                value_name: str, shared: bool = True, marked: np.ndarray | list | None = None,
                columns: int = 4, tile_px: int = 240, marked_what: str = "attention sinks",
                signed: bool = False, padding: np.ndarray | list | tuple | None = None) -> tuple[go.Figure, str]:
    """Maps over the model-input image in a row, on one colour scale when ``shared`` (maps meant to be
    compared: before and after), with ``marked`` patches crossed (``marked_what``: sinks or outliers; they set no
    colour limit); ``signed`` maps (relevance) on the diverging map centred on 0, the others on Inferno from 0;
    ``padding``: patch indices (0-based raster) that hold no photo (:func:`vitviz.sources.preprocess.padding_patches`),
    hatched and kept out of the colour limits, as on every map page.

    maps: (k, gh, gw). Returns the figure and the caption saying how the colours were scaled."""
    grid = layout.grid_size
    zoom = max(1, round(tile_px / max(image.size)))
    rendered = render_maps(image, maps.reshape(len(maps), *grid), scale_mode="shared across heads" if shared else
                           "robust per head", sinks=marked, zoom=zoom, signed=signed, padding=padding)
    fig = map_panel(rendered.tiles, maps, rendered.scales, titles, layout, cmap=rendered.cmap, value_name=value_name,
                    columns=columns, tile_px=tile_px, title=title)
    return fig, rendered.caption(marked_what)


COSINE = "pooled cosine (before vs after)"
COSINE_GAP = "1 − pooled cosine"
# printf formats of the tables' number columns, for the page (three decimals for AUCs and logits, four for a cosine
# next to its distance from 1 in powers of ten, so a cosine of 0.99998 does not read as "1").
TABLE_FORMATS = {COSINE: "%.4f", COSINE_GAP: "%.1e", "top-1 logit change": "%+.3f", "largest |logit change|": "%.3f",
                 "deletion AUC ↓": "%.3f", "insertion AUC ↑": "%.3f"}


def output_change_table(change: OutputChange, names: list[str]) -> pd.DataFrame:
    """One row per image: the pooled vectors' cosine before vs after and its distance from 1, and for classifiers,
    top-1 agreement and logit changes (formats: :data:`TABLE_FORMATS`)."""
    cosine = np.asarray(change.pooled_cosine, dtype=np.float64)
    table = {"image": names, COSINE: cosine, COSINE_GAP: np.clip(1.0 - cosine, 0.0, None)}
    if change.top1_agrees is not None:
        table |= {"same top-1 class": change.top1_agrees, "top-1 logit change": change.top1_logit_change,
                  "largest |logit change|": change.max_logit_change}
    return pd.DataFrame(table)


def repair_faithfulness_table(rows: list[dict]) -> pd.DataFrame:
    """:meth:`vitviz.runs.registers_run.RepairFaithfulness.table` with words for headers (formats:
    :data:`TABLE_FORMATS`)."""
    rows = [row | {"method": method_label(row["method"])} for row in rows]
    return pd.DataFrame(rows).rename(columns={
        "side": "before / after", "deletion_auc": "deletion AUC ↓", "insertion_auc": "insertion AUC ↑",
        "deletion_vs_random": "deletion vs random maps", "insertion_vs_random": "insertion vs random maps"})


def norm_ratio_figure(before: np.ndarray, layout_before: TokenLayout, after: np.ndarray, layout_after: TokenLayout,
                      repair: str) -> go.Figure:
    """Per layer, the largest patch-token norm over the median patch norm, before and after a repair (one image;
    norms (L, N) and (L, N')), and the test-time register's norm over the median when the repair added it."""
    x = np.arange(1, before.shape[0] + 1)
    fig = go.Figure()
    for name, norms, lay, dash in (("before", before, layout_before, "solid"), (f"after ({repair})", after,
                                                                              layout_after, "dot")):
        patch = norms[:, lay.patch_slice]
        fig.add_trace(go.Scatter(x=x, y=patch.max(-1) / np.median(patch, -1), name=f"max patch / median, {name}",
                                 mode="lines+markers", line=dict(color=PATCH_COLOURS["max"], dash=dash),
                                 hovertemplate=f"layer %{{x}}<br>{name}: %{{y:.3g}}x<extra></extra>"))
    if EXTRA_TOKEN in layout_after.prefix_tokens:
        i = layout_after.prefix_tokens.index(EXTRA_TOKEN)
        y = after[:, i] / np.median(after[:, layout_after.patch_slice], -1)
        fig.add_trace(go.Scatter(x=x, y=y, name="test-time register / median patch", mode="lines+markers",
                                 line=dict(color=PREFIX_COLOURS[EXTRA_TOKEN]),
                                 hovertemplate="layer %{x}<br>register: %{y:.3g}x<extra></extra>"))
    fig.update_layout(title="Token output norms on this image: largest patch over the median, by layer",
                      xaxis=dict(title="layer (1-based)", dtick=1), yaxis=dict(title="× the median patch norm",
                                                                              type="log"),
                      height=320, margin=dict(l=60, r=20, t=50, b=50), legend=dict(font_size=11),
                      plot_bgcolor="white", paper_bgcolor="white", font_color="black")
    fig.update_xaxes(gridcolor="rgb(230, 230, 230)")
    fig.update_yaxes(gridcolor="rgb(230, 230, 230)")
    return fig
