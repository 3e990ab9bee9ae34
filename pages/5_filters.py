"""Embedding filters: principal components of the patch-embedding filters (ViT paper Fig. 7 left)."""
import streamlit as st

from ui.downloads import download_row
from ui.state import setup
from vitviz.figures import bars, rgb_image
from vitviz.filters import minmax_tiles, patch_filter_pca, patch_filters
from vitviz.report import tile_grid

ctx = setup()
if ctx is None:
    st.stop()
st.header("Patch-embedding filters")
try:
    filters = patch_filters(ctx.loaded.model)
except ValueError as exc:
    st.error(str(exc))
    st.stop()
pca = patch_filter_pca(filters)
k, P = len(pca.components), filters.shape[-1]
scale = max(1, 56 // P)
st.subheader(f"First {k} principal components of the {filters.shape[0]} filters ({P}x{P} RGB each)")
st.plotly_chart(rgb_image(tile_grid(pca.tiles, columns=7, scale=scale)), key="pca_tiles")
st.plotly_chart(bars(pca.explained_variance_ratio, "Explained variance ratio", "component", "share of variance"),
                key="pca_variance")
download_row("filter_pca", {"filter_pca": pca.components, "filter_pca_explained": pca.explained_variance_ratio},
             {"model": ctx.loaded.card()["spec"], "n_components": k, "tiles": "each component min-max scaled"},
             tile_grid(pca.tiles, columns=7, scale=scale))
n_raw = st.slider("Raw filters shown", 8, filters.shape[0], min(64, filters.shape[0]), 8, key="n_raw")
st.subheader(f"Raw filters 1–{n_raw}, each min-max scaled")
raw_tiles = tile_grid(minmax_tiles(filters[:n_raw]), columns=16, scale=scale)
st.plotly_chart(rgb_image(raw_tiles), key="raw_tiles")
download_row("raw_filters", {"filters": filters}, {"model": ctx.loaded.card()["spec"]}, raw_tiles)
