"""The Rollout page's sections: rollout's settings (:func:`rollout_controls`), whose row is read out
(:func:`readout_controls`), the rollout map beside the last layer's attention or an attribution map
(:func:`rollout_section`), its repair's before / after, class-specific gradient rollout and attention flow.

The choices travel as small dataclasses: :class:`RolloutChoice` (the rollout's settings), :class:`Readout` (whose row,
which depth, which display) and :class:`RolloutMaps` (the maps computed for them)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui import keys
from ui.attribution import attribution_panel
from ui.cache import cached_gradient_rollout, cached_rollout
from ui.charts import file_stem, show_chart
from ui.display import Display, display_controls, map_figure, panel_download, patch_picker, render
from ui.downloads import download_row
from ui.explorer import browser_draws, rollout_explorer
from ui.guard import guarded
from ui.navigation import concepts_link
from ui.progress import cached, with_progress
from ui.repair import repair_view
from vitviz.analyses.flow import FLOW_DEFINITION, attention_flow
from vitviz.analyses.maps import mean_head_map
from vitviz.analyses.rollout import FUSIONS, mass_on, patch_tokens, readout_label, rollout, token_patches
from vitviz.analyses.tokens import top_classes
from vitviz.runs.analysis import AnalysisSettings, excluded_tokens

EXCLUDE = {"nothing": (False, False), "attention sinks": (True, False), "high-norm tokens": (False, True),
           "sinks and high-norm tokens": (True, True)}
BESIDE_RAW, BESIDE_ATTRIBUTION = "last layer's attention", "attribution"
CLICKED = "clicked patch"


@dataclass
class RolloutChoice:
    """Rollout's settings as chosen: head fusion, discard share, layers (1-based, inclusive), what is kept out."""

    fusion: str
    discard: float
    start: int
    end: int
    exclude_sinks: bool
    exclude_artifacts: bool
    padding_out: bool  # the padding patches are kept out
    padding_tokens: tuple[int, ...]  # their sequence indices when kept out

    @property
    def settings(self) -> AnalysisSettings:
        return AnalysisSettings(fusion=self.fusion, discard=self.discard, start_layer=self.start - 1,
                                end_layer=self.end, exclude_artifacts=self.exclude_artifacts,
                                exclude_sinks=self.exclude_sinks)

    @property
    def plain(self) -> AnalysisSettings:
        """The same rollout with nothing kept out."""
        return AnalysisSettings(fusion=self.fusion, discard=self.discard, start_layer=self.start - 1,
                                end_layer=self.end)

    def kept_out(self, artifacts, sinks, layout) -> tuple[int, ...]:
        """Token indices kept out of rollout: the settings' sinks and high-norm tokens, and the padding when chosen."""
        return tuple(sorted(set(excluded_tokens(self.settings, artifacts, sinks, layout)) | set(self.padding_tokens)))


def rollout_controls(ctx) -> RolloutChoice:
    """The row of rollout's settings (and the padding switch when the image was padded)."""
    L = ctx.result.attention.shape[0]
    layout = ctx.result.layout
    c1, c2, c3, c4 = st.columns(4)
    fusion = c1.selectbox("Head fusion", FUSIONS, key="fusion")
    discard = c2.slider("Discard lowest share", 0.0, 0.95, 0.0, 0.05, key="discard")
    start, end = c3.slider("Layers", 1, L, (1, L), key="layer_range")
    exclude = c4.selectbox("Keep out of rollout", list(EXCLUDE), key="rollout_exclude",
                           help="Attention sinks: patches receiving a disproportionate share of attention in a layer "
                                "of the range. High-norm tokens: last-layer output norm > 10x the median (Darcet et "
                                "al.). " + concepts_link("definitions-used"))
    exclude_sinks, exclude_artifacts = EXCLUDE[exclude]
    # With "resize whole image (pad)", the patches holding only padding can be kept out of rollout as sinks are.
    padding_out = bool(ctx.padding.size) and st.toggle(
        f"Keep the {ctx.padding.size} padding patches out of rollout", True, key="rollout_exclude_padding",
        help="Patches that hold no pixel of the photo (the grey bands added by \"resize whole image (pad)\"): dropped "
             "as keys in every layer of the range, as kept-out sinks are.")
    padding_tokens = patch_tokens(layout, ctx.padding) if padding_out else ()
    return RolloutChoice(fusion, discard, start, end, exclude_sinks, exclude_artifacts, padding_out, padding_tokens)


@dataclass
class Readout:
    """Whose row is rolled out (``query``: a clicked patch, 0-based, or None for the readout) and, when the browser
    draws the map, its depth (1-based) and display (the server asks for both under the map: None here)."""

    query: int | None
    depth: int | None = None
    display: Display | None = None


def readout_controls(ctx, choice: RolloutChoice) -> Readout | None:
    """The browser's rollout view (depth and read-out patch repaint there) or the server's "Read out" choice and patch
    picker; None, with a line saying so, while a patch is to be read out and none is clicked."""
    r, layout = ctx.result, ctx.result.layout
    sinks = r.sinks.patch_sinks(layout, range(choice.start - 1, choice.end))
    if browser_draws():
        # Depth and read-out patch repaint in the browser; the server hears of them afterwards (captions, downloads).
        display = display_controls()
        view = rollout_explorer(ctx, fusion=choice.fusion, discard=choice.discard, start=choice.start - 1,
                                end=choice.end, exclude_tokens=choice.kept_out(r.artifacts, r.sinks, layout),
                                sinks=sinks, display=display)
        st.caption(f"Sent to the browser: {view.payload.nbytes / 1e6:.2f} MB for this image and these settings "
                   f"({'every patch’s rollout after every layer' if view.payload.patch_rows else 'the readout’s rollout; a clicked patch’s on demand'}).")
        patch = st.session_state.get(keys.PATCH)  # as the view just reported it
        if view.reads_patch and patch is None:
            return None  # the view says: click a patch first
        return Readout(patch if view.reads_patch else None, view.depth, display)
    readout_col, picker_col, _ = st.columns([1, 1, 2])
    reads_patch = readout_col.radio("Read out", [readout_label(layout), CLICKED], key="rollout_readout",
                                    help="Whose row of R = A'_end ⋯ A'_start is shown: the model's readout, or the row "
                                         "of a patch you click (where that patch's representation drew its mass from). "
                                         + concepts_link("definitions-used")) == CLICKED
    patch = st.session_state.get(keys.PATCH)  # the same patch as on the heads page
    if reads_patch:
        with picker_col:
            patch_picker(r.model_input, layout, "rollout_patch_click")
            st.caption("Click a patch to roll out its row. Selected: "
                       + (layout.token_name(layout.num_prefix_tokens + patch) if patch is not None else "none"))
        if patch is None:
            st.info("Click a patch on the image beside \"Read out\" first.")
            return None
    return Readout(patch if reads_patch else None)


@dataclass
class RolloutMaps:
    """Rollout as chosen, the same without exclusions, and what the exclusions took away."""

    result: object  # vitviz.analyses.rollout.Rollout, with the exclusions
    plain: object  # the same rollout with nothing kept out
    sinks: np.ndarray  # the range's sink patches (0-based raster)
    dropped: list[int]  # the patches kept out (0-based raster)
    held: float  # the share of the readout's patch mass they held without the exclusion


def rollout_maps(ctx, choice: RolloutChoice, query: int | None) -> RolloutMaps:
    """Rollout of the readout (or patch ``query``) with and without the exclusions (cached for this image)."""
    r, layout = ctx.result, ctx.result.layout
    sinks = r.sinks.patch_sinks(layout, range(choice.start - 1, choice.end))
    result = cached_rollout(ctx.spec, ctx.image.sha256, r, choice.settings, query, extra_tokens=choice.padding_tokens)
    plain = cached_rollout(ctx.spec, ctx.image.sha256, r, choice.plain, query)
    dropped = token_patches(layout, choice.kept_out(r.artifacts, r.sinks, layout))
    return RolloutMaps(result, plain, sinks, dropped, mass_on(plain.map, dropped))


@dataclass
class Shown:
    """What is drawn under the settings: the depth (1-based), the display, the map beside rollout and its column."""

    depth: int
    display: Display
    beside: str
    beside_col: object  # the container the attribution panel puts its controls in

    def marked(self, maps: RolloutMaps) -> np.ndarray | None:
        """The sinks marked on the maps (and kept out of their colour scale) when the display says so."""
        return maps.sinks if self.display.exclude_sinks else None


def shown_controls(choice: RolloutChoice, readout: Readout) -> Shown:
    """The depth slider and the display (the server's; the browser's view has its own) and the "Beside rollout"
    choice."""
    if readout.depth is not None:
        beside_col, display, depth = st.container(), readout.display, readout.depth  # the depth moves in the browser
    else:
        display = display_controls()
        depth_col, beside_col = st.columns(2)
        depth = depth_col.slider("Show cumulative rollout after layer", choice.start, choice.end, choice.end,
                                 key="rollout_depth")
    # Attribution runs the model forward and backward: only when chosen (the first paint draws attention alone).
    beside = beside_col.radio("Beside rollout", [BESIDE_RAW, BESIDE_ATTRIBUTION], horizontal=True,
                              key="rollout_beside",
                              help="Attribution (AttnLRP by default) is computed when chosen, as on the Attribution "
                                   "page, and kept for this image, method and target.")
    return Shown(depth, display, beside, beside_col)


def _named(ctx, choice: RolloutChoice, patches: list[int]) -> str:
    """The kept-out patches for a caption: the padding ones counted, the others listed."""
    padding = set(ctx.padding.tolist()) if choice.padding_out else set()
    others = [p for p in patches if p not in padding]
    parts = ([f"patches {others}"] if others else []) + ([f"the {len(padding)} padding patches"] if padding else [])
    return " and ".join(parts)


def _rollout_map(ctx, choice: RolloutChoice, query: int | None, maps: RolloutMaps, shown: Shown) -> None:
    """The rollout after the chosen depth (drawn by the server, or only its downloads when the browser draws it),
    its caption and downloads."""
    r, layout = ctx.result, ctx.result.layout
    browser, display, depth, result = browser_draws(), shown.display, shown.depth, maps.result
    grid = result.per_layer[depth - choice.start][None]
    # Short titles: the figure is half the page wide; the caption names the patch's row and column.
    title = (f"Rollout, layers {choice.start}–{depth} ({choice.fusion} over heads" if query is None
             else f"Rollout of patch {query}, layers {choice.start}–{depth} ({choice.fusion}") \
        + (f", discard {choice.discard:.0%})" if choice.discard else ")")
    if browser:
        rendered = render(r.model_input, grid, display, sinks=shown.marked(maps), query=query)
    else:
        rendered, fig = map_figure(r.model_input, grid, layout, display, titles=[""], title=title,
                                   sinks=shown.marked(maps), query=query, columns=1, value_name="rollout mass")
    stem = file_stem("rollout", ctx.image.name, f"layers{choice.start}-{depth}", choice.fusion,
                     *([] if query is None else [f"patch{query}"]))
    if not browser:
        show_chart(fig, "rollout_fig", stem, vector=False)
    st.caption(f"Readout: {result.readout if query is None else layout.token_name(layout.num_prefix_tokens + query)}. Share of the readout's mass on prefix tokens: "
               + ", ".join(f"{k} {v:.1%}" for k, v in result.prefix_share.items()) + ". "
               + (f"Kept out of rollout: {_named(ctx, choice, maps.dropped)}, which held {maps.held:.1%} of the "
                  "readout's patch mass without the exclusion. " if maps.dropped else
                  f"Attention sinks in these layers: patches {maps.sinks.tolist() or 'none'}; "
                  f"they hold {mass_on(maps.plain.map, maps.sinks):.1%} of the readout's patch mass. ")
               + ("" if browser else rendered.caption()))  # the browser's view has its own
    download_row(stem, {"rollout": result.map, "rollout_per_layer": result.per_layer},
                 display.settings(rendered) | {"image": ctx.image.name, "model": ctx.loaded.card()["spec"],
                                               "fusion": choice.fusion, "discard": choice.discard,
                                               "layers (1-based, inclusive)": [choice.start, choice.end],
                                               "shown_depth (1-based)": depth,
                                               "kept_out_patches (0-based)": maps.dropped, "kept_out_mass": maps.held,
                                               "readout": result.readout, "prefix_share": result.prefix_share},
                 panel_download(r.model_input, grid, display, [""], title, sinks=shown.marked(maps), query=query,
                                columns=1, value_name="rollout mass"))


def _raw_attention(ctx, query: int | None, display: Display) -> None:
    """The last layer's attention alone, mean over heads, of the readout or of patch ``query``: for comparison."""
    r, layout = ctx.result, ctx.result.layout
    L = r.attention.shape[0]
    if query is None:
        raw_query = raw_name = "cls" if layout.has_class_token else "mean"
        raw_title = f"Last layer ({L}), {raw_name} query, mean over heads"
    else:
        raw_query, raw_name = query, f"patch{query}"
        raw_title = f"Layer {L}, patch {query} as query, mean over heads"
    raw = mean_head_map(r.attention, layout, L - 1, raw_query)[None]
    rendered_raw, fig_raw = map_figure(r.model_input, raw, layout, display, titles=[""], title=raw_title,
                                       sinks=r.sinks.patch_sinks(layout, [L - 1]) if display.exclude_sinks else None,
                                       query=query, columns=1)
    show_chart(fig_raw, "raw_fig", file_stem("attention", ctx.image.name, f"layer{L}", raw_name, "meanheads"))
    st.caption("For comparison: the raw attention of the last layer alone. " + rendered_raw.caption())


def rollout_section(ctx, choice: RolloutChoice, query: int | None, maps: RolloutMaps, shown: Shown) -> None:
    """Rollout after the chosen depth at the left; the last layer's attention or an attribution map at the right."""
    left, right = st.columns(2)
    with left, guarded("the rollout map"):
        _rollout_map(ctx, choice, query, maps, shown)
    with right, guarded("the map beside rollout"):
        if shown.beside == BESIDE_ATTRIBUTION:
            attribution_panel(ctx, "rollout_attr", controls=shown.beside_col, display=shown.display)
        else:
            _raw_attention(ctx, query, shown.display)


def repair_section(ctx, choice: RolloutChoice, query: int | None, display: Display) -> None:
    """This rollout before and after a repair (ui/repair.py)."""
    def maps_of(side):
        res = side.result
        out = rollout(res.attention, res.layout, fusion=choice.fusion, discard=choice.discard, start=choice.start - 1,
                      end=choice.end, query=query, exclude_tokens=choice.kept_out(res.artifacts, res.sinks, res.layout))
        return {f"rollout, layers {choice.start}–{choice.end}": out.map}

    what = readout_label(ctx.result.layout, query)
    repair_view(ctx, "rollout", maps_of, what=f"Rollout of the {what}", value_name="rollout mass",
                padding=display.padding)


def gradient_section(ctx, display: Display) -> None:
    """Class-specific gradient rollout of a class among the top ten (models with a classifier head)."""
    r, layout = ctx.result, ctx.result.layout
    st.subheader("Class-specific gradient rollout")
    if not ctx.lens.has_head:
        st.info("Gradient rollout needs a classifier head; this model has none. Pick a timm model with a head "
                "(e.g. vit_base_patch16_224.augreg2_in21k_ft_in1k) in the sidebar.")
        return
    with guarded("gradient rollout"):
        top = top_classes(r.logits, k=10, labels=ctx.lens.class_labels)
        label = st.selectbox("Class", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key="target")
        target = int(label.split(":")[0])
        grad_map, _ = cached_gradient_rollout(ctx.spec, ctx.image.sha256, ctx.image.image, target)
        grad_title = f"Gradient rollout for class {label}"
        rendered_grad, fig_grad = map_figure(r.model_input, grad_map[None], layout, display, titles=[""],
                                             title=grad_title, columns=1, value_name="relevance")
        stem = file_stem("gradient_rollout", ctx.image.name, f"class{target}")
        show_chart(fig_grad, "grad_fig", stem, vector=False)
        st.caption(rendered_grad.caption())
        download_row(stem, {"gradient_rollout": grad_map},
                     display.settings(rendered_grad) | {"image": ctx.image.name, "target_class": target,
                                                        "model": ctx.loaded.card()["spec"]},
                     panel_download(r.model_input, grad_map[None], display, [""], grad_title, columns=1,
                                    value_name="relevance"))


def flow_section(ctx, choice: RolloutChoice, query: int | None, maps: RolloutMaps, shown: Shown) -> None:
    """Attention flow (Abnar & Zuidema 2020) on rollout's graph, computed on demand, beside rollout."""
    r, layout = ctx.result, ctx.result.layout
    start, end, fusion, discard = choice.start, choice.end, choice.fusion, choice.discard
    st.subheader("Attention flow (Abnar & Zuidema 2020)")
    st.caption("The companion of rollout: the same per-layer graph (fusion, discard, 0.5 A + 0.5 I, layers and "
               "exclusions above) read as capacities; each patch's value is the maximum flow from it to the readout, "
               "solved exactly (one max-flow per patch, so it takes a while; a shorter layer range is faster).")
    flow_tokens = choice.kept_out(r.artifacts, r.sinks, layout)
    flow_key = ("flow", ctx.spec, ctx.image.sha256, fusion, discard, start - 1, end, flow_tokens, query)
    # Flow reads out what rollout reads out above (the model's readout or the clicked patch); the titles say which.
    reads = readout_label(layout, query)
    flow_slot = st.empty()  # the button goes away once the result is there
    if cached(flow_key) is None and not flow_slot.button(f"Compute attention flow, layers {start}–{end} "
                                                         f"({layout.num_patches} max-flow problems)", key="flow_run"):
        st.info("Attention flow is computed on demand; the result is kept for this image and these settings.")
        return
    flow = with_progress(flow_key, f"Attention flow, layers {start}–{end}: patch",
                         lambda progress: attention_flow(r.attention, layout, fusion=fusion, discard=discard,
                                                         start=start - 1, end=end, exclude_tokens=flow_tokens,
                                                         progress=progress, query=query))
    flow_slot.empty()
    flow_left, flow_right = st.columns(2)
    for column, grid, name, key in ((flow_left, flow.map, "Attention flow", "flow_fig"),
                                    (flow_right, maps.result.map, "Rollout", "flow_rollout_fig")):
        with column:
            title = (f"{name} into {reads}, layers {start}–{end} ({fusion}"
                     + (f", discard {discard:.0%})" if discard else ")"))
            rendered_flow, fig_flow = map_figure(r.model_input, grid[None], layout, shown.display, titles=[""],
                                                 title=title, sinks=shown.marked(maps), query=query, columns=1,
                                                 value_name="flow" if name != "Rollout" else "rollout mass")
            show_chart(fig_flow, key, file_stem(name.lower().replace(" ", "_"), ctx.image.name,
                                                f"layers{start}-{end}", fusion))
            st.caption(rendered_flow.caption())
    st.caption(f"Flow values are in attention mass (at most 1, what the readout takes in). Unlike rollout's, they do "
               f"not sum to 1 over the patches: each patch's flow is solved alone and may use every path, so values "
               f"crowd towards 1 and their order says more than their size. Exact up to the integer "
               f"scaling of the capacities (S = {flow.scale}): each value is at most {flow.error_bound.max():.1e} "
               f"below the true flow.")
    stem = file_stem("attention_flow", ctx.image.name, f"layers{start}-{end}", fusion)
    download_row(stem, {"attention_flow": flow.map, "error_bound": flow.error_bound},
                 {"image": ctx.image.name, "model": ctx.loaded.card()["spec"], "definition": FLOW_DEFINITION,
                  "fusion": fusion, "discard": discard, "layers (1-based, inclusive)": [start, end],
                  "kept_out_tokens (0-based sequence index)": list(flow_tokens), "readout": flow.readout,
                  "capacity_scale": flow.scale},
                 panel_download(r.model_input, flow.map[None], shown.display, [""],
                                f"Attention flow into {reads}, layers {start}–{end}", sinks=shown.marked(maps),
                                query=query, columns=1, value_name="flow"))
