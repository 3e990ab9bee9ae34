"""Queries & keys: one head's queries and keys in one picture (AttentionViz), every head of a layer as small
multiples, and heads switched off (ablation) or swapped between two images (patching)."""
import numpy as np
import streamlit as st

import vitviz
from ui.cache import model_run
from ui.charts import file_stem, point_customdata, show_chart
from ui.display import Display, map_figure
from ui.downloads import download_row
from ui.progress import cached, with_progress
from ui.state import setup
from ui.navigation import heading
from vitviz.heads import patching, qk
from vitviz.heads.figures import COLOUR_TEXT, effect_heatmap, position_key, qk_grid, qk_scatter

MAX_IMAGES = 8  # AttentionViz's image set: 8 images
METHODS = {"pca": "PCA (instant)", "tsne": "t-SNE", "umap": "UMAP"}
# The ablations in words (vitviz.heads.patching.ABLATION_TEXT names the edited point as the code does: z).
ABLATION_WORDS = {"zero": "each chosen head's output (its attention-weighted values, before the output projection) set "
                          "to 0",
                  "mean": "each chosen head's output (its attention-weighted values, before the output projection) set "
                          "to its mean over the image set, position by position"}

ctx = setup()
if ctx is None:
    st.stop()
images = ctx.images[:MAX_IMAGES]
names = [im.name for im in images]
heading(__file__, f"{len(images)} image{'s' if len(images) != 1 else ''}")
if ctx.lens.scope == "window":
    st.info(f"{ctx.lens.label} attends within windows: its queries and keys meet only inside one window, so there is "
            "no one picture of a head over an image. This page reads models whose tokens attend to every token.")
    st.stop()
lens = ctx.lens
L, H = lens.num_layers, lens.num_heads
x = lens.preprocess([im.image for im in images])
layout = lens.layout_for(x)
images_key = (ctx.spec, ctx.framing, tuple(im.sha256 for im in images))
st.caption("Each head's queries and keys of every token of the image set, embedded together (AttentionViz, Yeh et "
           "al. 2023): a query lies near the keys it attends to. Keys are first translated by mean(q) − mean(k), then "
           "keys × c and queries / c with c = √(mean‖q‖ / mean‖k‖): both leave every attention row as the model "
           "computes it. " + (f"The first {MAX_IMAGES} images of the set are used." if len(ctx.images) > MAX_IMAGES
                              else "Add images in the sidebar to see a head across images."))

c = st.columns([2, 1, 2, 3])
layer = c[0].slider("Layer", 1, L, L, key="qk_layer") - 1
head = c[1].selectbox("Head", list(range(1, H + 1)), key="qk_head") - 1
projection = c[2].radio("Projection", list(METHODS), format_func=METHODS.get, horizontal=True, key="qk_projection")
colour_by = c[3].radio("Colour by", list(COLOUR_TEXT), format_func=COLOUR_TEXT.get, horizontal=True, key="qk_colour")


def pictures(heads: tuple[int, ...], label: str) -> qk.LayerPictures:
    def compute(progress):
        with model_run():
            return qk.layer_pictures(lens, x, layer, list(heads), projection, progress=progress)
    return with_progress(("qk", *images_key, layer, heads, projection), label, compute)


try:
    one = pictures((head,), f"{METHODS[projection]} of layer {layer + 1}, head {head + 1} …")
except vitviz.VitvizError as exc:
    st.error(str(exc))
    st.stop()
picture = one.pictures[0]
state = st.session_state.get("qk_scatter")
points = state.selection.points if state is not None and state.selection else []
picked = [int(v) for v in point_customdata(points[0])] if points else []
selected = tuple(picked[:3]) if len(picked) >= 3 else None

stem = file_stem("qk", f"layer{layer + 1}", f"head{head + 1}", projection)
left, right = st.columns([3, 1.25])
with left:
    show_chart(qk_scatter(picture, layout, names, colour_by, selected), "qk_scatter", stem, on_select="rerun",
               selection_mode="points")
    bias = one.bias_share[0]
    st.caption(f"Distance–dot correlation over every query–key pair of the same image: {picture.correlation_before:+.3f} "
               f"before the corrections, {picture.correlation_after:+.3f} after (AttentionViz's target: close to −1). "
               f"Translation ‖mean(q) − mean(k)‖ = {picture.translation_norm:.3g}, c = {picture.scale:.4f}. "
               + (f"A bias added to the scores (relative position bias) carries {bias:.0%} of their spread within rows "
                  "and is not in the picture. " if bias > 1e-4 else "No bias is added to the scores: q · k is all of "
                                                                      "them. ")
               + f"{qk.PROJECTION_TEXT[projection]}. Click a point to see its token and its attention.")
with right:
    if colour_by == "position":
        show_chart(position_key(layout), "qk_wheel", "qk_colour_wheel")
    if selected is not None:
        image, token, is_key = selected

        def attention(progress):
            with model_run():
                trace = lens.trace(x.tensor[image:image + 1], keep=[("attn", layer)], stop_after=("attn", layer))
            progress(1, 1)
            return trace["attn", layer][0].float().cpu().numpy()  # (H, N, N)
        attn = with_progress(("qk_attn", *images_key, image, layer), "Attention of that image …", attention)[head]
        row = attn[:, token] if is_key else attn[token]
        patch = token - layout.num_prefix_tokens if token >= layout.num_prefix_tokens else None
        name = layout.token_name(token).split(" (")[0]
        what = (f"the attention {name} receives as a key from each patch query" if is_key else
                f"the attention of {name} as a query over the patches")
        _, fig = map_figure(x.images[image], layout.to_grid(row[layout.patch_slice])[None], layout, Display(),
                            titles=[names[image]], title=f"Head {head + 1}, {name} as a {'key' if is_key else 'query'}",
                            columns=1, query=patch, tile_px=300)
        show_chart(fig, "qk_token_map", file_stem("qk_token", names[image], token))
        st.caption(f"{layout.token_name(token)} of {names[image]}, outlined (prefix tokens have no patch to outline): "
                   f"{what}, as the model computes it (the corrections do not change it).")

st.subheader(f"Every head of layer {layer + 1}")
grid_key = ("qk", *images_key, layer, tuple(range(H)), projection)
if cached(grid_key) is not None or st.button(f"Draw all {H} heads ({METHODS[projection]})", key="qk_grid_button"):
    every = pictures(tuple(range(H)), f"{METHODS[projection]} of every head of layer {layer + 1}:")
    show_chart(qk_grid(every.pictures, layout, names, colour_by), "qk_grid",
               file_stem("qk", f"layer{layer + 1}", "every_head", projection))
    table = every.correlations()
    download_row(file_stem("qk", f"layer{layer + 1}", projection),
                 {"xy": np.stack([p.xy for p in every.pictures]),
                  "correlation_after": np.array([t["correlation_after"] for t in table])},
                 {"images": names, "layer (1-based)": layer + 1, "projection": qk.PROJECTION_TEXT[projection],
                  "correlations (heads 1-based)": table,
                  "xy axes": "(head, point, 2): queries of every image first, then keys; tokens 0-based, prefix first"})
else:
    st.caption("Computed on demand (PCA is instant; t-SNE and UMAP take seconds per head) and kept for this image set "
               "and these settings.")

# ---- Heads switched off or swapped --------------------------------------------------------------------------------
st.subheader("Switch heads off or swap them")
output_text = "the logits" if lens.has_head else "the pooled vector (this model has no classifier)"
action = st.radio("What", ["Ablate", "Patch from the current image"], horizontal=True, key="heads_action")
if action == "Ablate":
    a1, a2 = st.columns([1, 2])
    mode = a1.radio("Ablation", list(patching.ABLATIONS), horizontal=True, key="heads_ablation",
                    help=patching.ABLATION_TEXT["zero"] + "; mean: " + patching.ABLATION_TEXT["mean"] + ".")
    scope = a2.radio("Heads", [f"layer {layer + 1}'s {H} heads", f"every head ({L * H} forwards)"], horizontal=True,
                     key="heads_scope")
    pairs = [(l, h) for l in (range(L) if scope.startswith("every") else [layer]) for h in range(H)]
    key = ("ablate", *images_key, mode, tuple(pairs))
    if cached(key) is not None or st.button("Run the ablations", key="heads_ablate_button"):
        def run_ablation(progress):
            with model_run():
                return patching.ablate(lens, x, pairs, mode, progress=progress)
        effects = with_progress(key, "Ablating head", run_ablation)
        kind = "logit_change" if lens.has_head else "pooled_cosine"
        grids = np.stack([effects.grid(kind, L, H, i) for i in range(len(images))])
        values = grids.mean(0) if lens.has_head else 1.0 - grids.mean(0)
        shown = values if scope.startswith("every") else values[layer:layer + 1]
        fig = effect_heatmap(shown, f"Each head {'zeroed' if mode == 'zero' else 'set to its image-set mean'} alone: "
                             + ("change of the top-1 logit" if lens.has_head else "1 − cosine(pooled after, before)")
                             + f", mean over {len(images)} image(s)", "logit change" if lens.has_head else "1 − cosine",
                             centre=0.0 if lens.has_head else None,
                             first_layer=1 if scope.startswith("every") else layer + 1)
        show_chart(fig, "heads_ablation_map", file_stem("ablation", mode, f"{len(pairs)}heads"))
        st.caption(f"Ablation: {ABLATION_WORDS[mode]}, edited while the model runs (its weights are not changed). "
                   f"Output read: {output_text}.")
        download_row(file_stem("ablation", mode), {kind: grids}, {
            "images": names, "ablation": patching.ABLATION_TEXT[mode], "axes": "(image, layer - 1, head - 1)"})
        strongest = pairs[int(np.nanargmax(np.abs(values[[l for l, _ in pairs], [h for _, h in pairs]])))]
        off = st.selectbox("Maps before and after switching off", pairs, index=pairs.index(strongest),
                           format_func=lambda p: f"layer {p[0] + 1}, head {p[1] + 1}", key="heads_ablate_show")
        current = names.index(ctx.image.name)
        if off[0] == L - 1:
            st.info("A head of the last layer changes no attention map (every layer's attention is computed before "
                    "its heads' output): only the output moves, as the heatmap shows.")
        else:
            shown_layer = off[0] + 1  # the first layer whose attention the ablation can change
            means = patching.head_means(lens, x, [off[0]]) if mode == "mean" else None
            with model_run():
                maps = np.stack([patching.readout_maps(lens, x.tensor[current:current + 1], layer=shown_layer),
                                 patching.readout_maps(lens, x.tensor[current:current + 1],
                                                       patching.ablation_edit([off], mode, means), layer=shown_layer)])
            readout = "CLS" if layout.has_class_token else "mean patch query"
            _, fig = map_figure(x.images[current], maps, layout, Display(scale_mode="shared across heads"),
                                titles=["before", f"layer {off[0] + 1}, head {off[1] + 1} {mode}"],
                                title=f"{ctx.image.name}: layer {shown_layer + 1}'s {readout} attention, mean over "
                                      "heads", columns=2)
            show_chart(fig, "heads_before_after", file_stem("ablation_maps", ctx.image.name, off[0] + 1, off[1] + 1))
            st.caption("One colour scale for both maps, in the layer after the head's. The head with the largest effect "
                       "is picked first.")
else:
    others = [n for n in names if n != ctx.image.name]
    if not others:
        st.info("Patching needs a second image: add one in the sidebar.")
        st.stop()
    target = st.selectbox("Image B (run with the current image's heads)", others, key="heads_patch_b")
    a, b = names.index(ctx.image.name), names.index(target)
    pairs = [(l, h) for l in range(L) for h in range(H)]
    key = ("patch", *images_key, a, b)
    st.caption(f"Image A = {ctx.image.name} (the current image). Each of the {L * H} heads is patched alone: one "
               f"forward of B per head.")
    if cached(key) is not None or st.button(f"Patch every head ({L * H} forwards)", key="heads_patch_button"):
        def run_patching(progress):
            with model_run():
                return patching.patch(lens, x.tensor[a:a + 1], x.tensor[b:b + 1], pairs, progress=progress)
        effects = with_progress(key, "Patching head", run_patching)
        kinds = ["logit_diff_towards_a", "pooled_towards_a"] if lens.has_head else ["pooled_towards_a"]
        for kind in kinds:
            grid = effects.grid(kind, L, H)
            what = ("logit difference (A's top-1 − B's top-1)" if kind.startswith("logit")
                    else "pooled vector, along the line from B's to A's")
            show_chart(effect_heatmap(grid, f"How far {target}'s output moves towards {ctx.image.name}'s when one "
                                            f"head comes from A: {what}", "0 = B, 1 = A"),
                       f"heads_patch_{kind}", file_stem("patching", ctx.image.name, target, kind))
        st.caption("0: B's output unchanged; 1: B's output became A's (the pooled effect is the share of the way from "
                   "B's pooled vector to A's, projected on the line between them).")
        download_row(file_stem("patching", ctx.image.name, target), {k: effects.grid(k, L, H) for k in kinds},
                     {"image_a": ctx.image.name, "image_b": target, "axes": "(layer - 1, head - 1)"})
