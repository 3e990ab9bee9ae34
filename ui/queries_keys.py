"""The Queries & keys page's sections: the image set it reads (:func:`qk_inputs`), the head and projection
(:func:`choose`), one head's queries and keys with a clicked token's attention (:func:`scatter_section`), every head
of the layer (:func:`grid_section`), and heads switched off (:func:`ablation_section`) or swapped between two images
(:func:`patching_section`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui.cache import model_run
from ui.charts import file_stem, point_customdata, show_chart
from ui.display import Display, map_figure
from ui.downloads import download_row
from ui.progress import cached, with_progress
from ui.words import counted
from vitviz.errors import VitvizError
from vitviz.heads import patching, qk
from vitviz.heads.ablation_summary import summarise_ablation
from vitviz.heads.figures import COLOUR_TEXT, effect_heatmap, position_key, qk_grid, qk_scatter

MAX_IMAGES = 8  # AttentionViz's image set: 8 images
METHODS = {"pca": "PCA (instant)", "tsne": "t-SNE", "umap": "UMAP"}
# The ablations in words (vitviz.heads.patching.ABLATION_TEXT names the edited point as the code does: z).
ABLATION_WORDS = {"zero": "each chosen head's output (its attention-weighted values, before the output projection) set "
                          "to 0",
                  "mean": "each chosen head's output (its attention-weighted values, before the output projection) set "
                          "to its mean over the image set, position by position"}


@dataclass
class QKInputs:
    """The first :data:`MAX_IMAGES` of the sidebar's images as the model takes them, and their cache identity."""
    ctx: object
    images: list
    names: list[str]
    x: object  # the ModelInput of ``images``
    layout: object
    key: tuple  # (spec, framing, the images' SHA-256s): the start of every cache key here

    @property
    def lens(self):
        return self.ctx.lens


def qk_inputs(ctx) -> QKInputs:
    images = ctx.images[:MAX_IMAGES]
    x = ctx.lens.preprocess([im.image for im in images])
    return QKInputs(ctx, images, [im.name for im in images], x, ctx.lens.layout_for(x),
                    (ctx.spec, ctx.framing, tuple(im.sha256 for im in images)))


def heading_text(ctx) -> str:
    """The heading's subject: how many images the page reads ("1 image", "8 images")."""
    return counted(len(ctx.images[:MAX_IMAGES]), "image")


def windows_note(ctx) -> bool:
    """For a model that attends within windows (Swin), the sentence why this page does not read it: True if shown."""
    if ctx.lens.scope != "window":
        return False
    st.info(f"{ctx.lens.label} attends within windows: its queries and keys meet only inside one window, so there is "
            "no one picture of a head over an image. This page reads models whose tokens attend to every token.")
    return True


def intro(ctx) -> None:
    st.caption("Each head's queries and keys of every token of the image set, embedded together (AttentionViz, Yeh et "
               "al. 2023): a query lies near the keys it attends to. Keys are first translated by mean(q) − mean(k), "
               "then keys × c and queries / c with c = √(mean‖q‖ / mean‖k‖): both leave every attention row as the "
               "model computes it. " + (f"The first {MAX_IMAGES} images of the set are used."
                                        if len(ctx.images) > MAX_IMAGES
                                        else "Add images in the sidebar to see a head across images."))


@dataclass
class QKChoice:
    """The layer and head (0-based), the 2-D projection and what colours the points."""
    layer: int
    head: int
    projection: str
    colour_by: str


def choose(lens) -> QKChoice:
    c = st.columns([2, 1, 2, 3])
    layer = c[0].slider("Layer", 1, lens.num_layers, lens.num_layers, key="qk_layer") - 1
    head = c[1].selectbox("Head", list(range(1, lens.num_heads + 1)), key="qk_head") - 1
    projection = c[2].radio("Projection", list(METHODS), format_func=METHODS.get, horizontal=True,
                            key="qk_projection")
    colour_by = c[3].radio("Colour by", list(COLOUR_TEXT), format_func=COLOUR_TEXT.get, horizontal=True,
                           key="qk_colour")
    return QKChoice(layer, head, projection, colour_by)


def _pictures(inp: QKInputs, c: QKChoice, heads: tuple[int, ...], label: str) -> qk.LayerPictures:
    def compute(progress):
        with model_run():
            return qk.layer_pictures(inp.lens, inp.x, c.layer, list(heads), c.projection, progress=progress)
    return with_progress(("qk", *inp.key, c.layer, heads, c.projection), label, compute)


def _selected_token() -> tuple[int, int, bool] | None:
    """The clicked point of the scatter: (image, token, is_key), or None."""
    state = st.session_state.get("qk_scatter")
    points = state.selection.points if state is not None and state.selection else []
    picked = [int(v) for v in point_customdata(points[0])] if points else []
    return tuple(picked[:3]) if len(picked) >= 3 else None


def _scatter_caption(one: qk.LayerPictures, projection: str) -> str:
    picture, bias = one.pictures[0], one.bias_share[0]
    return (f"Distance–dot correlation over every query–key pair of the same image: {picture.correlation_before:+.3f} "
            f"before the corrections, {picture.correlation_after:+.3f} after (AttentionViz's target: close to −1). "
            f"Translation ‖mean(q) − mean(k)‖ = {picture.translation_norm:.3g}, c = {picture.scale:.4f}. "
            + (f"A bias added to the scores (relative position bias) carries {bias:.0%} of their spread within rows "
               "and is not in the picture. " if bias > 1e-4 else "No bias is added to the scores: q · k is all of "
                                                                   "them. ")
            + f"{qk.PROJECTION_TEXT[projection]}. Click a point to see its token and its attention.")


def _token_attention(inp: QKInputs, c: QKChoice, selected: tuple[int, int, bool]) -> None:
    """The clicked token's attention row (as a query) or column (as a key) over the patches of its image."""
    image, token, is_key = selected
    layout, lens, layer = inp.layout, inp.lens, c.layer

    def attention(progress):
        with model_run():
            trace = lens.trace(inp.x.tensor[image:image + 1], keep=[("attn", layer)], stop_after=("attn", layer))
        progress(1, 1)
        return trace["attn", layer][0].float().cpu().numpy()  # (H, N, N)
    attn = with_progress(("qk_attn", *inp.key, image, layer), "Attention of that image …", attention)[c.head]
    row = attn[:, token] if is_key else attn[token]
    patch = token - layout.num_prefix_tokens if token >= layout.num_prefix_tokens else None
    name = layout.token_name(token).split(" (")[0]
    what = (f"the attention {name} receives as a key from each patch query" if is_key else
            f"the attention of {name} as a query over the patches")
    _, fig = map_figure(inp.x.images[image], layout.patch_grid(row)[None], layout, Display(),
                        titles=[inp.names[image]],
                        title=f"Head {c.head + 1}, {name} as a {'key' if is_key else 'query'}",
                        columns=1, query=patch, tile_px=300)
    show_chart(fig, "qk_token_map", file_stem("qk_token", inp.names[image], token))
    st.caption(f"{layout.token_name(token)} of {inp.names[image]}, outlined (prefix tokens have no patch to outline): "
               f"{what}, as the model computes it (the corrections do not change it).")


def scatter_section(inp: QKInputs, c: QKChoice) -> bool:
    """One head's queries and keys in one picture; a clicked point's attention beside it. False (the error said)
    when the projection failed."""
    try:
        one = _pictures(inp, c, (c.head,), f"{METHODS[c.projection]} of layer {c.layer + 1}, head {c.head + 1} …")
    except VitvizError as exc:
        st.error(str(exc))
        return False
    selected = _selected_token()
    stem = file_stem("qk", f"layer{c.layer + 1}", f"head{c.head + 1}", c.projection)
    left, right = st.columns([3, 1.25])
    with left:
        show_chart(qk_scatter(one.pictures[0], inp.layout, inp.names, c.colour_by, selected), "qk_scatter", stem,
                   on_select="rerun", selection_mode="points")
        st.caption(_scatter_caption(one, c.projection))
    with right:
        if c.colour_by == "position":
            show_chart(position_key(inp.layout), "qk_wheel", "qk_colour_wheel")
        if selected is not None:
            _token_attention(inp, c, selected)
    return True


def grid_section(inp: QKInputs, c: QKChoice) -> None:
    """Every head of the layer as small multiples, on a press (then kept), with its correlations to download."""
    H = inp.lens.num_heads
    st.subheader(f"Every head of layer {c.layer + 1}")
    grid_key = ("qk", *inp.key, c.layer, tuple(range(H)), c.projection)
    if cached(grid_key) is None and not st.button(f"Draw all {counted(H, 'head')} ({METHODS[c.projection]})",
                                                  key="qk_grid_button"):
        st.caption("Computed on demand (PCA is instant; t-SNE and UMAP take seconds per head) and kept for this image "
                   "set and these settings.")
        return
    every = _pictures(inp, c, tuple(range(H)), f"{METHODS[c.projection]} of every head of layer {c.layer + 1}:")
    show_chart(qk_grid(every.pictures, inp.layout, inp.names, c.colour_by), "qk_grid",
               file_stem("qk", f"layer{c.layer + 1}", "every_head", c.projection))
    table = every.correlations()
    download_row(file_stem("qk", f"layer{c.layer + 1}", c.projection),
                 {"xy": np.stack([p.xy for p in every.pictures]),
                  "correlation_after": np.array([t["correlation_after"] for t in table])},
                 {"images": inp.names, "layer (1-based)": c.layer + 1, "projection": qk.PROJECTION_TEXT[c.projection],
                  "correlations (heads 1-based)": table,
                  "xy axes": "(head, point, 2): queries of every image first, then keys; tokens 0-based, prefix first"})


def action() -> str:
    """"Ablate" or "Patch from the current image", under its subheading."""
    st.subheader("Switch heads off or swap them")
    return st.radio("What", ["Ablate", "Patch from the current image"], horizontal=True, key="heads_action")


def _output_text(lens) -> str:
    return "the logits" if lens.has_head else "the pooled vector (this model has no classifier)"


def ablation_title(mode: str, has_head: bool, images: int) -> str:
    """The ablation heatmap's title: what was done, the effect read, and over how many images."""
    return (f"Each head {'zeroed' if mode == 'zero' else 'set to its image-set mean'} alone: "
            + ("change of the top-1 logit" if has_head else "1 − cosine(pooled after, before)")
            + f", mean over {counted(images, 'image')}")


def _before_after(inp: QKInputs, mode: str, pairs: list, strongest: tuple[int, int]) -> None:
    """The current image's readout attention in the layer after a chosen head's, before and after switching it
    off."""
    lens, layout, ctx = inp.lens, inp.layout, inp.ctx
    off = st.selectbox("Maps before and after switching off", pairs, index=pairs.index(strongest),
                       format_func=lambda p: f"layer {p[0] + 1}, head {p[1] + 1}", key="heads_ablate_show")
    current = inp.names.index(ctx.image.name)
    if off[0] == lens.num_layers - 1:
        st.info("A head of the last layer changes no attention map (every layer's attention is computed before "
                "its heads' output): only the output moves, as the heatmap shows.")
        return
    shown_layer = off[0] + 1  # the first layer whose attention the ablation can change
    means = patching.head_means(lens, inp.x, [off[0]]) if mode == "mean" else None
    one = inp.x.tensor[current:current + 1]
    with model_run():
        maps = np.stack([patching.readout_maps(lens, one, layer=shown_layer),
                         patching.readout_maps(lens, one, patching.ablation_edit([off], mode, means),
                                               layer=shown_layer)])
    readout = "CLS" if layout.has_class_token else "mean patch query"
    _, fig = map_figure(inp.x.images[current], maps, layout, Display(scale_mode="shared across heads"),
                        titles=["before", f"layer {off[0] + 1}, head {off[1] + 1} {mode}"],
                        title=f"{ctx.image.name}: layer {shown_layer + 1}'s {readout} attention, mean over heads",
                        columns=2)
    show_chart(fig, "heads_before_after", file_stem("ablation_maps", ctx.image.name, off[0] + 1, off[1] + 1))
    st.caption("One colour scale for both maps, in the layer after the head's. The head with the largest effect "
               "is picked first.")


def ablation_section(inp: QKInputs, c: QKChoice) -> None:
    """Each head of the layer (or of the model) switched off alone: the output's change as a heatmap, on a press
    (then kept), and the maps before and after switching one off."""
    lens = inp.lens
    L, H = lens.num_layers, lens.num_heads
    a1, a2 = st.columns([1, 2])
    mode = a1.radio("Ablation", list(patching.ABLATIONS), horizontal=True, key="heads_ablation",
                    help=patching.ABLATION_TEXT["zero"] + "; mean: " + patching.ABLATION_TEXT["mean"] + ".")
    scope = a2.radio("Heads", [f"layer {c.layer + 1}'s {counted(H, 'head')}", f"every head ({L * H} forwards)"],
                     horizontal=True, key="heads_scope")
    every = scope.startswith("every")
    pairs = [(l, h) for l in (range(L) if every else [c.layer]) for h in range(H)]
    key = ("ablate", *inp.key, mode, tuple(pairs))
    if cached(key) is None and not st.button("Run the ablations", key="heads_ablate_button"):
        return

    def run_ablation(progress):
        with model_run():
            return patching.ablate(lens, inp.x, pairs, mode, progress=progress)
    effects = with_progress(key, "Ablating head", run_ablation)
    s = summarise_ablation(effects, lens.has_head, L, H, len(inp.images), pairs)
    fig = effect_heatmap(s.values if every else s.values[c.layer:c.layer + 1],
                         ablation_title(mode, lens.has_head, len(inp.images)),
                         "logit change" if lens.has_head else "1 − cosine", centre=0.0 if lens.has_head else None,
                         first_layer=1 if every else c.layer + 1)
    show_chart(fig, "heads_ablation_map", file_stem("ablation", mode, f"{len(pairs)}heads"))
    st.caption(f"Ablation: {ABLATION_WORDS[mode]}, edited while the model runs (its weights are not changed). "
               f"Output read: {_output_text(lens)}.")
    download_row(file_stem("ablation", mode), {s.kind: s.grids}, {
        "images": inp.names, "ablation": patching.ABLATION_TEXT[mode], "axes": "(image, layer - 1, head - 1)"})
    _before_after(inp, mode, pairs, s.strongest)


def patching_section(inp: QKInputs) -> None:
    """Each head patched alone from the current image (A) into another (B): how far B's output moves towards A's,
    on a press (then kept)."""
    lens, ctx, names = inp.lens, inp.ctx, inp.names
    L, H = lens.num_layers, lens.num_heads
    others = [n for n in names if n != ctx.image.name]
    if not others:
        st.info("Patching needs a second image: add one in the sidebar.")
        return
    target = st.selectbox("Image B (run with the current image's heads)", others, key="heads_patch_b")
    a, b = names.index(ctx.image.name), names.index(target)
    pairs = [(l, h) for l in range(L) for h in range(H)]
    key = ("patch", *inp.key, a, b)
    st.caption(f"Image A = {ctx.image.name} (the current image). Each of the {counted(L * H, 'head')} is patched "
               "alone: one forward of B per head.")
    if cached(key) is None and not st.button(f"Patch every head ({L * H} forwards)", key="heads_patch_button"):
        return

    def run_patching(progress):
        with model_run():
            return patching.patch(lens, inp.x.tensor[a:a + 1], inp.x.tensor[b:b + 1], pairs, progress=progress)
    effects = with_progress(key, "Patching head", run_patching)
    kinds = ["logit_diff_towards_a", "pooled_towards_a"] if lens.has_head else ["pooled_towards_a"]
    for kind in kinds:
        what = ("logit difference (A's top-1 − B's top-1)" if kind.startswith("logit")
                else "pooled vector, along the line from B's to A's")
        show_chart(effect_heatmap(effects.grid(kind, L, H), f"How far {target}'s output moves towards "
                                  f"{ctx.image.name}'s when one head comes from A: {what}", "0 = B, 1 = A"),
                   f"heads_patch_{kind}", file_stem("patching", ctx.image.name, target, kind))
    st.caption("0: B's output unchanged; 1: B's output became A's (the pooled effect is the share of the way from "
               "B's pooled vector to A's, projected on the line between them).")
    download_row(file_stem("patching", ctx.image.name, target), {k: effects.grid(k, L, H) for k in kinds},
                 {"image_a": ctx.image.name, "image_b": target, "axes": "(layer - 1, head - 1)"})
