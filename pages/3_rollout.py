"""Rollout: attention rollout with its settings, gradient rollout for models with a head, raw attention."""
import streamlit as st

from ui.cache import cached_gradient_rollout, cached_rollout
from ui.downloads import download_row
from ui.state import setup
from vitviz.analysis import AnalysisSettings
from vitviz.figures import attention_overlay
from vitviz.maps import layer_maps
from vitviz.report import overlay
from vitviz.rollout import FUSIONS
from vitviz.tokens import top_classes

ctx = setup()
if ctx is None:
    st.stop()
r, layout = ctx.result, ctx.result.layout
L = r.attention.shape[0]
st.header(f"Attention rollout · {ctx.image.name}")

c1, c2, c3, c4 = st.columns(4)
fusion = c1.selectbox("Head fusion", FUSIONS, key="fusion")
discard = c2.slider("Discard lowest share", 0.0, 0.95, 0.0, 0.05, key="discard")
start, end = c3.slider("Layers", 1, L, (1, L), key="layer_range")
exclude = c4.toggle("Exclude artifact tokens", False, key="exclude",
                    help=f"High-norm tokens (>10x median): {[int(t) for t in r.artifacts] or 'none'}")
opacity = st.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="rollout_opacity")
settings = AnalysisSettings(fusion=fusion, discard=discard, start_layer=start - 1, end_layer=end, exclude_artifacts=exclude)
result = cached_rollout(ctx.spec, ctx.image.sha256, r, settings)

left, right = st.columns(2)
with left:
    depth = st.slider("Show cumulative rollout after layer", start, end, end, key="rollout_depth")
    shown = result.per_layer[depth - start]
    st.plotly_chart(attention_overlay(r.model_input, shown, layout, opacity=opacity, name="rollout",
                                      title=f"rollout, layers {start}–{depth}"), key="rollout_fig")
    st.caption(f"Readout: {result.readout}. Share of the readout's mass on prefix tokens: "
               + ", ".join(f"{k} {v:.1%}" for k, v in result.prefix_share.items()) + ".")
    download_row("rollout", {"rollout": result.map, "rollout_per_layer": result.per_layer},
                 {"image": ctx.image.name, "model": ctx.loaded.card()["spec"], **settings.__dict__,
                  "readout": result.readout, "prefix_share": result.prefix_share}, overlay(r.model_input, shown, opacity))
with right:
    query = "cls" if layout.has_class_token else "mean"
    raw = layer_maps(r.attention, layout, L - 1, query).mean(axis=0)
    st.plotly_chart(attention_overlay(r.model_input, raw, layout, opacity=opacity, name="attention",
                                      title=f"last layer, {query} query, mean over heads"), key="raw_fig")

st.subheader("Class-specific gradient rollout")
if not ctx.loaded.has_head:
    st.info("Gradient rollout needs a classifier head; this model has none. Pick a timm model with a head "
            "(e.g. vit_base_patch16_224.augreg2_in21k_ft_in1k) in the sidebar.")
else:
    top = top_classes(r.logits, k=10)
    label = st.selectbox("Class", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key="target")
    target = int(label.split(":")[0])
    grad_map, _ = cached_gradient_rollout(ctx.spec, ctx.image.sha256, ctx.image.image, target)
    st.plotly_chart(attention_overlay(r.model_input, grad_map, layout, opacity=opacity, name="relevance",
                                      title=f"gradient rollout for class {label}"), key="grad_fig")
    download_row("gradient_rollout", {"gradient_rollout": grad_map}, {"image": ctx.image.name, "target_class": target,
                                                                      "model": ctx.loaded.card()["spec"]})
