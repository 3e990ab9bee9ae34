"""Probes · painted concepts: paint patches as concept (and not concept) on the session's images; a patch probe per
layer says from which layer on the concept is readable, and its probability map says where else it fires."""
import streamlit as st

from ui.cache import cached_lens
from ui.charts import file_stem, show_chart
from ui.concepts import BRUSHES, backbone_spec, fit, fitted, paint_picker, painted_set, painting
from ui.downloads import button_row
from ui.state import setup
from ui.navigation import concepts_link, heading
from ui.words import counted
from vitviz.errors import VitvizError
from vitviz.figures.core import panel_width
from vitviz.probes.concepts import HOLDOUT, LABEL_RULE, MAPS
from vitviz.probes.figures import concept_accuracy_figure, concept_maps_figure

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
st.caption("Paint the patches of a concept on one or more images; for every layer a logistic probe (L2, C = 0.1 on "
           "standardised tokens, classes weighted by inverse frequency) reads the patch tokens of that layer's output "
           "(resid_post). Accuracy is out-of-fold; the maps show the probe's probability on every patch of every image.")
lens = cached_lens(backbone_spec(ctx))  # concepts are probed on the backbone, never through a probe head
if lens.scope != "global":
    st.info(f"{lens.label} attends within windows and pools only its last stage: patch probes read models whose "
            "every layer has the same patch tokens.")
    st.stop()
layout = lens.layout
grid = tuple(layout.grid_size)
names = [im.name for im in ctx.images]
inputs = lens.preprocess([im.image for im in ctx.images]).images  # the model-input images: paint and draw on these

left, right = st.columns([1.15, 1])
with left:
    c1, c2 = st.columns([1.4, 1])
    on = c1.selectbox("Paint on", names, index=names.index(ctx.image.name) if ctx.image.name in names else 0,
                      key="concept_image", help="The sidebar's images (samples and uploads); paint on one or more.")
    brush = BRUSHES[c2.radio("Brush", list(BRUSHES), key="concept_brush", horizontal=True,
                             help="A click toggles the patch under it; a drag paints the rectangle it spans. Orange: concept, blue: not "
                                  "concept.")]
    i = names.index(on)
    paint_picker(inputs[i], ctx.images[i].sha256, layout, brush, "concept_click")
    paint = painting(ctx.images[i].sha256, grid)
    with button_row("concept_clear_row"):  # side by side, each as wide as its label (not half the picture apart)
        clear_one = st.button("Clear this image", key="concept_clear")
        clear_all = st.button("Clear every image", key="concept_clear_all")
    cleared = ctx.images if clear_all else [ctx.images[i]] if clear_one else []
    for im in cleared:
        for patches in painting(im.sha256, grid).values():
            patches.clear()
    if cleared:
        st.rerun()
with right:
    st.markdown("**Painted** (on the left: click a patch to toggle it, drag to paint a rectangle; orange = concept, "
                "blue = not concept)")
    counts = []
    for im in ctx.images:
        p = painting(im.sha256, grid)
        counts.append(f"- {im.name}: {len(p['concept'])} concept, {len(p['not'])} not concept"
                      + ("" if p["concept"] or p["not"] else " (maps only)"))
    st.markdown("\n".join(counts))
    st.caption(f"Which patches count: {LABEL_RULE}. Hold-out: {HOLDOUT['images']} when two or more images are "
               f"painted, else {HOLDOUT['blocks']}.")
    painted, key = painted_set(ctx.images, grid)
    run = st.button("Fit the concept's probe on every layer", type="primary", key="concept_fit")

if run:
    try:
        bar = st.progress(0.0, text="Tokens of every layer ...")
        fit(ctx, lens, painted, key, lambda done: bar.progress(
            done / len(ctx.images), text=f"Tokens: {done} of {counted(len(ctx.images), 'image')} (one forward each)"))
        bar.empty()
    except VitvizError as exc:
        st.error(str(exc))
concept = fitted(ctx, key)
if concept is None:
    st.info("Paint some patches of a concept (a click toggles one, a drag paints a rectangle) and press the button: the model runs once per image "
            "and a probe is fitted on every layer's patch tokens." + (
                " The paintings changed since the last fit." if fitted(ctx) is not None else ""))
    st.stop()

first = concept.readable_from(0.9)
best = max(concept.layers, key=lambda s: (s.balanced_accuracy, -s.layer)).layer
layer = st.slider("Layer (1-based)", 1, concept.num_layers, first or best, key="concept_layer",
                  help="Both the accuracy star and the maps follow this layer.")
stem = file_stem("concept", lens.spec.name, f"layer{layer}")
show_chart(concept_accuracy_figure(concept.table, concept.chance, layer,
                                   f"From which layer on is the concept readable · {sum(im['concept'] for im in concept.images)} "
                                   f"concept and {sum(im['not_concept'] for im in concept.images)} not-concept patches"),
           "concept_accuracy", file_stem("concept_accuracy", lens.spec.name))
st.caption(("Readable (balanced accuracy ≥ 90 %) from layer " + str(first) + " on." if first else
            "No run of layers reaches a balanced accuracy of 90 % to the last layer.")
           + f" Hold-out: {HOLDOUT[concept.holdout]}. Balanced accuracy is the mean of the concept and not-concept "
           "recalls (chance 50 % whatever the concept's share); plain accuracy's chance is the larger class's share. "
           + concepts_link("chance"))
current = names.index(ctx.image.name) if ctx.image.name in names else 0
order = [current] + [j for j in range(len(names)) if j != current]
titles = [f"{names[j]}{' (current)' if j == current else ''}<br>"
          + (f"painted: {concept.images[j]['concept']} concept" if concept.images[j]["concept"] or
             concept.images[j]["not_concept"] else "not painted: prediction") for j in order]
maps_fig = concept_maps_figure([inputs[j] for j in order], concept.probability[order, layer - 1], titles, layout,
                               painted=[painted.concept[j] for j in order], highlight=0,
                               title=f"Where the concept fires · the layer-{layer} probe's probability on every image")
# As wide as its tiles and their colour bar: at the column's width the bar stood ~200 px right of the maps.
show_chart(maps_fig, "concept_maps", stem, width=panel_width(maps_fig))
st.caption("One fixed scale, probability 0 to 1 (Viridis), for every image; painted concept patches are outlined in "
           "white. On painted images the map is the probe's fit to its own training patches; on the others it is a "
           "prediction. Hover a patch for its probability.")
files = concept.files()
d1, d2, d3 = st.columns(3)
d1.download_button("probe.safetensors", files["probe.safetensors"], file_name="probe.safetensors",
                   help="weight (L, D), bias (L,): row l-1 is layer l's probe on resid_post patch tokens")
d2.download_button("probe.json", files["probe.json"], file_name="probe.json", mime="application/json")
d3.download_button(MAPS, files[MAPS], file_name=MAPS, help="probability (n, L, gh, gw), names, labels")
st.caption("The Attribution page now offers this concept as its target (the probe's logit summed over the patches, "
           "at a layer you choose): which pixels made it fire.")
