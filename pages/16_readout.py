"""Readout: what each head, MLP and patch wrote into the answer (direct contributions that add up to the model's own
logit), the head read after every block (logit lens), and each head named by the classes it writes toward."""
import numpy as np
import streamlit as st

from ui.attribution import target_picker, target_title
from ui.charts import file_stem, point_customdata, show_chart
from ui.display import display_controls, map_figure
from ui.downloads import download_row
from ui.readout import (image_patch_lens, image_readout, set_head_names, set_logit_lens, set_textspan,
                        set_tuned_lens)
from ui.model_box import APP_GIVE_A_HEAD
from ui.state import setup
from ui.navigation import heading
from vitviz import residual
from vitviz.errors import VitvizError
from vitviz.figures.core import panel_width
from vitviz.figures.readout_figures import component_bars, contribution_heatmap, lens_classes, logit_lens_figure

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
st.caption("The last block's output is a sum — the "
           "embedding, every head's share of its block's output projection, every attention bias and MLP — and with "
           "the final norm's scale frozen at this image's own value the head reading it is linear, so the target "
           "splits exactly into those parts plus a constant (the norms' and the head's biases). The parts add up to the "
           "model's own value. Layers and heads count from 1 here, from 0 in the downloads.")
why = residual.why_not(ctx.lens)
if why:
    st.info(why)
    st.stop()

c1, c2 = st.columns([2, 3])
has_text = ctx.lens.has_text
text = c1.text_input("Text (CLIP: split the image–text score for it)", "a photo of a cat", key="readout_text",
                     help="CLIP's score logit_scale.exp() · cos(image, text), the image embedding's norm frozen at "
                          "this image's own value.") if has_text else None
target_class = None if has_text else target_picker(ctx, c1, "readout_target", say_headless=False)
try:
    r = image_readout(ctx, target_class, text or None)
except VitvizError as exc:
    st.info(str(exc))
    st.stop()
what = target_title(r.target)
target_box = c2 if has_text or ctx.lens.has_head else st  # a headless model picks nothing: the line spans the page
target_box.markdown(f"**Target:** {what} = **{r.total[0]:.4g}** (the model's own value); the parts below add up to "
                    f"{r.parts_sum[0]:.4g}.")

names = None
if ctx.lens.has_head and st.session_state.get("readout_names"):
    try:
        table = set_head_names(ctx)
    except VitvizError as exc:
        st.info(str(exc))
        table = None
    if table is not None:
        names = residual.first_names(table, *r.heads.shape[1:])

state = st.session_state.get("readout_heatmap")
points = state.selection.points if state is not None and state.selection else []
picked = [int(v) for v in point_customdata(points[0])] if points else []
top_layer, top_head, _ = r.top_heads(1)[0]
layer, head = (picked[0], picked[1]) if len(picked) == 2 else (top_layer, top_head)

unit = "score" if text else "logit" if ctx.lens.has_head else "projection"
left, right = st.columns([3, 2])
with left:
    show_chart(contribution_heatmap(r.heads[0], f"contribution ({unit})", selected=(layer, head), names=names),
               "readout_heatmap", file_stem("readout_heads", ctx.image.name), on_select="rerun",
               selection_mode="points")
with right:
    show_chart(component_bars(r.heads_per_layer(0), r.attn_bias[0], r.mlp[0], float(r.embed[0]), float(r.bias[0]),
                              f"contribution ({unit})"), "readout_bars", file_stem("readout_components", ctx.image.name))
order = r.top_heads(3, image=0)
st.caption("Red raises the target, blue lowers it; limits ± the 95th percentile of |value| over the heads, the heads "
           "beyond drawn in the end colour and marked ▲ / ▼. Largest heads: "
           + ", ".join(f"layer {l + 1} head {h + 1} ({v:+.3g})" for l, h, v in order)
           + ". Click a cell to see what that head moved from each patch.")
if ctx.lens.has_head:
    st.toggle("Name each head by the classes it writes toward (over the image set)", key="readout_names",
              help="Each head's direct contribution to every class's logit, averaged over the sidebar's images and "
                   "taken relative to its mean over the classes; the top class shows in the heatmap's hover.")

display = display_controls()
maps = r.patch_maps()[0, layer, head][None]
rendered, fig = map_figure(ctx.result.model_input, maps, r.layout, display, signed=True,
                           titles=[f"layer {layer + 1}, head {head + 1}"], value_name=f"contribution ({unit})",
                           title="What this head moved from each patch into the target")
show_chart(fig, "readout_patches", file_stem("readout_patches", ctx.image.name, f"layer{layer + 1}",
                                             f"head{head + 1}"), vector=False, width=panel_width(fig))
from_patches, from_prefix = r.source_split(layer, head)
st.caption(f"The head's contribution {r.heads[0, layer, head]:+.4g} split by the token it read from (its attention "
           f"weight times that token's value, through the frozen readout); the patches hold "
           f"{from_patches:+.4g}, the prefix tokens ({', '.join(r.layout.prefix_tokens)}) "
           f"{from_prefix:+.4g}. Diverging colours centred on 0, limits ± the 99th percentile of |value|.")

if has_text:
    st.subheader("TextSpan: each late head in words")
    st.caption("Over the sidebar's images, each head of the last four blocks writes a vector into CLIP's joint space; "
               "TextSpan (Gandelsman et al., ICLR 2024) picks, one after another, the description whose direction "
               "explains the most of that head's variance over the images and removes it. vitviz's own descriptions "
               "(objects, colours, materials, textures, shapes, counts, positions, scenes, styles). The paper uses "
               "thousands of images: with a few, read the names as hints.")
    if len(ctx.images) < 2:
        st.info("Add at least one more image in the sidebar: TextSpan reads how a head's output varies over images.")
    elif st.button("Name the late heads in words (TextSpan)", key="readout_textspan"):
        spans = set_textspan(ctx)
        shown = spans.assign(layer=spans.layer + 1, head=spans["head"] + 1).rename(columns={
            "variance_explained": "variance explained", "head_variance": "head's variance"})
        st.dataframe(shown, hide_index=True, width="stretch")

st.subheader("Logit lens: the head read after every block")
if not ctx.lens.has_head:
    st.info(residual.logit_lens_why_not(ctx.lens, APP_GIVE_A_HEAD))
else:
    lens_result = set_logit_lens(ctx)
    index = next((i for i, im in enumerate(ctx.images) if im.sha256 == ctx.image.sha256), 0)
    scope = st.radio("Images", ["this image", "mean over the image set"], horizontal=True, key="readout_lens_scope")
    shown, logits = lens_result.of(index if scope == "this image" else None)
    classes = lens_classes(logits)
    labels = [lens_result.label(c) for c in classes]
    show_chart(logit_lens_figure(shown[:, classes], classes, labels,
                                 f"Probability of each class read after every block ({scope})"),
               "readout_lens", file_stem("logit_lens", ctx.image.name if scope == "this image" else "set"))
    st.caption("Each row applies the model's own final norm and head to that block's output; the last row is the "
               "model's prediction. The columns are the final top class and each layer's top two.")

    st.markdown("**Which class each patch says, block by block**")
    per_patch = image_patch_lens(ctx)
    p1, p2 = st.columns([1, 2])
    lens_layer = p1.slider("Block", 1, per_patch.logits.shape[1], per_patch.logits.shape[1], key="readout_patch_layer") - 1
    lens_class = p2.selectbox("Class", classes, format_func=lambda c: f"{c}: {lens_result.label(c)}",
                              key="readout_patch_class")
    patch_probs = per_patch.patch_probabilities(lens_layer, lens_class, r.layout)
    _, patch_fig = map_figure(ctx.result.model_input, patch_probs, r.layout, display,
                              titles=[f"block {lens_layer + 1}: {lens_result.label(lens_class)}"],
                              value_name="probability", title="Each patch's token read alone through the head")
    show_chart(patch_fig, "readout_patch_lens", file_stem("patch_lens", ctx.image.name, f"block{lens_layer + 1}"),
               vector=False, width=panel_width(patch_fig))
    st.caption("Every patch's token at that block read alone through the final norm and the head (as if every "
               "token were that one): the probability it gives the class. The Display box sets the colour scale.")

    with st.expander("Tuned lens: one affine map per block, fitted on the image set"):
        st.caption("Belrose et al. (2023) fit a map per block that carries its tokens toward the last block's before "
                   "the head reads them; here each map is a ridge least-squares fit on the sidebar's images, a quarter "
                   "of them held out, and the table says how well each block's plain and tuned readings agree with "
                   "the model on the held-out images (KL divergence to the final distribution, nats; share of images "
                   "whose top class the block already gives).")
        if len(ctx.images) < 2:
            st.info("Add at least one more image in the sidebar: the tuned lens needs one to fit and one to check.")
        elif st.button("Fit the tuned lens", key="readout_tuned"):
            tuned = set_tuned_lens(ctx)
            fit = tuned.fit.assign(layer=tuned.fit.layer + 1).rename(columns={
                "layer": "block", "kl_plain": "KL plain (nats)", "kl_tuned": "KL tuned (nats)",
                "top1_plain": "top-1 plain", "top1_tuned": "top-1 tuned", "images_fit": "images fitted",
                "images_held_out": "images held out"})
            st.dataframe(fit, hide_index=True, width="stretch")

settings = {"image": ctx.image.name, "model": ctx.loaded.card().get("spec"), "target": r.target.describe(),
            "indices": "layer and head 0-based in the arrays (1-based on screen)",
            "definition": "target = embed + sum of heads + attention biases + MLPs + constant, the final norm's scale "
                          "frozen at the image's own value",
            "total": float(r.total[0]), "parts_sum": float(r.parts_sum[0]),
            "selected": {"layer": layer + 1, "head": head + 1, "indices": "1-based"}}
download_row(file_stem("readout_table", ctx.image.name), r.table(), None)
download_row(file_stem("readout", ctx.image.name),
             {"heads": r.heads[0], "attn_bias": r.attn_bias[0], "mlp": r.mlp[0], "embed": r.embed,
              "constant": r.bias, "total": r.total, "head_patches": r.patch_maps()[0].astype(np.float32)}, settings)
