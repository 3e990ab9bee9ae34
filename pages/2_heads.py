"""Attention heads: every head of a layer over the image; query, direction, threshold; compare layers."""
import numpy as np
import streamlit as st
from streamlit_image_coordinates import streamlit_image_coordinates

from ui.downloads import download_row
from ui.state import setup
from vitviz.figures import overlay_grid
from vitviz.maps import RANKINGS, layer_maps, rank_heads, threshold_mask
from vitviz.report import outline_patch

CLICK_SCALE = 2
COLOURS = ["Inferno", "Viridis", "Jet", "Greys", "Hot"]

ctx = setup()
if ctx is None:
    st.stop()
r, layout = ctx.result, ctx.result.layout
L, H = r.attention.shape[:2]
st.header(f"Attention heads · {ctx.image.name}")

controls, picker = st.columns([2, 1])
with controls:
    layer = st.slider("Layer", 1, L, L, key="heads_layer") - 1
    c1, c2, c3 = st.columns(3)
    queries = (["CLS"] if layout.has_class_token else []) + ["mean over patches", "clicked patch"]
    query_label = c1.radio("Query", queries, key="query")
    direction = c2.radio("Direction", ["query → keys", "keys → query"], key="direction",
                         help="keys → query: how much every patch attends to the clicked patch")
    keep = c3.slider("DINO mask: keep share of mass", 0.0, 1.0, 0.0, 0.05, key="keep", help="0 = no mask")
    c4, c5, c6 = st.columns(3)
    opacity = c4.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="opacity")
    colours = c5.selectbox("Colour map", COLOURS, key="colours")
    ranking = c6.selectbox("Order heads by", ["head number"] + list(RANKINGS), key="ranking")
with picker:
    st.caption("Click a patch to use it as the query (or the key).")
    patch = st.session_state.get("patch")
    click = streamlit_image_coordinates(outline_patch(r.model_input, patch, layout.grid_size, CLICK_SCALE),
                                        key="patch_click", image_format="JPEG", jpeg_quality=85)
    if click and click.get("unix_time") != st.session_state.get("last_click"):
        st.session_state["last_click"] = click.get("unix_time")
        st.session_state["patch"] = layout.patch_at(click["x"], click["y"], click["width"] / r.model_input.width)
        st.rerun()
    st.caption(f"Selected: {layout.token_name(layout.num_prefix_tokens + patch) if patch is not None else 'none'}")

if (query_label == "clicked patch" or direction == "keys → query") and patch is None:
    st.info("Click a patch on the image to the right first.")
    st.stop()
query = {"CLS": "cls", "mean over patches": "mean"}.get(query_label, patch)
if direction == "keys → query":
    query = patch
maps = layer_maps(r.attention, layout, layer, query, "key" if direction == "keys → query" else "query")
order = list(range(H))
scores = r.head_scores
if ranking != "head number":
    key = RANKINGS[ranking]
    order = list(rank_heads(scores[key][layer], descending=key != "entropy"))
masks = [threshold_mask(maps[h], keep) for h in order] if keep > 0 else None
titles = [f"head {h + 1} · H={scores['entropy'][layer, h]:.2f} · focus={scores['cls_focus'][layer, h]:.2f} · "
          f"{r.distance[layer, h]:.0f}px" for h in order]
st.plotly_chart(overlay_grid(r.model_input, maps[order], layout, titles, opacity=opacity, colorscale=colours,
                             masks=masks, highlight=patch if query_label == "clicked patch" or direction == "keys → query" else None),
                key="heads_grid")
settings = {"image": ctx.image.name, "sha256": ctx.image.sha256, "model": ctx.loaded.card()["spec"], "layer": layer + 1,
            "query": str(query), "direction": direction, "keep_share": keep, "head_order": [h + 1 for h in order]}
download_row(f"heads_layer{layer + 1}", {"maps": maps, "entropy": scores["entropy"], "cls_focus": scores["cls_focus"],
                                         "distance": r.distance}, settings)

st.subheader("Compare layers")
cc = st.columns([1, 1, 2])
head = cc[0].selectbox("Head", list(range(1, H + 1)), key="compare_head") - 1
panels = cc[1].number_input("Layers side by side", 2, 4, 2, key="compare_n")
cols = st.columns(int(panels))
compare_layers = []
for i, col in enumerate(cols):
    default = round(1 + i * (L - 1) / (int(panels) - 1))
    compare_layers.append(col.slider(f"Layer {chr(65 + i)}", 1, L, default, key=f"compare_{i}") - 1)
compare = [layer_maps(r.attention, layout, l, query, "key" if direction == "keys → query" else "query")[head]
           for l in compare_layers]
st.plotly_chart(overlay_grid(r.model_input, np.stack(compare), layout,
                             [f"layer {l + 1}, head {head + 1}" for l in compare_layers], columns=int(panels),
                             opacity=opacity, colorscale=colours), key="compare_grid")
