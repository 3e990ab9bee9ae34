"""Mean attention distance per head and layer (ViT paper Fig. 7 right), one image or the whole set."""
import streamlit as st

from ui.cache import cached_image_result
from ui.charts import file_stem, point_customdata, show_chart
from ui.downloads import download_row
from ui.guard import guarded
from ui.persist import set_view
from ui import keys, windows
from ui.state import setup
from ui.navigation import concepts_link, heading
from ui.words import counted
from vitviz.analyses.distance import CONVENTION, DistanceResult, conv_receptive_field, uniform_attention_distance
from vitviz.figures.core import distance_scatter, layer_head_heatmap

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
if ctx.lens.scope == "window":  # Swin: distance within windows, block by block
    windows.distance_view(ctx)
    st.stop()
r = ctx.result
L, H = r.distance.shape
scope = st.radio("Images", [f"current image ({ctx.image.name})",
                           f"the whole set ({counted(len(ctx.images), 'image')})"], horizontal=True, key="distance_scope")
if scope.startswith("the whole set"):
    bar = st.progress(0.0, text="Running the model on the image set ...")
    per_image = []
    for i, im in enumerate(ctx.images):
        per_image.append(cached_image_result(ctx.spec, im.sha256, im.image).distance)
        bar.progress((i + 1) / len(ctx.images), text=f"{i + 1} of {counted(len(ctx.images), 'image')}")
    bar.empty()
    summary = DistanceResult.from_per_image(per_image)
    distance, spread = summary.mean, summary.spread if len(per_image) > 1 else None
else:
    distance, spread = r.distance, None
uniform = uniform_attention_distance(r.layout)
names = [im.name for im in ctx.images] if scope.startswith("the whole set") else [ctx.image.name]
stem = file_stem("mean_distance", names[0] if len(names) == 1 else f"{len(names)}images")

view = st.radio("View", ["depth plot", "layer × head heatmap"], horizontal=True, key="distance_view")
if view == "depth plot":
    event = None
    with guarded("the depth plot"):
        event = show_chart(distance_scatter(distance, conv_receptive_field(L), spread, uniform, len(names)),
                           "distance_plot", stem, on_select="rerun", selection_mode="points")
    points = event.selection.points if event and event.selection else []
    picked = point_customdata(points[0]) if points else []
    if len(picked) >= 2:
        layer, head = int(picked[0]), int(picked[1])
        set_view(layer=layer, chead=head)  # the browser-drawn grid reads its view from the URL
        st.session_state[keys.OPENED_FROM_DISTANCE] = (layer, head)
        st.switch_page("pages/2_heads.py")
else:
    with guarded("the layer x head heatmap"):
        show_chart(layer_head_heatmap(distance, "mean attention distance", "pixels"), "distance_heatmap", stem)
if view == "depth plot":
    st.caption(f"Click a dot to open that head on the Attention heads page. Convention: {CONVENTION} "
               f"{concepts_link('distance-conventions')}. Dotted line: a "
               f"head attending uniformly to every patch of this {r.layout.grid_size[0]}x{r.layout.grid_size[1]} grid "
               f"({uniform:.1f} px). Grey dashes: receptive field of a stack of 3x3 stride-1 convolutions of the same "
               "depth, for comparison. "
               + (f"Error bars: ± one standard deviation over the {counted(len(names), 'image')}." if spread is not None
                  else "Pick the whole set for the spread over its images."))
else:
    st.caption(f"Each cell: one head's mean attention distance in pixels ({CONVENTION} "
               f"{concepts_link('distance-conventions')}), layers down and heads "
               f"across, both counted from 1; uniform attention on this grid would give {uniform:.1f} px"
               + (f"; the mean over the {counted(len(names), 'image')}." if len(names) > 1 else "."))
download_row(stem, {"mean_distance": distance} | ({"mean_distance_std": spread} if spread is not None else {}),
             {"images": names, "model": ctx.loaded.card()["spec"], "convention": CONVENTION,
              "uniform_attention_px": uniform, "axes": "mean_distance[layer - 1, head - 1] (0-based arrays)"})
