"""The Attention heads page's sections: every head of a layer as a grid (drawn by the server or in the browser),
Compare layers, the figure for a paper, the repair's before / after, the attribution map and the heads' names.

Each section takes the page's :class:`ui.state.Context` and draws; what a grid shows is a :class:`HeadsView`
(read from the widgets or from the browser's view) and what is drawn with it a :class:`HeadsPanel`, the same
for the screen and the downloads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui import keys
from ui.attribution import attribution_panel
from ui.charts import file_stem, show_chart
from ui.display import Display, display_controls, map_figure, panel_download, patch_picker, render
from ui.downloads import download_row
from ui.explorer import browser_draws, heads_explorer
from ui.guard import guarded
from ui.numbers import number, whole
from ui.paper import paper_downloads
from ui.persist import saved_view, set_view
from ui.readout import names_grid, set_head_names
from ui.repair import repair_view
from vitviz.analyses.maps import RANKINGS, head_notes, layer_maps, rank_heads, threshold_mask
from vitviz.figures.colour import SCALE_MODES, SEQUENTIAL
from vitviz.figures.overlay import OVERLAY_STYLES
from vitviz.figures.paper_figure import heads_groups, paper_figure
from vitviz.layout import PATCH_NUMBERING
from vitviz.residual import why_not as residual_why_not

DINO_KEEP = 0.6  # the DINO mask style's share of the mass when the keep slider says 0 (no mask)


OPENED_NOTE = "opened_from_distance_note"  # (layer, head) the note below speaks of, while the page shows that head


def open_from_distance() -> None:
    """A head clicked on the distance plot (``keys.OPENED_FROM_DISTANCE``: 1-based layer and head) becomes this run's
    Layer and Compare head, in the URL and in the widgets, and the page says so while it shows that head: a rerun
    (another widget, the browser's view coming in) keeps the note, a move to another layer or head ends it."""
    if opened := st.session_state.pop(keys.OPENED_FROM_DISTANCE, None):
        set_view(layer=opened[0], chead=opened[1])  # the browser-drawn grid reads its layer and Compare head from the URL
        # The server-drawn grid's widgets are set here, in the run that draws them, not on the distance page before
        # switch_page: a value set in a run that switch_page cut short reached the server's widget but not always the
        # browser's (the Layer slider showed 12 over a layer-4 grid; streamlit/streamlit#7338).
        st.session_state[keys.HEADS_LAYER], st.session_state[keys.COMPARE_HEAD] = opened
        st.session_state[OPENED_NOTE] = tuple(int(v) for v in opened)
    note = st.session_state.get(OPENED_NOTE)
    if note is None:
        return
    if _shown_head() != tuple(note):
        del st.session_state[OPENED_NOTE]
        return
    st.success(f"Opened from the distance plot: layer {note[0]}, head {note[1]} (outlined in the grid and "
               "picked below under Compare layers).")


def _shown_head() -> tuple[int | None, int | None]:
    """The layer and Compare head (both 1-based) the page shows: the server-drawn grid's widgets, or the view the
    browser-drawn grid last reported (ui.persist). Each mode has one source: the URL can lag behind the server-drawn
    widgets (a rerun sent before the browser applied the new query string), and the browser-drawn grid has no widgets.
    """
    if browser_draws():
        saved = saved_view()
        return whole(saved.get("layer")), whole(saved.get("chead"))
    return st.session_state.get(keys.HEADS_LAYER), st.session_state.get(keys.COMPARE_HEAD)


def _compare_head() -> int | None:
    """The head picked under Compare layers (0-based; the selectbox counts from 1), to outline in the grid."""
    head = st.session_state.get(keys.COMPARE_HEAD)
    return None if head is None else int(head) - 1


def scores_caption(layout) -> str:
    """The words under a grid for the scores in each tile's note (entropy, focus, distance)."""
    return (f" H: entropy of the patch queries' attention over patches (nats; uniform = ln {layout.num_patches} = "
            f"{np.log(layout.num_patches):.2f}). Focus: 1 − entropy / ln N of the readout's attention (0 uniform, "
            "1 one patch). px: mean attention distance of the head. " + PATCH_NUMBERING)


@dataclass
class HeadsView:
    """What the heads grid shows: layer (0-based), query ("cls", "mean" or a patch), direction, mask, order."""

    layer: int
    query: str | int
    mode: str
    keep: float
    ranking: str
    display: Display

    @property
    def by_patch(self) -> bool:
        return not isinstance(self.query, str)

    @property
    def patch(self) -> int | None:
        """The query or key patch (0-based), or None for the readout's query."""
        return self.query if self.by_patch else None

    @property
    def what(self) -> str:
        if self.by_patch:
            return f"patch {self.query} as {self.mode}"
        return {"cls": "CLS query", "mean": "mean over patch queries"}[self.query]


def _view_int(text, default: int, lo: int, hi: int) -> int:
    """A whole number of the browser's view (URL text), clamped to [lo, hi]; ``default`` when it is not a number."""
    value = number(text)
    return default if value is None else int(min(hi, max(lo, value)))


def _view_padding(ctx, view: dict) -> tuple[int, ...]:
    """The padding patches the explorer's view marks (its Display switch ``pad``, on unless the view says 0)."""
    return tuple(ctx.padding.tolist()) if str(view.get("pad", "1")).lower() not in ("0", "false") else ()


def browser_heads_view(ctx, view: dict, patch: int | None) -> HeadsView | None:
    """The explorer's view (URL keys, as the browser reports them or the URL holds them) in the page's terms; None
    when it reads a patch and none is clicked."""
    layout, L = ctx.result.layout, ctx.result.attention.shape[0]

    def setting(k, default):
        return number(view.get(k), default)
    query, direction = view.get("query", "cls" if layout.has_class_token else "mean"), view.get("dir", "query")
    if query not in ("cls", "mean", "patch") or (query == "cls" and not layout.has_class_token):
        query = "cls" if layout.has_class_token else "mean"
    mode = "key" if direction == "key" else "query"
    if query == "patch" or mode == "key":
        if patch is None:
            return None
        query = patch
    display = Display(cmap=view.get("cmap") if view.get("cmap") in SEQUENTIAL else "Inferno",
                      scale_mode=view.get("scale") if view.get("scale") in SCALE_MODES else SCALE_MODES[0],
                      style=view.get("style") if view.get("style") in OVERLAY_STYLES else OVERLAY_STYLES[0],
                      opacity=min(1.0, max(0.0, setting("opacity", 0.8))), smooth=False,
                      exclude_sinks=str(view.get("sinks", "1")).lower() not in ("0", "false"),
                      outline_clipped=str(view.get("clip", "1")).lower() not in ("0", "false"),
                      padding=_view_padding(ctx, view))
    ranking = view.get("order") if view.get("order") in RANKINGS else "head number"
    layer = int(min(L, max(1, setting("layer", L)))) - 1
    return HeadsView(layer, query, mode, min(1.0, max(0.0, setting("keep", 0.0))), ranking, display)


@dataclass
class HeadsPanel:
    """The grid's maps and everything drawn with them (the same for the screen and the downloads)."""

    maps: np.ndarray  # (H, gh, gw): every head's map, in head number order
    order: list[int]  # the tiles' heads (0-based), in the order chosen
    keep: float  # the DINO mask's share of the mass (0: no mask)
    masks: np.ndarray | None  # (H, gh, gw) bool in tile order, or None
    sinks: np.ndarray | None  # the layer's sink patches (0-based raster), left out of the colour scale; or None
    titles: list[str]  # one per tile
    notes: list[str]  # one per tile: entropy, focus, distance
    title: str

    @property
    def tiles(self) -> np.ndarray:
        """(H, gh, gw): the maps in tile order."""
        return self.maps[self.order]


def heads_panel(ctx, v: HeadsView) -> HeadsPanel:
    """The grid of layer ``v.layer``: every head's map, ordered, masked and titled as ``v`` says."""
    r, layout = ctx.result, ctx.result.layout
    maps = layer_maps(r.attention, layout, v.layer, v.query, v.mode)
    order = list(range(r.attention.shape[1]))
    scores = r.head_scores
    if v.ranking != "head number":
        key = RANKINGS[v.ranking]
        order = list(rank_heads(scores[key][v.layer], descending=key != "entropy"))
    keep = DINO_KEEP if v.display.style == "DINO mask" and v.keep == 0 else v.keep  # the mask style needs a mask
    masks = np.stack([threshold_mask(maps[h], keep) for h in order]) if keep > 0 else None
    sinks = r.sinks.patch_sinks(layout, [v.layer]) if v.display.exclude_sinks else None
    titles = [f"head {h + 1}" for h in order]
    notes = list(head_notes(scores, r.distance)[v.layer, order])
    title = f"Layer {v.layer + 1}, every head, {v.what}" + (f", DINO mask keeping {keep:.0%} of the mass" if keep else "")
    return HeadsPanel(maps, order, keep, masks, sinks, titles, notes, title)


def _columns(ctx) -> int:
    """The grid's columns: 3 for up to 9 heads, else 4."""
    return 3 if ctx.result.attention.shape[1] <= 9 else 4


def heads_downloads(ctx, v: HeadsView, rendered=None) -> None:
    """The grid's PNG and npz downloads; ``rendered`` None: the browser drew the grid, so its colour scales and
    clipped patches are computed as the PNG export has them."""
    r, p = ctx.result, heads_panel(ctx, v)
    stem = file_stem("heads", ctx.image.name, f"layer{v.layer + 1}", str(v.query))
    scores = r.head_scores
    if rendered is None:
        rendered = render(r.model_input, p.tiles, v.display, masks=p.masks, query=v.patch, sinks=p.sinks)
    settings = v.display.settings(rendered)
    settings |= {"image": ctx.image.name, "sha256": ctx.image.sha256, "model": ctx.loaded.card()["spec"],
                 "layer (1-based)": v.layer + 1, "query": v.what, "keep_share": p.keep,
                 "head_order (1-based)": [h + 1 for h in p.order], "maps_axis_0": "heads in head_order"}
    download_row(stem, {"maps": p.tiles, "head_order": np.array(p.order), "entropy": scores["entropy"],
                        "cls_focus": scores["cls_focus"], "distance": r.distance}, settings,
                 panel_download(r.model_input, p.tiles, v.display, p.titles, p.title, masks=p.masks, query=v.patch,
                                sinks=p.sinks, columns=_columns(ctx), notes=p.notes))


def paper_section(ctx, v: HeadsView) -> None:
    """"Figure for a paper": every head of the chosen layers (a row each) with this view's query and display, the
    layers on one colour scale or one per layer (stated under the figure), as PNG, SVG and PDF."""
    r, layout = ctx.result, ctx.result.layout
    L, H = r.attention.shape[:2]
    with st.expander("Figure for a paper (several layers, every head, PNG / SVG / PDF)"):
        c1, c2 = st.columns([2, 1])
        layers = c1.multiselect("Layers (one row each)", list(range(1, L + 1)), default=[v.layer + 1],
                                key="paper_layers")
        one_scale = c2.radio("Colour scale", ["one for all layers", "one per layer"], key="paper_scale",
                             help="One for all: every tile on one scale (0 to the 99th percentile of all the "
                                  "maps), one colour bar: colours compare across layers. One per layer: a bar per "
                                  "row.") == "one for all layers"
        if not layers:
            st.caption("Pick at least one layer.")
            return
        layers = sorted(int(x) - 1 for x in layers)
        style = v.display.style if v.display.style != "DINO mask" else OVERLAY_STYLES[0]
        title = f"{ctx.image.name}: every head, {v.what}"
        stem = file_stem("heads_figure", ctx.image.name, "layers", *[l + 1 for l in layers], str(v.query),
                         "onescale" if one_scale else "perlayer")

        def build():
            groups = heads_groups(r.attention, layout, layers, v.query, v.mode,
                                  sinks=r.sinks if v.display.exclude_sinks else None, one_scale=one_scale)
            return paper_figure(r.model_input, groups, title=title, cmap=v.display.cmap, style=style,
                                opacity=v.display.opacity, smooth=v.display.smooth, query=v.patch)

        st.caption(f"Rows: layer{'s' if len(layers) > 1 else ''} {', '.join(str(l + 1) for l in layers)} (1-based); columns: heads 1–{H} in head "
                   f"order; {'one colour scale and one bar for all rows' if one_scale else 'one colour scale and bar per layer'}"
                   f", stated under the figure. The Display box's colour map, overlay and opacity"
                   + (" (the DINO mask is drawn as its map here)" if v.display.style == "DINO mask" else "") + ".")
        paper_downloads(stem, build)


@dataclass
class ComparePanel:
    """One head's maps in several layers and what is drawn with them (the same for the screen and the downloads)."""

    head: int  # 0-based
    layers: list[int]  # 0-based, one panel each
    what: str  # the query in words
    display: Display
    maps: np.ndarray  # (len(layers), gh, gw)
    titles: list[str]
    title: str
    stem: str  # the downloads' file name stem
    drawn: dict  # ``query`` and ``sinks``, as map_figure and render take them


def compare_panel(ctx, head: int, layers: list[int], v: HeadsView) -> ComparePanel:
    """Head ``head``'s maps (0-based) in ``layers`` (0-based) with ``v``'s query, direction and display."""
    r, layout = ctx.result, ctx.result.layout
    maps = np.stack([layer_maps(r.attention, layout, l, v.query, v.mode)[head] for l in layers])
    sinks = [r.sinks.patch_sinks(layout, [l]) for l in layers] if v.display.exclude_sinks else None
    return ComparePanel(head, layers, v.what, v.display, maps,
                        titles=[f"layer {l + 1}, head {head + 1}" for l in layers],
                        title=f"Head {head + 1} across layers, {v.what}",
                        stem=file_stem("compare", ctx.image.name, f"head{head + 1}", "layers", *[l + 1 for l in layers]),
                        drawn=dict(query=v.patch, sinks=sinks))


def compare_downloads(ctx, c: ComparePanel, rendered=None) -> None:
    """The PNG and npz downloads of Compare layers; ``rendered`` None: drawn by the browser, so the scales and clipped
    patches are computed as the PNG export has them."""
    r = ctx.result
    if rendered is None:
        rendered = render(r.model_input, c.maps, c.display, **c.drawn)
    download_row(c.stem, {"maps": c.maps, "layers_1based": np.array(c.layers) + 1},
                 c.display.settings(rendered) | {"image": ctx.image.name, "sha256": ctx.image.sha256,
                                                 "model": ctx.loaded.card()["spec"], "head (1-based)": c.head + 1,
                                                 "layers (1-based)": [l + 1 for l in c.layers], "query": c.what},
                 panel_download(r.model_input, c.maps, c.display, c.titles, c.title, columns=len(c.layers), **c.drawn))


def compare_section(ctx, v: HeadsView) -> None:
    """Compare layers as the server draws it: one head in 2 to 4 layers side by side, with its downloads."""
    r, layout = ctx.result, ctx.result.layout
    L, H = r.attention.shape[:2]
    st.subheader("Compare layers")
    cc = st.columns([1, 1, 2])
    head = cc[0].selectbox("Head", list(range(1, H + 1)), key=keys.COMPARE_HEAD) - 1
    panels = int(cc[1].number_input("Layers side by side", 2, 4, 2, key="compare_n"))
    cols = st.columns(panels)
    # Keys per panel count: going from 2 to 4 panels spreads the new defaults over the depth (1, 5, 8, 12
    # for 12 layers) instead of keeping the two old sliders' values.
    layers = [col.slider(f"Layer {chr(65 + i)}", 1, L, round(1 + i * (L - 1) / (panels - 1)),
                         key=f"compare_{panels}_{i}") - 1 for i, col in enumerate(cols)]
    c = compare_panel(ctx, head, layers, v)
    rendered, fig = map_figure(r.model_input, c.maps, layout, v.display, titles=c.titles, title=c.title,
                               columns=panels, **c.drawn)
    show_chart(fig, "compare_grid", c.stem, vector=False)
    st.caption(rendered.caption())
    compare_downloads(ctx, c, rendered)


def browser_compare(ctx, view: dict, v: HeadsView) -> None:
    """Compare layers as the browser draws it (head, panel count and the panels' layers from its view): downloads."""
    L, H = ctx.result.attention.shape[:2]
    panels = _view_int(view.get("cn"), 2, 2, 4)
    layers = [_view_int(x, 0, 1, L) - 1 for x in str(view.get("cl", "")).split(",")]
    if len(layers) != panels or -1 in layers:  # no list, or one the link got wrong: spread, as the browser does
        layers = [round(1 + i * (L - 1) / (panels - 1)) - 1 for i in range(panels)]
    compare_downloads(ctx, compare_panel(ctx, _view_int(view.get("chead"), 1, 1, H) - 1, layers, v))


def repair_section(ctx, layer: int, head: int, padding: tuple[int, ...] | None = None) -> None:
    """The repair's before / after (ui/repair.py) of the readout's attention in ``layer`` (0-based): mean over heads
    and ``head`` (the one picked under Compare layers), ``padding`` hatched as the grid's Display says (None: the
    Display box's choice). Called inside the grid's fragment, so a layer move redraws it too."""
    layout = ctx.result.layout
    readout = "cls" if layout.has_class_token else "mean"

    def maps_of(side):
        maps = layer_maps(side.result.attention, side.result.layout, layer, readout)
        return {f"layer {layer + 1}, mean over heads": maps.mean(0), f"layer {layer + 1}, head {head + 1}": maps[head]}

    repair_view(ctx, "heads", maps_of, what=f"{'CLS' if layout.has_class_token else 'Mean patch'} query → patches",
                padding=padding)


def server_grid(ctx) -> None:
    """The server-drawn grid (its controls at the left) and Compare layers."""
    r, layout = ctx.result, ctx.result.layout
    L = r.attention.shape[0]
    controls, grid_col = st.columns([1, 3.3])
    with controls:
        st.session_state.setdefault(keys.HEADS_LAYER, L)  # the default as state: a head opened from the distance plot sets it
        layer = st.slider("Layer", 1, L, key=keys.HEADS_LAYER) - 1
        queries = (["CLS"] if layout.has_class_token else []) + ["mean over patches", "clicked patch"]
        query_label = st.radio("Query", queries, key="query", horizontal=True)
        direction = st.radio("Direction", ["query → keys", "keys → query"], key="direction", horizontal=True,
                             help="keys → query: how much every patch attends to the clicked patch")
        patch_picker(r.model_input, layout, "patch_click", scope="fragment")
        patch = st.session_state.get(keys.PATCH)
        st.caption("Click a patch to use it as the query (or key). Selected: "
                   + (layout.token_name(layout.num_prefix_tokens + patch) if patch is not None else "none"))
        keep = st.slider("DINO mask: keep share of mass", 0.0, 1.0, 0.0, 0.05, key="keep",
                         help="Keep the fewest highest patches that hold this share of each map's attention; 0 = no mask")
        ranking = st.selectbox("Order heads by", ["head number"] + list(RANKINGS), key="ranking")
        display = display_controls()

    by_patch = query_label == "clicked patch" or direction == "keys → query"
    if by_patch and patch is None:
        grid_col.info("Click a patch on the image at the left first.")
        return
    query = patch if by_patch else {"CLS": "cls", "mean over patches": "mean"}[query_label]
    v = HeadsView(layer, query, "key" if direction == "keys → query" else "query", keep, ranking, display)
    p = heads_panel(ctx, v)
    with grid_col:
        rendered, fig = map_figure(r.model_input, p.tiles, layout, display, titles=p.titles, notes=p.notes,
                                   title=p.title, masks=p.masks, query=v.patch, sinks=p.sinks,
                                   columns=_columns(ctx), highlight=_compare_head())
        show_chart(fig, "heads_grid", file_stem("heads", ctx.image.name, f"layer{layer + 1}", str(query)), vector=False)
        st.caption(rendered.caption() + scores_caption(layout))
        heads_downloads(ctx, v, rendered)
        paper_section(ctx, v)
    compare_section(ctx, v)


def browser_grid(ctx, payload, saved: dict, patch: int | None) -> None:
    """What the server adds under the browser-drawn grid: the payload's size and the downloads of the view shown."""
    st.caption(scores_caption(ctx.result.layout).strip() + f" Sent to the browser: {payload.nbytes / 1e6:.2f} MB for "
               f"this image ({'every patch row' if payload.patch_rows else 'CLS and mean rows; a clicked patch’s rows on demand'}).")
    v = browser_heads_view(ctx, saved, patch)
    if v is None:
        return
    st.caption("Downloads of the heads grid:")
    heads_downloads(ctx, v)
    paper_section(ctx, v)
    st.caption("Downloads of Compare layers (the panels shown above):")
    browser_compare(ctx, saved, v)


# Fragments: moving a slider here redraws this view (and the repair's before / after of the layer shown) only, not
# the sidebar and its caches.
@st.fragment
@guarded("the heads grid")
def server_view(ctx) -> None:
    """The server-drawn grid (VITVIZ_DRAW=server): every change is a rerun that draws new tiles."""
    server_grid(ctx)
    repair_section(ctx, st.session_state.get(keys.HEADS_LAYER, ctx.result.attention.shape[0]) - 1, _compare_head() or 0)


@st.fragment
@guarded("the heads grid")
def browser_view(ctx) -> None:
    """The grid drawn in the browser: layer, query, patch and display changes repaint there; the server hears
    of the view afterwards (URL, session, downloads)."""
    L, H = ctx.result.attention.shape[:2]
    payload, _ = heads_explorer(ctx)
    saved, patch = saved_view(), st.session_state.get(keys.PATCH)
    browser_grid(ctx, payload, saved, patch)
    repair_section(ctx, _view_int(saved.get("layer"), L, 1, L) - 1, _view_int(saved.get("chead"), 1, 1, H) - 1,
                   _view_padding(ctx, saved))


def attribution_section(ctx) -> None:
    """An attribution map of the image (ui/attribution.py), computed when the toggle asks for it, as on the
    Attribution page."""
    st.subheader("Which patches made the model decide?")
    st.caption("Attention weights say where each head looks; attribution says which patches moved the model's output "
               "(AttnLRP by default: one forward and one backward, kept for this image, method and target).")
    if st.toggle("Show an attribution map of this image", key="heads_attr_on"):
        panel_col, _ = st.columns(2)
        with panel_col, guarded("the attribution map"):
            attribution_panel(ctx, "heads_attr")


def names_section(ctx) -> None:
    """What each head writes toward, in the classes' own words (ui/readout.py, vitviz.residual): for models with a
    classifier whose residual stream can be read."""
    if not (ctx.lens.has_head and residual_why_not(ctx.lens) is None):
        return
    st.subheader("What does each head write toward?")
    if st.toggle("Name every head by the classes it writes toward (over the image set)", key="heads_names_on",
                 help="Each head's direct contribution to every class's logit (its share of the last block's output, "
                      "read through the frozen final norm and the head), averaged over the sidebar's images and taken "
                      "relative to its mean over the classes. The Readout page splits one logit by head and patch."):
        with guarded("the heads' names"):
            st.dataframe(names_grid(set_head_names(ctx)), width="stretch")
            st.caption("Rows are layers, columns heads (both 1-based); each cell: the head's top class and how much "
                       "more it adds to that logit than to the average class.")
