"""The Painted concepts page's sections: the backbone it probes (:func:`concept_lens`), the painting and the Fit button
(:func:`paint_section`, :func:`fit_on_press`), the layer (:func:`layer_choice`), from which layer on the concept is
readable (:func:`accuracy_section`), where it fires on every image (:func:`maps_section`) and the probe's files
(:func:`files_section`). The paintings and the fitted probe live in :mod:`ui.concepts`."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ui.cache import cached_lens
from ui.charts import file_stem, show_chart
from ui.concepts import BRUSHES, backbone_spec, fit, fitted, paint_picker, painted_set, painting
from ui.downloads import button_row
from ui.navigation import concepts_link
from ui.words import counted
from vitviz.errors import VitvizError
from vitviz.figures.core import panel_width
from vitviz.probes.concepts import HOLDOUT, LABEL_RULE, MAPS, PaintedImages
from vitviz.probes.figures import concept_accuracy_figure, concept_maps_figure


def intro() -> None:
    st.caption("Paint the patches of a concept on one or more images; for every layer a logistic probe (L2, C = 0.1 "
               "on standardised tokens, classes weighted by inverse frequency) reads the patch tokens of that layer's "
               "output (resid_post). Accuracy is out-of-fold; the maps show the probe's probability on every patch of "
               "every image.")


def concept_lens(ctx):
    """The sidebar's model without a probe head (concepts are probed on the backbone), or None, said on the page,
    when its layers do not all hold the same patch tokens (Swin)."""
    lens = cached_lens(backbone_spec(ctx))
    if lens.scope != "global":
        st.info(f"{lens.label} attends within windows and pools only its last stage: patch probes read models whose "
                "every layer has the same patch tokens.")
        return None
    return lens


@dataclass
class Canvas:
    """The sidebar's images as the backbone takes them: painted and drawn on at the model's input."""
    lens: object
    names: list[str]
    inputs: list  # the model-input images, one per name

    @property
    def layout(self):
        return self.lens.layout

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.layout.grid_size)


def canvas(ctx, lens) -> Canvas:
    return Canvas(lens, [im.name for im in ctx.images], lens.preprocess([im.image for im in ctx.images]).images)


def painted_line(name: str, concept: int, not_concept: int) -> str:
    """One image's painting in the list: "- a.jpg: 3 concept patches, 1 not-concept patch" ("(maps only)" when none)."""
    line = f"- {name}: {counted(concept, 'concept patch')}, {counted(not_concept, 'not-concept patch')}"
    return line + ("" if concept or not_concept else " (maps only)")


def _painter(ctx, c: Canvas) -> None:
    c1, c2 = st.columns([1.4, 1])
    names = c.names
    on = c1.selectbox("Paint on", names, index=names.index(ctx.image.name) if ctx.image.name in names else 0,
                      key="concept_image", help="The sidebar's images (samples and uploads); paint on one or more.")
    brush = BRUSHES[c2.radio("Brush", list(BRUSHES), key="concept_brush", horizontal=True,
                             help="A click toggles the patch under it; a drag paints the rectangle it spans. Orange: "
                                  "concept, blue: not concept.")]
    i = names.index(on)
    paint_picker(c.inputs[i], ctx.images[i].sha256, c.layout, brush, "concept_click")
    with button_row("concept_clear_row"):  # side by side, each as wide as its label (not half the picture apart)
        clear_one = st.button("Clear this image", key="concept_clear")
        clear_all = st.button("Clear every image", key="concept_clear_all")
    cleared = ctx.images if clear_all else [ctx.images[i]] if clear_one else []
    for im in cleared:
        for patches in painting(im.sha256, c.grid).values():
            patches.clear()
    if cleared:
        st.rerun()


def paint_section(ctx, c: Canvas) -> tuple[PaintedImages, tuple, bool]:
    """The picture to paint on (left) and what is painted on every image with the Fit button (right). Returns the
    paintings, their key and whether Fit was pressed."""
    left, right = st.columns([1.15, 1])
    with left:
        _painter(ctx, c)
    with right:
        st.markdown("**Painted** (on the left: click a patch to toggle it, drag to paint a rectangle; orange = "
                    "concept, blue = not concept)")
        st.markdown("\n".join(painted_line(im.name, len(p["concept"]), len(p["not"]))
                              for im in ctx.images for p in [painting(im.sha256, c.grid)]))
        st.caption(f"Which patches count: {LABEL_RULE}. Hold-out: {HOLDOUT['images']} when two or more images are "
                   f"painted, else {HOLDOUT['blocks']}.")
        painted, key = painted_set(ctx.images, c.grid)
        run = st.button("Fit the concept's probe on every layer", type="primary", key="concept_fit")
    return painted, key, run


def fit_on_press(ctx, lens, painted: PaintedImages, key: tuple, run: bool):
    """On a press, the probes of every layer fitted (one forward per image); the probe fitted for exactly these
    paintings, or None with the instructions."""
    if run:
        n = len(ctx.images)
        bar = st.progress(0.0, text="Tokens of every layer ...")
        try:
            fit(ctx, lens, painted, key, lambda done: bar.progress(
                done / n, text=f"Tokens: {done} of {counted(n, 'image')} (one forward each)"))
        except VitvizError as exc:
            st.error(str(exc))
        bar.empty()
    concept = fitted(ctx, key)
    if concept is None:
        st.info("Paint some patches of a concept (a click toggles one, a drag paints a rectangle) and press the "
                "button: the model runs once per image and a probe is fitted on every layer's patch tokens."
                + (" The paintings changed since the last fit." if fitted(ctx) is not None else ""))
    return concept


def layer_choice(concept) -> int:
    """The 1-based layer both the accuracy star and the maps follow (default: the first from which the concept is
    readable, else the most accurate, the earliest of equals)."""
    first = concept.readable_from(0.9)
    best = max(concept.layers, key=lambda s: (s.balanced_accuracy, -s.layer)).layer
    return st.slider("Layer (1-based)", 1, concept.num_layers, first or best, key="concept_layer",
                     help="Both the accuracy star and the maps follow this layer.")


def accuracy_title(concept_patches: int, not_concept_patches: int) -> str:
    """The accuracy figure's title with the painted patches counted in words."""
    return (f"From which layer on is the concept readable · {counted(concept_patches, 'concept patch')} and "
            f"{counted(not_concept_patches, 'not-concept patch')}")


def accuracy_section(lens, concept, layer: int) -> None:
    """Balanced accuracy per layer, the chosen layer starred, and from which layer on the concept is readable."""
    title = accuracy_title(sum(im["concept"] for im in concept.images), sum(im["not_concept"] for im in concept.images))
    show_chart(concept_accuracy_figure(concept.table, concept.chance, layer, title),
               "concept_accuracy", file_stem("concept_accuracy", lens.spec.name))
    first = concept.readable_from(0.9)
    st.caption(("Readable (balanced accuracy ≥ 90 %) from layer " + str(first) + " on." if first else
                "No run of layers reaches a balanced accuracy of 90 % to the last layer.")
               + f" Hold-out: {HOLDOUT[concept.holdout]}. Balanced accuracy is the mean of the concept and not-concept "
               "recalls (chance 50 % whatever the concept's share); plain accuracy's chance is the larger class's "
               "share. " + concepts_link("chance"))


def maps_section(ctx, c: Canvas, concept, painted: PaintedImages, layer: int) -> None:
    """The layer's probe's probability on every patch of every image, the current image first."""
    names = c.names
    current = names.index(ctx.image.name) if ctx.image.name in names else 0
    order = [current] + [j for j in range(len(names)) if j != current]
    titles = [f"{names[j]}{' (current)' if j == current else ''}<br>"
              + (f"painted: {concept.images[j]['concept']} concept" if concept.images[j]["concept"] or
                 concept.images[j]["not_concept"] else "not painted: prediction") for j in order]
    maps_fig = concept_maps_figure([c.inputs[j] for j in order], concept.probability[order, layer - 1], titles,
                                   c.layout, painted=[painted.concept[j] for j in order], highlight=0,
                                   title=f"Where the concept fires · the layer-{layer} probe's probability on every "
                                         "image")
    # As wide as its tiles and their colour bar: at the column's width the bar stood ~200 px right of the maps.
    show_chart(maps_fig, "concept_maps", file_stem("concept", c.lens.spec.name, f"layer{layer}"),
               width=panel_width(maps_fig))
    st.caption("One fixed scale, probability 0 to 1 (Viridis), for every image; painted concept patches are outlined "
               "in white. On painted images the map is the probe's fit to its own training patches; on the others it "
               "is a prediction. Hover a patch for its probability.")


def files_section(concept) -> None:
    """The probe's files, and where else it is used."""
    files = concept.files()
    d1, d2, d3 = st.columns(3)
    d1.download_button("probe.safetensors", files["probe.safetensors"], file_name="probe.safetensors",
                       help="weight (L, D), bias (L,): row l-1 is layer l's probe on resid_post patch tokens")
    d2.download_button("probe.json", files["probe.json"], file_name="probe.json", mime="application/json")
    d3.download_button(MAPS, files[MAPS], file_name=MAPS, help="probability (n, L, gh, gw), names, labels")
    st.caption("The Attribution page now offers this concept as its target (the probe's logit summed over the "
               "patches, at a layer you choose): which pixels made it fire.")
