"""Overview: the image as the model sees it, the model card, classes, token norms, feature PCA, token clusters."""
from dataclasses import replace

import streamlit as st

from ui.cache import cached_feature_pca, cached_top_classes
from ui.charts import file_stem, show_chart
from ui.display import Display, map_figure
from ui.downloads import download_row
from ui.explain import BLOCK, CLUSTER_SOURCES, FINAL, KEYS, cached_clusters
from ui.guard import guarded
from ui.state import view_applies, setup
from ui.navigation import concepts_link, heading
from vitviz.analyses.clusters import K_RANGE
from vitviz.errors import VitvizError
from vitviz.figures.explain_figures import cluster_figure
from vitviz.figures.core import bars, patch_grid_image, rgb_image
from vitviz.layout import PATCH_NUMBERING

# The model card's rows in words (the card's keys, as settings.json writes them, are for code and the docs).
CARD_ROWS = {"label": "model", "library": "library", "architecture": "architecture", "weights_source": "weights from",
             "layers": "layers", "heads": "heads per layer", "embed_dim": "token width (dimensions)",
             "parameters": "parameters", "num_classes": "classes (0: no classifier)", "device": "device",
             "dtype": "number type"}

ctx = setup()
if ctx is None:
    st.stop()
r, layout = ctx.result, ctx.result.layout
heading(__file__, f"{ctx.image.name} as the model sees it")

left, right = st.columns([3, 2])
with left, guarded("the image and its patch grid"):
    # Past 32 columns the indices no longer fit their patches (Swin's 56x56 grid of 4 px tokens): off by default.
    indices = st.toggle("Patch numbers", layout.grid_size[1] <= 32)
    show_chart(patch_grid_image(r.model_input, layout, indices), "grid",
               file_stem("patch_grid", ctx.image.name))
    st.caption(f"{layout.grid_size[0]}x{layout.grid_size[1]} patches of {layout.patch_size[0]} px after resize and "
               f"crop. {PATCH_NUMBERING} The prefix tokens {list(layout.prefix_tokens) or 'none'} come before the "
               f"patches in the token sequence (token index = patch number + {layout.num_prefix_tokens}). "
               + concepts_link("patches-tokens-and-layers"))
with right, guarded("the model card and classes"):
    card = ctx.loaded.card()
    st.subheader("Model")
    st.table({words: str(card[k]) for k, words in CARD_ROWS.items()}
             | {"prefix tokens": ", ".join(layout.prefix_tokens) or "none", "pooling": layout.global_pool})
    for note in ctx.loaded.notes:
        st.caption(note)
    if r.logits is not None:
        top = cached_top_classes(ctx.spec, ctx.image.sha256, r)
        show_chart(bars([p for _, _, p in top], "Top-5 classes", "", "probability",
                        labels=[f"{label} ({i})" for i, label, _ in top]), "top5", file_stem("top5", ctx.image.name))

view_applies(ctx, "overview")
st.subheader("Tokens that distort maps: high norms and attention sinks")
layer = st.slider("Layer", 1, len(r.token_norms), len(r.token_norms), key="norm_layer") - 1
norms = r.norm_map(layer)
received = r.sinks.received_map(layout, layer)
sinks = r.sinks.sinks[layer]
patch_sinks = r.sinks.patch_sinks(layout, [layer])
artifacts = r.artifact_patches
plain = Display(cmap="Viridis", scale_mode="full range per map", style="heatmap", opacity=0.85)
norm_col, sink_col = st.columns(2)
with norm_col, guarded("the output-token norms"):
    _, fig = map_figure(r.model_input, norms, layout, plain, titles=[""], value_name="output norm",
                        title=f"Output-token norms, layer {layer + 1}", sinks=artifacts if layer == len(r.token_norms) - 1 else None,
                        tile_px=360)
    show_chart(fig, "norms", file_stem("token_norms", ctx.image.name, f"layer{layer + 1}"))
    st.caption("High-norm artifact tokens (last layer, over 10x the median patch norm; Darcet et al. 2023), "
               f"crossed: {[layout.token_name(int(t)) for t in r.artifacts] or 'none'}. "
               + concepts_link("definitions-used"))
with sink_col, guarded("the attention received per token"):
    _, fig = map_figure(r.model_input, received, layout, replace(plain, cmap="Inferno", scale_mode="log"), titles=[""],
                        value_name="received ÷ uniform", title=f"Attention received per token, layer {layer + 1}",
                        sinks=patch_sinks, tile_px=360)
    show_chart(fig, "received", file_stem("attention_received", ctx.image.name, f"layer{layer + 1}"))
    st.caption("Mean share of a query's attention each patch receives (all heads and queries), as a multiple of "
               "the uniform share 1/N, log scale. Attention sinks (robust z-score > 8 and over 10x uniform), "
               "crossed here and on the other pages' maps: "
               + (", ".join(f"{layout.token_name(int(t))} ({r.sinks.received[layer, t]:.1%} of all attention)"
                            for t in sinks) or "none") + ".")
sink_table = {f"layer {l + 1}": ", ".join(f"{layout.token_name(int(t))}: {r.sinks.received[l, t]:.1%}" for t in s) or "—"
              for l, s in enumerate(r.sinks.sinks)}
with st.expander("Attention sinks in every layer (share of all attention they receive)"):
    st.table(sink_table)
download_row(file_stem("tokens", ctx.image.name), {"token_norms": r.token_norms, "artifact_tokens": r.artifacts,
                                                    "received_share": r.sinks.received, "sink_zscore": r.sinks.z},
             {"image": ctx.image.name, "sha256": ctx.image.sha256, "model": card["spec"],
              "layer_shown (1-based)": layer + 1, "token_indices": "0-based sequence indices, prefix tokens first",
              "attention_sinks_per_layer (0-based layers)": [s.tolist() for s in r.sinks.sinks]})

st.subheader("Patch features: first 3 principal components as RGB, and token clusters")
k_col, source_col, layer_col, head_col = st.columns(4)
k = k_col.slider("Clusters K", K_RANGE[0], K_RANGE[1], 4, key="cluster_k")
source = source_col.selectbox("Cluster on", CLUSTER_SOURCES, key="cluster_source",
                              help="final features: the model's output tokens after its last norm (as the PCA); "
                                   "output of a block: the tokens leaving that layer; keys: one head's key vectors")
L, H = r.attention.shape[:2]
cluster_layer = layer_col.slider("Cluster layer", 1, L, L, key="cluster_layer", disabled=source == FINAL) - 1
cluster_head = head_col.selectbox("Cluster head", list(range(1, H + 1)), key="cluster_head",
                                  disabled=source != KEYS) - 1
pca_col, cluster_col = st.columns(2)
with pca_col, guarded("the feature PCA"):
    pca = cached_feature_pca(ctx.spec, ctx.image.sha256, r)
    show_chart(rgb_image(pca, scale=8), "pca", file_stem("feature_pca", ctx.image.name))
    st.caption("Patches with similar last-layer features get similar colours: they group into object parts.")
    download_row(file_stem("feature_pca", ctx.image.name), {"feature_pca_rgb": pca}, {"image": ctx.image.name, "model": card["spec"]})
with cluster_col, guarded("the token clusters"):
    try:
        clusters = cached_clusters(ctx.spec, ctx.image.sha256, ctx.image.image, r, source, cluster_layer,
                                   cluster_head, k)
    except VitvizError as exc:  # keys of a model family whose q, k and v are not read here
        st.error(str(exc))
        st.stop()
    what = {FINAL: "final features", BLOCK: f"output of layer {cluster_layer + 1}",
            KEYS: f"keys of layer {cluster_layer + 1}, head {cluster_head + 1}"}[source]
    show_chart(cluster_figure(r.model_input, clusters.labels, layout, title=f"{k} token clusters, {what}", height=450),
               "clusters", file_stem("clusters", ctx.image.name, f"k{k}", what))
    st.caption("k-means of the patch tokens (k-means++, best of 10 starts, seed 0: the same image and settings "
               "give the same clusters), numbered by size, largest first; white lines separate clusters. "
               f"Inertia (sum of squared distances to the cluster means): {clusters.inertia:.4g}.")
    download_row(file_stem("clusters", ctx.image.name, f"k{k}", what), {"clusters": clusters.labels,
                                                                         "sizes": clusters.sizes},
                 {"image": ctx.image.name, "sha256": ctx.image.sha256, "model": card["spec"], "k": k, "features": what,
                  "layer (1-based)": None if source == FINAL else cluster_layer + 1,
                  "head (1-based)": cluster_head + 1 if source == KEYS else None, "inertia": clusters.inertia,
                  "labels": "0-based, 0 = largest cluster; on screen 1-based", "grid": "(gh, gw) patch rows, cols"})
