"""The Compare models page's layer-similarity section: :func:`vitviz.similarity` over the sidebar's images, drawn as
the layer x layer CKA map and its diagonal, with the table as CSV."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from ui.cache import _model_run, model_run, store
from ui.charts import file_stem, point_customdata, show_chart
from ui.downloads import download_row
from ui.guard import guarded
from ui.progress import cached, with_progress
from ui.words import counted
from vitviz.analyses.clusters import K_RANGE, token_clusters
from vitviz.errors import VitvizError
from vitviz.figures.explain_figures import cluster_figure
from vitviz.figures.similarity_figures import cka_diagonal, cka_heatmap, median_interval_width
from vitviz.lens import Lens
from vitviz.runs.layer_features import POOLINGS, TOKEN_POINTS, CNNFeatures, LensFeatures, is_cnn_name, layer_tokens
from vitviz.runs.similarity_run import MIN_BATCH, similarity
from vitviz.sources.names import canonical_model_name

BATCH_SIZE = 32


def _other_side(ctx, name: str):
    """The second model: a timm CNN's stages, or a ViT loaded as the sidebar's is (same device and precision)."""
    if is_cnn_name(name):
        return store().get_or_compute(("cnn", name, ctx.spec.device),
                                      lambda: CNNFeatures.open(name, device=ctx.spec.device))
    from ui.cache import cached_lens

    return cached_lens(replace(ctx.spec, name=name, checkpoint=None, labels=None, head=None))


def similarity_section(ctx) -> None:
    st.subheader("Layer similarity (CKA)")
    st.caption("How each layer's representation of the images relates to every other layer's, within the model or "
               "against a second one (Kornblith et al. 2019; Raghu et al. 2021 compare ViTs and ResNets this way): "
               "1 = the same up to rotation and scale, 0 = unrelated. Minibatch CKA with the unbiased HSIC "
               "(Nguyen, Raghu & Kornblith 2021), over the sidebar's images.")
    if ctx is None:
        st.info("Add images in the sidebar: CKA compares layers over an image set.")
        return
    if len(ctx.images) < MIN_BATCH:
        st.info(f"CKA needs {MIN_BATCH} or more images (the sidebar holds {counted(len(ctx.images), 'image')}): add "
                "images in the sidebar. More images give a narrower interval.")
        return
    c1, c2, c3 = st.columns([2, 1, 2])
    other = c1.text_input("Compare with", key="cka_other", placeholder="the same model (within-model map)",
                          help="Another model as the sidebar takes it (a timm name, a transformers folder), or a timm "
                               "CNN such as resnet50 or convnext_tiny whose weights are on this machine: its stages "
                               "are compared. Empty: the sidebar's model against itself.").strip()
    point = c2.selectbox("Point", TOKEN_POINTS[1:], index=TOKEN_POINTS[1:].index("resid_post"), key="cka_point",
                         help="The ViT's token point read in every block (resid_post: each block's output).")
    pooling = c3.radio("Features per image", list(POOLINGS), horizontal=True, key="cka_pooling",
                       help="; ".join(f"{k}: {v}" for k, v in POOLINGS.items()))
    name_a = canonical_model_name(ctx.spec.name)
    name_b = canonical_model_name(other) if other else name_a
    key = ("cka", ctx.spec, other, point, pooling, tuple(im.sha256 for im in ctx.images))
    button = st.empty()  # emptied once the map is computed: the clicked button does not stay above it
    label = f"Compute CKA over the {counted(len(ctx.images), 'image')}"
    if cached(key) is None and not button.button(label, key="cka_run",
                                                 help="Runs each model once over the images, "
                                                      f"{BATCH_SIZE} at a time."):
        return
    result = cached(key)
    try:
        lens = ctx.lens
        side_b = _other_side(ctx, other) if other else lens
        if result is None:
            with model_run():
                result = with_progress(key, "CKA: running the models over the images ...", lambda progress: similarity(
                    lens, side_b, [im.image for im in ctx.images], point=point, pooling=pooling,
                    batch_size=BATCH_SIZE, progress=progress))
    except VitvizError as exc:
        st.error(str(exc))
        return
    button.empty()
    stem = file_stem("cka", name_a, name_b, point, pooling)
    la, lb = result.cka.shape
    cell = st.session_state.get("cka_cell")
    if cell is None or cell[0] >= la or cell[1] >= lb:  # first view, or another map: the curve's middle pair
        middle = result.diagonal().iloc[len(result.diagonal()) // 2]
        cell = (int(middle["layer_a"]), int(middle["layer_b"]))
    with guarded("the CKA map"):
        show_chart(cka_heatmap(result, name_a, name_b, selected=cell), "cka_map", stem, on_select=_pick_cell,
                   selection_mode="points")
    st.caption(f"{counted(result.images, 'image')} in {counted(result.settings['minibatches'], 'minibatch')}; point {point}, "
               f"pooling {pooling} ({POOLINGS[pooling]}). One colour scale, 0 to 1; an estimate below 0 (possible "
               f"with few images) is drawn as 0 and keeps its value in the hover. Interval: "
               f"{result.settings['interval']}.")
    width = median_interval_width(result.low, result.high)
    if width is not None and width > 0.3:
        st.warning(f"With {counted(result.images, 'image')} the 95 % intervals are wide (median width {width:.2f}; "
                   "hover a cell for its own): the map's broad structure may hold, but not which cells differ. Dozens "
                   "of images narrow them (`python -m vitviz similarity` runs over thousands).")
    with guarded("the token clusters"):
        _clusters_side_by_side(ctx, (lens, side_b), (name_a, name_b), point, cell, result)
    with guarded("the diagonal"):
        show_chart(cka_diagonal(result, name_a, name_b), "cka_diagonal", f"{stem}_diagonal")
    download_row(stem, result.table().assign(name_a=lambda t: [result.layers_a[i] for i in t["layer_a"]],
                                             name_b=lambda t: [result.layers_b[j] for j in t["layer_b"]]),
                 result.settings | {"model_a": name_a, "model_b": name_b,
                                    "layers_a": list(result.layers_a), "layers_b": list(result.layers_b)})


def _pick_cell() -> None:
    """A click on the map: its marker's customdata is [layer_a, layer_b], 0-based."""
    event = st.session_state.get("cka_map") or {}
    points = (event.get("selection") or {}).get("points") or []
    picked = [int(v) for v in point_customdata(points[0])] if points else []
    if len(picked) == 2:
        st.session_state["cka_cell"] = tuple(picked)


def _clusters_side_by_side(ctx, sides, names, point: str, cell: tuple[int, int], result) -> None:
    """The selected cell's two layers: k-means of the sidebar's current image's tokens at each, side by side."""
    i, j = cell
    layers = (result.layers_a[i], result.layers_b[j])
    shown = [f"layer {n.split()[-1]}" if n.startswith("block ") else f"stage {n}" for n in layers]
    st.markdown(f"**Token clusters of the selected cell**: {names[0]} {shown[0]} against {names[1]} {shown[1]}, "
                f"CKA {result.cka[i, j]:.3f} (95 %: {result.low[i, j]:.3f} to {result.high[i, j]:.3f}).")
    k = st.slider("Clusters K", K_RANGE[0], K_RANGE[1], 4, key="cka_cluster_k")
    columns = st.columns(2)
    for column, side, name, layer, what, tag in zip(columns, sides, names, (i, j), shown, ("a", "b")):
        key = ("cka_clusters", ctx.spec, name, point, layer, ctx.image.sha256, k)
        with column:
            tokens, clusters = store().get_or_compute(key, _model_run(
                f"Clustering {name}'s {what} ...", lambda side=side, layer=layer: _cluster(side, point, ctx.image.image,
                                                                                         layer, k)))
            at = f"{what}, {point}" if isinstance(side, Lens) else what
            title = f"{name}: {at}, {counted(k, 'cluster')}"
            show_chart(cluster_figure(tokens.image, clusters.labels, tokens.layout, title=title, height=430),
                       f"cka_clusters_{tag}", file_stem("cka_clusters", ctx.image.name, name, what, f"k{k}"))
    st.caption(f"One image (the sidebar's {ctx.image.name}) on each model's own input; k-means of its "
               f"{'tokens' if isinstance(sides[0], Lens) else 'positions'} at each layer (fixed seed, numbered by "
               "size, largest first). Click another cell of the map to compare two other layers. Similar groupings "
               "at a high CKA are expected; CKA compares the images' Gram matrices over the whole set, the clusters "
               "one image's tokens.")


def _cluster(side, point: str, image, layer: int, k: int):
    side = LensFeatures(side, point) if isinstance(side, Lens) else side
    tokens = layer_tokens(side, image, layer)
    return tokens, token_clusters(tokens.features, tokens.layout.grid_size, k)
