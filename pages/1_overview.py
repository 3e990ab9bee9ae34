"""Overview: the image as the model sees it, the model card, classes, token norms, feature PCA."""
import streamlit as st

from ui.cache import cached_feature_pca, cached_top_classes
from ui.downloads import download_row
from ui.state import setup
from vitviz.figures import bars, patch_grid_image, rgb_image, token_norm_map

ctx = setup()
if ctx is None:
    st.stop()
r, layout = ctx.result, ctx.result.layout
st.header(f"{ctx.image.name} as the model sees it")

left, right = st.columns([3, 2])
with left:
    st.plotly_chart(patch_grid_image(r.model_input, layout, st.toggle("Token indices", True)), key="grid")
    st.caption(f"{layout.grid_size[0]}x{layout.grid_size[1]} patches of {layout.patch_size[0]} px after resize and "
               f"crop; token indices in raster order after the prefix tokens {list(layout.prefix_tokens) or 'none'}.")
with right:
    card = ctx.loaded.card()
    st.subheader("Model")
    st.table({k: str(card[k]) for k in ("label", "timm_architecture", "weights_source", "layers", "heads",
                                          "embed_dim", "parameters", "num_classes", "device", "dtype")}
             | {"prefix tokens": ", ".join(layout.prefix_tokens) or "none", "pooling": layout.global_pool})
    for note in ctx.loaded.notes:
        st.caption(note)
    if r.logits is not None:
        top = cached_top_classes(ctx.spec, ctx.image.sha256, r)
        st.plotly_chart(bars([p for _, _, p in top], "Top-5 classes", "", "probability",
                             labels=[f"{label} ({i})" for i, label, _ in top]), key="top5")

st.subheader("Output-token norms")
layer = st.slider("Layer", 1, len(r.token_norms), len(r.token_norms), key="norm_layer") - 1
st.plotly_chart(token_norm_map(r.token_norms[layer], layout, r.artifacts), key="norms")
st.caption(f"High-norm artifact tokens (last layer, over 10x the median patch norm; Darcet et al. 2023): "
           f"{[layout.token_name(int(t)) for t in r.artifacts] or 'none'}.")
download_row("token_norms", {"token_norms": r.token_norms, "artifact_tokens": r.artifacts},
             {"image": ctx.image.name, "sha256": ctx.image.sha256, "model": card["spec"], "layer_shown": layer + 1})

st.subheader("Patch features, first 3 principal components as RGB")
pca = cached_feature_pca(ctx.spec, ctx.image.sha256, r)
st.plotly_chart(rgb_image(pca, scale=8), key="pca")
st.caption("Patches with similar last-layer features get similar colours: they group into object parts.")
download_row("feature_pca", {"feature_pca_rgb": pca}, {"image": ctx.image.name, "model": card["spec"]})
