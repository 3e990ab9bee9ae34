"""Attribution: which pixels and patches made the model give its output (AttnLRP, CP-LRP, LeGrad, Grad-CAM)."""
import streamlit as st

from ui.attribution import (attribution_methods, attributions, keep_available, label, overlay_choices,
                            repair_maps_of, scale_caption, target_picker, target_title)
from ui.charts import file_stem, show_chart
from ui.concepts import concept_refusals, concept_target_picker
from ui.display import TILE_PX, display_controls
from ui.downloads import download_row
from ui.paper import paper_downloads
from ui.repair import repair_view
from ui.state import setup, view_applies
from ui.navigation import heading
from vitviz.errors import VitvizError
from vitviz.explainers.base import why_not_attribution
from vitviz.figures.attribution_figures import attribution_groups, conservation_figure, maps_figure
from vitviz.figures.paper_figure import paper_figure
from vitviz.explainers import registered

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
view_applies(ctx, "attribution")
loaded, r = ctx.loaded, ctx.result
if why_not_attribution(ctx.lens.model):
    st.info(why_not_attribution(ctx.lens.model))
    st.stop()
st.caption("AttnLRP (Achtibat et al. 2024) and CP-LRP (Ali et al. 2022) propagate the target's value back to the "
           "pixels as a modified gradient (Gradient × Input, lxt's rules); LeGrad (Bousselham et al. 2025) sums "
           "positive gradients through the last two layers' attention maps; Grad-CAM weights the last block's ln1 "
           "activations by their mean gradient (pytorch-grad-cam's ViT recipe).")
if ctx.lens.scope == "window":
    st.caption("Window attention (Swin): LeGrad takes the target's own gradient through each block's window attention "
               "(mean over the queries sharing the key's window), each later stage's map spread over the patches its "
               "tokens merge; Grad-CAM is pytorch-grad-cam's Swin recipe on the last stage's coarser grid, brought to "
               "the patches bilinearly. Every map is drawn on the stage-1 patches.")

c1, c2, c3 = st.columns([3, 2, 1])
concept = concept_target_picker(ctx, c2, "attr_concept")
available, refused = attribution_methods(ctx.lens)
if concept is not None:  # LeGrad scores the model's output; Grad-CAM reads the last block, after an earlier concept
    refused |= concept_refusals(concept, ctx.lens, available)
    available = [m for m in available if m not in refused]
keep_available("attr_methods", available)  # chosen for another model or target
methods = c1.multiselect("Methods", available, default=[m for m in ("attnlrp", "legrad", "gradcam") if m in available],
                         format_func=label, key="attr_methods")
target_class = target_picker(ctx, c2, "attr_target") if concept is None else None
pixels = c3.radio("Resolution", ["patches", "pixels"], key="attr_resolution",
                  help="Relevance methods give a value per pixel; the patch map is its sum per patch. LeGrad and "
                       "Grad-CAM give one value per patch.") == "pixels"
for why in refused.values():
    st.caption(why)
if not methods:
    st.info("Choose at least one method.")
    st.stop()

try:
    results = attributions(ctx, methods, target_class, concept=concept)
except VitvizError as exc:  # a family whose forward the rules cannot reach yet
    st.info(str(exc))
    st.stop()
target_text = target_title(results[0].target)
stem = file_stem("attribution", ctx.image.name, "_".join(methods))
display = display_controls()
maps_fig = maps_figure(r.model_input, results, pixels=pixels, target_text=target_text, plot_height=TILE_PX + 40,
                       padding=display.padding, **overlay_choices(display))
show_chart(maps_fig, "attr_maps", stem, width=maps_fig.layout.width)  # each colour bar beside its map
st.caption(scale_caption(target_text, methods))
with st.expander("Figure for a paper (these methods side by side, PNG / SVG / PDF)"):
    choices = overlay_choices(display) | ({"style": "transparent where low"} if display.style == "DINO mask" else {})
    st.caption("The model input, then the methods' patch maps side by side: the signed relevance methods (AttnLRP, "
               "CP-LRP, Gradient × Input: the target's value in the same units) on one symmetric scale and one bar; "
               "LeGrad and Grad-CAM (units of their own) each on its own scale from 0. Each group's limits are stated "
               "under the figure.")
    paper_downloads(file_stem("attribution_figure", ctx.image.name, "_".join(methods)),
                    lambda: paper_figure(r.model_input, attribution_groups(results),
                                         title=f"{ctx.image.name}: attribution of the {target_title(results[0].target)}",
                                         arrange="across", with_input=True, **choices))

relevance = [res for res in results if res.pixels is not None]
if relevance:
    show_chart(conservation_figure(relevance, target_text=target_text), "attr_conservation",
               file_stem("attribution_conservation", ctx.image.name))
    shares = "; ".join(f"{label(res.method)} {c['pixel_share']:.1%}" for res in relevance
                       for c in res.conservation() if c["pixel_share"] is not None)
    st.caption(f"Share of the target's value that reaches the pixels: {shares}. The rest went to the prefix tokens, "
               "the position embedding, biases and (AttnLRP) the softmax: relevance propagation conserves it only "
               "approximately, and this figure says by how much.")

download_row(stem, {f"attribution_{res.method.replace('-', '_')}": res.patches for res in results}
             | {f"attribution_{res.method.replace('-', '_')}_pixels": res.pixels for res in relevance},
             {"image": ctx.image.name, "model": loaded.card().get("spec"), "target": results[0].target.describe(),
              "methods": {m: label(m) for m in methods},
              "conservation": {res.method: res.conservation() for res in relevance}})


# ---- Repair: these attributions before and after (ui/repair.py) ----
if concept is None:
    repair_view(ctx, "attribution", repair_maps_of(ctx, methods, target_class), what=f"Attribution of {target_text} (patch sums)",
                value_name="relevance", signed=[label(m) for m in methods if registered()[m].signed],
                padding=display.padding)
else:
    st.caption("Repairs (before and after) compare the model's own target; choose it above to see them.")
