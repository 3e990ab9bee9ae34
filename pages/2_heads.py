"""Attention heads: every head of a layer over the image; query, direction, threshold; compare layers."""
import numpy as np
import streamlit as st

from ui.charts import file_stem, show_chart
from ui.display import display_controls, map_figure, panel_download, patch_picker
from ui.downloads import download_row
from ui import windows
from ui.state import setup
from vitviz.maps import RANKINGS, layer_maps, rank_heads, threshold_mask

DINO_KEEP = 0.6

ctx = setup()
if ctx is None:
    st.stop()
st.header(f"Attention heads · {ctx.image.name}")
if ctx.loaded.attention_scope == "window":  # Swin: each head's window around a clicked patch
    windows.heads_view(ctx)
    st.stop()
r, layout = ctx.result, ctx.result.layout
L, H = r.attention.shape[:2]
if opened := st.session_state.pop("opened_from_distance", None):
    st.success(f"Opened from the distance plot: layer {opened[0]}, head {opened[1]} (outlined in the grid and "
               "picked below under Compare layers).")


def _compare_head() -> int | None:
    """The head picked under Compare layers (0-based; the selectbox counts from 1), to outline in the grid."""
    head = st.session_state.get("compare_head")
    return None if head is None else int(head) - 1


# A fragment: moving a slider here redraws this view only, not the sidebar and its caches.
@st.fragment
def heads_view() -> None:
    controls, grid_col = st.columns([1, 3.3])
    with controls:
        layer = st.slider("Layer", 1, L, L, key="heads_layer") - 1
        queries = (["CLS"] if layout.has_class_token else []) + ["mean over patches", "clicked patch"]
        query_label = st.radio("Query", queries, key="query", horizontal=True)
        direction = st.radio("Direction", ["query → keys", "keys → query"], key="direction", horizontal=True,
                             help="keys → query: how much every patch attends to the clicked patch")
        patch_picker(r.model_input, layout, "patch_click", scope="fragment")
        patch = st.session_state.get("patch")
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
    mode = "key" if direction == "keys → query" else "query"
    maps = layer_maps(r.attention, layout, layer, query, mode)
    order = list(range(H))
    scores = r.head_scores
    if ranking != "head number":
        key = RANKINGS[ranking]
        order = list(rank_heads(scores[key][layer], descending=key != "entropy"))
    if display.style == "DINO mask" and keep == 0:
        keep = DINO_KEEP  # the mask style needs a mask: DINO's own 60% of the mass
    masks = np.stack([threshold_mask(maps[h], keep) for h in order]) if keep > 0 else None
    sinks = r.sinks.patch_sinks(layout, [layer]) if display.exclude_sinks else None
    what = {"cls": "CLS query", "mean": "mean over patch queries"}.get(query, f"patch {patch} as " + mode)
    titles = [f"head {h + 1}" for h in order]
    notes = [f"H {scores['entropy'][layer, h]:.2f} nats · focus {scores['cls_focus'][layer, h]:.2f} · "
             f"{r.distance[layer, h]:.0f} px" for h in order]
    title = f"Layer {layer + 1}, every head, {what}" + (f", DINO mask keeping {keep:.0%} of the mass" if keep else "")
    with grid_col:
        rendered, fig = map_figure(r.model_input, maps[order], layout, display, titles=titles, notes=notes, title=title,
                                   masks=masks, query=patch if by_patch else None, sinks=sinks,
                                   columns=3 if H <= 9 else 4, highlight=_compare_head())
        stem = file_stem("heads", ctx.image.name, f"layer{layer + 1}", str(query))
        show_chart(fig, "heads_grid", stem)
        st.caption(rendered.caption() + " H: entropy of the patch queries' attention over patches (nats; uniform = "
                   f"ln {layout.num_patches} = {np.log(layout.num_patches):.2f}). Focus: 1 − entropy / ln N of the "
                   "readout's attention (0 uniform, 1 one patch). px: mean attention distance of the head.")
        settings = display.settings(rendered) | {
            "image": ctx.image.name, "sha256": ctx.image.sha256, "model": ctx.loaded.card()["spec"],
            "layer (1-based)": layer + 1, "query": what, "keep_share": keep,
            "head_order (1-based)": [h + 1 for h in order], "maps_axis_0": "heads in head_order"}
        download_row(stem, {"maps": maps[order], "head_order": np.array(order), "entropy": scores["entropy"],
                            "cls_focus": scores["cls_focus"], "distance": r.distance}, settings,
                     panel_download(r.model_input, maps[order], display, titles, title, masks=masks,
                                    query=patch if by_patch else None, sinks=sinks, columns=3 if H <= 9 else 4))

    st.subheader("Compare layers")
    cc = st.columns([1, 1, 2])
    head = cc[0].selectbox("Head", list(range(1, H + 1)), key="compare_head") - 1
    panels = int(cc[1].number_input("Layers side by side", 2, 4, 2, key="compare_n"))
    cols = st.columns(panels)
    compare_layers = [col.slider(f"Layer {chr(65 + i)}", 1, L, round(1 + i * (L - 1) / (panels - 1)), key=f"compare_{i}") - 1
                      for i, col in enumerate(cols)]
    compare = np.stack([layer_maps(r.attention, layout, l, query, mode)[head] for l in compare_layers])
    compare_sinks = [r.sinks.patch_sinks(layout, [l]) for l in compare_layers] if display.exclude_sinks else None
    compare_titles = [f"layer {l + 1}, head {head + 1}" for l in compare_layers]
    compare_title = f"Head {head + 1} across layers, {what}"
    rendered_cmp, fig_cmp = map_figure(r.model_input, compare, layout, display, titles=compare_titles, title=compare_title,
                                       query=patch if by_patch else None, sinks=compare_sinks, columns=panels)
    stem = file_stem("compare", ctx.image.name, f"head{head + 1}", "layers", *[l + 1 for l in compare_layers])
    show_chart(fig_cmp, "compare_grid", stem)
    st.caption(rendered_cmp.caption())
    download_row(stem, {"maps": compare, "layers_1based": np.array(compare_layers) + 1},
                 display.settings(rendered_cmp) | {"image": ctx.image.name, "head (1-based)": head + 1,
                                                   "layers (1-based)": [l + 1 for l in compare_layers], "query": what},
                 panel_download(r.model_input, compare, display, compare_titles, compare_title,
                                query=patch if by_patch else None, sinks=compare_sinks, columns=panels))


heads_view()
