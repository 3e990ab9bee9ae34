"""Rollout: attention rollout with its settings, gradient rollout for models with a head, raw attention."""
import numpy as np
import streamlit as st

from ui import keys
from ui.attribution import attribution_panel
from ui.cache import cached_gradient_rollout, cached_rollout
from ui.charts import file_stem, show_chart
from ui.display import display_controls, map_figure, panel_download, patch_picker, render
from ui.downloads import download_row
from ui.explorer import browser_draws, rollout_explorer
from ui.guard import guarded
from ui.state import view_applies, setup
from ui.progress import cached, with_progress
from ui.repair import repair_view
from ui.navigation import concepts_link, heading
from vitviz.runs.analysis import AnalysisSettings, excluded_tokens
from vitviz.analyses.flow import FLOW_DEFINITION, attention_flow
from vitviz.analyses.maps import layer_maps
from vitviz.analyses.rollout import FUSIONS, rollout
from vitviz.analyses.tokens import top_classes

EXCLUDE = {"nothing": (False, False), "attention sinks": (True, False), "high-norm tokens": (False, True),
           "sinks and high-norm tokens": (True, True)}
BESIDE_RAW, BESIDE_ATTRIBUTION = "last layer's attention", "attribution"

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
view_applies(ctx, "rollout")
r, layout = ctx.result, ctx.result.layout
L = r.attention.shape[0]
READOUT, CLICKED = ("CLS" if layout.has_class_token else "mean over patch rows"), "clicked patch"

c1, c2, c3, c4 = st.columns(4)
fusion = c1.selectbox("Head fusion", FUSIONS, key="fusion")
discard = c2.slider("Discard lowest share", 0.0, 0.95, 0.0, 0.05, key="discard")
start, end = c3.slider("Layers", 1, L, (1, L), key="layer_range")
exclude = c4.selectbox("Keep out of rollout", list(EXCLUDE), key="rollout_exclude",
                       help="Attention sinks: patches receiving a disproportionate share of attention in a layer of "
                            "the range. High-norm tokens: last-layer output norm > 10x the median (Darcet et al.). "
                            + concepts_link("definitions-used"))
exclude_sinks, exclude_artifacts = EXCLUDE[exclude]
# With "resize whole image (pad)", the patches holding only padding can be kept out of rollout as sinks are.
padding_out = bool(ctx.padding.size) and st.toggle(
    f"Keep the {ctx.padding.size} padding patches out of rollout", True, key="rollout_exclude_padding",
    help="Patches that hold no pixel of the photo (the grey bands added by \"resize whole image (pad)\"): dropped as "
         "keys in every layer of the range, as kept-out sinks are.")
padding_tokens = tuple(int(p) + layout.num_prefix_tokens for p in ctx.padding) if padding_out else ()

settings = AnalysisSettings(fusion=fusion, discard=discard, start_layer=start - 1, end_layer=end,
                            exclude_artifacts=exclude_artifacts, exclude_sinks=exclude_sinks)


def _kept_out(settings, artifacts, sinks, layout) -> tuple[int, ...]:
    """Token indices kept out of rollout: the settings' sinks and high-norm tokens, and the padding when chosen."""
    return tuple(sorted(set(excluded_tokens(settings, artifacts, sinks, layout)) | set(padding_tokens)))


sinks = r.sinks.patch_sinks(layout, range(start - 1, end))
BROWSER = browser_draws()
if BROWSER:
    # Depth and read-out patch repaint in the browser; the server hears of them afterwards (captions, downloads).
    display = display_controls()
    view = rollout_explorer(ctx, fusion=fusion, discard=discard, start=start - 1, end=end,
                            exclude_tokens=_kept_out(settings, r.artifacts, r.sinks, layout), sinks=sinks,
                            display=display)
    reads_patch, depth, patch = view.reads_patch, view.depth, st.session_state.get(keys.PATCH)
    st.caption(f"Sent to the browser: {view.payload.nbytes / 1e6:.2f} MB for this image and these settings "
               f"({'every patch’s rollout after every layer' if view.payload.patch_rows else 'the readout’s rollout; a clicked patch’s on demand'}).")
    if reads_patch and patch is None:
        st.stop()  # the view says: click a patch first
else:
    readout_col, picker_col, _ = st.columns([1, 1, 2])
    reads_patch = readout_col.radio("Read out", [READOUT, CLICKED], key="rollout_readout",
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
            st.stop()
query = patch if reads_patch else None

result = cached_rollout(ctx.spec, ctx.image.sha256, r, settings, query, extra_tokens=padding_tokens)
plain = cached_rollout(ctx.spec, ctx.image.sha256, r, AnalysisSettings(fusion=fusion, discard=discard,
                                                                       start_layer=start - 1, end_layer=end), query)
artifacts = np.asarray(r.artifacts, dtype=int) - layout.num_prefix_tokens
dropped = sorted(set(sinks.tolist() if exclude_sinks else []) | set(artifacts.tolist() if exclude_artifacts else [])
                 | (set(ctx.padding.tolist()) if padding_out else set()))
held = float(plain.map.ravel()[dropped].sum()) if dropped else 0.0


def _named(patches: list[int]) -> str:
    """The kept-out patches for a caption: the padding ones counted, the others listed."""
    padding = set(ctx.padding.tolist()) if padding_out else set()
    others = [p for p in patches if p not in padding]
    parts = ([f"patches {others}"] if others else []) + ([f"the {len(padding)} padding patches"] if padding else [])
    return " and ".join(parts)


if BROWSER:
    beside_col = st.container()  # the depth moves inside the browser's view above
else:
    display = display_controls()
    depth_col, beside_col = st.columns(2)
    depth = depth_col.slider("Show cumulative rollout after layer", start, end, end, key="rollout_depth")
marked = sinks if display.exclude_sinks else None
# Attribution runs the model forward and backward: only when chosen (the first paint draws attention alone).
beside = beside_col.radio("Beside rollout", [BESIDE_RAW, BESIDE_ATTRIBUTION], horizontal=True, key="rollout_beside",
                          help="Attribution (AttnLRP by default) is computed when chosen, as on the Attribution page, "
                               "and kept for this image, method and target.")
left, right = st.columns(2)
with left, guarded("the rollout map"):
    shown = result.per_layer[depth - start][None]
    # Short titles: the figure is half the page wide; the caption names the patch's row and column.
    title = (f"Rollout, layers {start}–{depth} ({fusion} over heads" if query is None
             else f"Rollout of patch {query}, layers {start}–{depth} ({fusion}") + (f", discard {discard:.0%})"
                                                                                 if discard else ")")
    if BROWSER:
        rendered = render(r.model_input, shown, display, sinks=marked, query=query)
    else:
        rendered, fig = map_figure(r.model_input, shown, layout, display, titles=[""], title=title, sinks=marked,
                                   query=query, columns=1, value_name="rollout mass")
    stem = file_stem("rollout", ctx.image.name, f"layers{start}-{depth}", fusion,
                     *([] if query is None else [f"patch{query}"]))
    if not BROWSER:
        show_chart(fig, "rollout_fig", stem, vector=False)
    st.caption(f"Readout: {result.readout if query is None else layout.token_name(layout.num_prefix_tokens + query)}. Share of the readout's mass on prefix tokens: "
               + ", ".join(f"{k} {v:.1%}" for k, v in result.prefix_share.items()) + ". "
               + (f"Kept out of rollout: {_named(dropped)}, which held {held:.1%} of the readout's patch mass "
                  "without the exclusion. " if dropped else
                  f"Attention sinks in these layers: patches {sinks.tolist() or 'none'}; "
                  f"they hold {float(plain.map.ravel()[sinks].sum()):.1%} of the readout's patch mass. ")
               + ("" if BROWSER else rendered.caption()))  # the browser's view has its own
    download_row(stem, {"rollout": result.map, "rollout_per_layer": result.per_layer},
                 display.settings(rendered) | {"image": ctx.image.name, "model": ctx.loaded.card()["spec"],
                                               "fusion": fusion, "discard": discard,
                                               "layers (1-based, inclusive)": [start, end], "shown_depth (1-based)": depth,
                                               "kept_out_patches (0-based)": dropped, "kept_out_mass": held,
                                               "readout": result.readout, "prefix_share": result.prefix_share},
                 panel_download(r.model_input, shown, display, [""], title, sinks=marked, query=query, columns=1,
                                value_name="rollout mass"))
with right, guarded("the map beside rollout"):
    if beside == BESIDE_ATTRIBUTION:
        attribution_panel(ctx, "rollout_attr", controls=beside_col, display=display)
    else:
        if query is None:
            raw_query = raw_name = "cls" if layout.has_class_token else "mean"
            raw_title = f"Last layer ({L}), {raw_name} query, mean over heads"
        else:
            raw_query, raw_name = query, f"patch{query}"
            raw_title = f"Layer {L}, patch {query} as query, mean over heads"
        raw = layer_maps(r.attention, layout, L - 1, raw_query).mean(axis=0)[None]
        rendered_raw, fig_raw = map_figure(r.model_input, raw, layout, display, titles=[""], title=raw_title,
                                           sinks=r.sinks.patch_sinks(layout, [L - 1]) if display.exclude_sinks else None,
                                           query=query, columns=1)
        show_chart(fig_raw, "raw_fig", file_stem("attention", ctx.image.name, f"layer{L}", raw_name, "meanheads"))
        st.caption("For comparison: the raw attention of the last layer alone. " + rendered_raw.caption())

# ---- Repair: this rollout before and after (ui/repair.py) ----
def _repair_maps(side):
    res = side.result
    out = rollout(res.attention, res.layout, fusion=fusion, discard=discard, start=start - 1, end=end, query=query,
                  exclude_tokens=_kept_out(settings, res.artifacts, res.sinks, res.layout))
    return {f"rollout, layers {start}–{end}": out.map}


repair_view(ctx, "rollout", _repair_maps, what=f"Rollout of the {READOUT if query is None else f'patch {query}'}",
            value_name="rollout mass", padding=display.padding)

st.subheader("Class-specific gradient rollout")
if not ctx.lens.has_head:
    st.info("Gradient rollout needs a classifier head; this model has none. Pick a timm model with a head "
            "(e.g. vit_base_patch16_224.augreg2_in21k_ft_in1k) in the sidebar.")
else:
    with guarded("gradient rollout"):
        top = top_classes(r.logits, k=10, labels=ctx.lens.class_labels)
        label = st.selectbox("Class", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key="target")
        target = int(label.split(":")[0])
        grad_map, _ = cached_gradient_rollout(ctx.spec, ctx.image.sha256, ctx.image.image, target)
        grad_title = f"Gradient rollout for class {label}"
        rendered_grad, fig_grad = map_figure(r.model_input, grad_map[None], layout, display, titles=[""], title=grad_title,
                                             columns=1, value_name="relevance")
        stem = file_stem("gradient_rollout", ctx.image.name, f"class{target}")
        show_chart(fig_grad, "grad_fig", stem, vector=False)
        st.caption(rendered_grad.caption())
        download_row(stem, {"gradient_rollout": grad_map},
                     display.settings(rendered_grad) | {"image": ctx.image.name, "target_class": target,
                                                        "model": ctx.loaded.card()["spec"]},
                     panel_download(r.model_input, grad_map[None], display, [""], grad_title, columns=1,
                                    value_name="relevance"))

st.subheader("Attention flow (Abnar & Zuidema 2020)")
st.caption("The companion of rollout: the same per-layer graph (fusion, discard, 0.5 A + 0.5 I, layers and exclusions "
           "above) read as capacities; each patch's value is the maximum flow from it to the readout, solved exactly "
           "(one max-flow per patch, so it takes a while; a shorter layer range is faster).")
flow_tokens = _kept_out(settings, r.artifacts, r.sinks, layout)
flow_key = ("flow", ctx.spec, ctx.image.sha256, fusion, discard, start - 1, end, flow_tokens, query)
# Flow reads out what rollout reads out above (the model's readout or the clicked patch); the titles say which.
reads = READOUT if query is None else f"patch {query}"
flow_slot = st.empty()  # the button goes away once the result is there
if cached(flow_key) is None and not flow_slot.button(f"Compute attention flow, layers {start}–{end} ({layout.num_patches} "
                                              "max-flow problems)", key="flow_run"):
    st.info("Attention flow is computed on demand; the result is kept for this image and these settings.")
else:
    flow = with_progress(flow_key, f"Attention flow, layers {start}–{end}: patch",
                         lambda progress: attention_flow(r.attention, layout, fusion=fusion, discard=discard,
                                                         start=start - 1, end=end, exclude_tokens=flow_tokens,
                                                         progress=progress, query=query))
    flow_slot.empty()
    flow_left, flow_right = st.columns(2)
    for column, grid, name, key in ((flow_left, flow.map, "Attention flow", "flow_fig"),
                                    (flow_right, result.map, "Rollout", "flow_rollout_fig")):
        with column:
            title = (f"{name} into {reads}, layers {start}–{end} ({fusion}"
                     + (f", discard {discard:.0%})" if discard else ")"))
            rendered_flow, fig_flow = map_figure(r.model_input, grid[None], layout, display, titles=[""], title=title,
                                                 sinks=marked, query=query, columns=1, value_name="flow" if name != "Rollout"
                                                 else "rollout mass")
            show_chart(fig_flow, key, file_stem(name.lower().replace(" ", "_"), ctx.image.name, f"layers{start}-{end}",
                                                fusion))
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
                 panel_download(r.model_input, flow.map[None], display, [""],
                                f"Attention flow into {reads}, layers {start}–{end}", sinks=marked, query=query,
                                columns=1, value_name="flow"))
