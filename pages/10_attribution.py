"""Attribution: which pixels and patches made the model give its output (AttnLRP, CP-LRP, LeGrad, Grad-CAM)."""
import streamlit as st

from ui.attribution import attributions
from ui.charts import file_stem, show_chart
from ui.downloads import download_row
from ui.repair import repair_view
from ui.state import setup, view_applies
from vitviz.attribution import LABELS, PIXEL_METHODS, methods_for, why_not
from vitviz.attribution_figures import conservation_figure, maps_figure
from vitviz.tokens import top_classes

ctx = setup()
if ctx is None:
    st.stop()
st.header(f"Attribution · {ctx.image.name}")
view_applies(ctx, "attribution")
loaded, r = ctx.loaded, ctx.result
if why_not(loaded.model):
    st.info(why_not(loaded.model))
    st.stop()
st.caption("AttnLRP (Achtibat et al. 2024) and CP-LRP (Ali et al. 2022) propagate the target's value back to the "
           "pixels as a modified gradient (Gradient × Input, lxt's rules); LeGrad (Bousselham et al. 2025) sums "
           "positive gradients through the last two layers' attention maps; Grad-CAM weights the last block's ln1 "
           "activations by their mean gradient (pytorch-grad-cam's ViT recipe).")

available, refused = methods_for(loaded.model)
if any(m not in available for m in st.session_state.get("attr_methods", [])):  # chosen for another model
    st.session_state["attr_methods"] = [m for m in st.session_state["attr_methods"] if m in available]
c1, c2, c3 = st.columns([3, 2, 1])
methods = c1.multiselect("Methods", available, default=[m for m in ("attnlrp", "legrad", "gradcam") if m in available],
                         format_func=LABELS.get, key="attr_methods")
target_class = None
if loaded.has_head:
    top = top_classes(r.logits, k=10, labels=loaded.class_labels)
    label = c2.selectbox("Target class (logit)", [f"{i}: {name} ({p:.1%})" for i, name, p in top],
                         key="attr_target")
    target_class = int(label.split(":")[0])
else:
    c2.markdown("**Target**: this model has no classifier head; the pooled vector's projection on its own "
                "unperturbed direction, s(x) = ⟨p(x), p(x₀)⟩ / ‖p(x₀)‖, is explained.")
pixels = c3.radio("Resolution", ["patches", "pixels"], key="attr_resolution",
                  help="Relevance methods give a value per pixel; the patch map is its sum per patch. LeGrad and "
                       "Grad-CAM give one value per patch.") == "pixels"
for why in refused.values():
    st.caption(why)
if not methods:
    st.info("Choose at least one method.")
    st.stop()

try:
    results = attributions(ctx, methods, target_class)
except ValueError as exc:  # a family whose forward the rules cannot reach yet
    st.info(str(exc))
    st.stop()
target_text = results[0].target.text()
stem = file_stem("attribution", ctx.image.name, "_".join(methods))
show_chart(maps_figure(r.model_input, results, pixels=pixels, target_text=target_text), "attr_maps", stem)
st.caption(f"Target: {target_text}. Signed maps (AttnLRP, CP-LRP, Gradient × Input) use a diverging scale centred on "
           "0 with symmetric limits at the 99th percentile of |relevance| (red raises the target, blue lowers it); "
           "LeGrad and Grad-CAM are non-negative (Inferno from 0). Each map has its own scale: the methods' units "
           "differ.")

relevance = [res for res in results if res.pixels is not None]
if relevance:
    show_chart(conservation_figure(relevance, target_text=target_text), "attr_conservation",
               file_stem("attribution_conservation", ctx.image.name))
    shares = "; ".join(f"{LABELS[res.method]} {c['pixel_share']:.1%}" for res in relevance
                       for c in res.conservation() if c["pixel_share"] is not None)
    st.caption(f"Share of the target's value that reaches the pixels: {shares}. The rest went to the prefix tokens, "
               "the position embedding, biases and (AttnLRP) the softmax: relevance propagation conserves it only "
               "approximately, and this figure says by how much.")

download_row(stem, {f"attribution_{res.method.replace('-', '_')}": res.patches for res in results}
             | {f"attribution_{res.method.replace('-', '_')}_pixels": res.pixels for res in relevance},
             {"image": ctx.image.name, "model": loaded.card().get("spec"), "target": results[0].target.describe(),
              "methods": {m: LABELS[m] for m in methods},
              "conservation": {res.method: res.conservation() for res in relevance}})


# ---- Repair: these attributions before and after (ui/repair.py) ----
def _repair_maps(side):
    kept = [m for m in methods if side.compared.kind != "register" or m in PIXEL_METHODS]
    if side.edit is not None and len(kept) < len(methods):
        st.caption("LeGrad and Grad-CAM read the patch tokens by position and do not know the extra token yet: "
                   "they are left out under the test-time register.")
    return {LABELS[a.method]: a.patches[0] for a in attributions(ctx, kept, target_class, side)}


repair_view(ctx, "attribution", _repair_maps, what=f"Attribution of {target_text} (patch sums)", signed=True)
