"""Mean attention distance per head and layer (ViT paper Fig. 7 right), one image or the whole set."""
import streamlit as st

from ui.cache import cached_image_result
from ui.downloads import download_row
from ui.state import setup
from vitviz.distance import CONVENTION, DistanceResult, conv_receptive_field
from vitviz.figures import distance_scatter, layer_head_heatmap

ctx = setup()
if ctx is None:
    st.stop()
r = ctx.result
L, H = r.distance.shape
st.header("Mean attention distance")
scope = st.radio("Images", [f"current image ({ctx.image.name})", f"all {len(ctx.images)} images in the set"],
                 horizontal=True, key="distance_scope")
if scope.startswith("all"):
    bar = st.progress(0.0, text="Running the model on the image set ...")
    per_image = []
    for i, im in enumerate(ctx.images):
        per_image.append(cached_image_result(ctx.spec, im.sha256, im.image).distance)
        bar.progress((i + 1) / len(ctx.images), text=f"{i + 1} of {len(ctx.images)} images")
    bar.empty()
    summary = DistanceResult.from_per_image(per_image)
    distance, spread = summary.mean, summary.spread
else:
    distance, spread = r.distance, None

view = st.radio("View", ["depth plot", "layer × head heatmap"], horizontal=True, key="distance_view")
if view == "depth plot":
    event = st.plotly_chart(distance_scatter(distance, conv_receptive_field(L), spread), key="distance_plot",
                            on_select="rerun", selection_mode="points")
    picked = event.selection.points if event and event.selection else []
    if picked and "customdata" in picked[0]:
        layer, head = int(picked[0]["customdata"][0]), int(picked[0]["customdata"][1])
        if st.button(f"Open layer {layer}, head {head} on the heads page"):
            st.session_state["heads_layer"] = layer
            st.session_state["compare_head"] = head
            st.switch_page("pages/2_heads.py")
else:
    st.plotly_chart(layer_head_heatmap(distance, "mean attention distance", "pixels"), key="distance_heatmap")
st.caption(f"Convention: {CONVENTION}. Grey dashes: receptive field of a stack of 3x3 stride-1 convolutions "
           "of the same depth, for comparison.")
download_row("mean_distance", {"mean_distance": distance} | ({"mean_distance_std": spread} if spread is not None else {}),
             {"images": [im.name for im in ctx.images] if spread is not None else [ctx.image.name],
              "model": ctx.loaded.card()["spec"], "convention": CONVENTION})
