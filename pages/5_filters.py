"""Embedding filters: principal components of the patch-embedding filters (ViT paper Fig. 7 left)."""
import streamlit as st

from ui.charts import show_chart
from ui.downloads import download_row
from ui.state import setup
from ui.navigation import heading
from vitviz.errors import VitvizError
from vitviz.figures.core import bars, labelled_tile_image, tile_grid_figure, whole_pixel_tile
from vitviz.analyses.filters import minmax_tiles, patch_filter_pca, patch_filters

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
try:
    filters = patch_filters(ctx.lens.model)
except VitvizError as exc:
    st.error(str(exc))
    st.stop()
pca = patch_filter_pca(filters)
k, D, P = len(pca.components), filters.shape[0], filters.shape[-1]
share = pca.explained_variance_ratio
TILE_PX = 126  # 9x a 14-pixel filter: each weight a visible block, seven tiles across the page at 1440 px
PRINT_PX = 168  # the PNG download's tiles: 12 px per weight of a 14-pixel filter

title = f"First {k} principal components of the {D} patch filters ({P}×{P} RGB)"
labels = [f"PC{i + 1} · {100 * s:.1f}%" for i, s in enumerate(share)]
show_chart(tile_grid_figure(pca.tiles, labels, title, columns=7, tile_px=TILE_PX), "pca_tiles", "filter_pca",
           width="content")
st.caption(f"PCk · s%: component k (1-based) and its share s of the filters' variance. Each component is "
           f"min-max scaled to 0..1 on its own and signed so that its largest-magnitude weight is positive "
           f"(a component's sign is arbitrary; this rule does not depend on the scikit-learn version).")
download_row("filter_pca", {"filter_pca": pca.components, "filter_pca_explained": share},
             {"model": ctx.loaded.card()["spec"], "n_components": k, "components": "0-based in the arrays, "
              "PC1 on screen is filter_pca[0]", "sign": "largest-magnitude entry of each component positive",
              "tiles": "each component min-max scaled to 0..1", "explained": "share of variance, 0..1"},
             labelled_tile_image(pca.tiles, labels, title, columns=7, tile_px=whole_pixel_tile(P, PRINT_PX)), prepared=True)

left, _ = st.columns([3, 2], gap="medium")
with left:
    fig = bars(share, "Variance explained per component", "component (1-based)", "share of variance")
    fig.update_layout(height=340, yaxis_tickformat=".1%", margin=dict(l=60, r=10, t=40, b=50),
                      plot_bgcolor="white", yaxis_gridcolor="#ddd")
    show_chart(fig, "pca_variance", "filter_pca_variance")
    st.caption(f"The first {k} components explain {100 * share.sum():.1f}% of the variance of the {D} filters.")

n_raw = st.slider("Raw filters shown", 8, D, min(64, D), 8, key="n_raw")
raw_title = f"Raw patch filters 1–{n_raw} of {D} (1-based), each min-max scaled"
raw_tiles, raw_labels = minmax_tiles(filters[:n_raw]), [str(i + 1) for i in range(n_raw)]
show_chart(tile_grid_figure(raw_tiles, raw_labels, raw_title, columns=16, tile_px=56, font_size=11), "raw_tiles",
           "raw_filters", width="content")
download_row("raw_filters", {"filters": filters}, {"model": ctx.loaded.card()["spec"], "shown": n_raw,
                                                   "labels": "1-based; filters[i] is label i + 1"},
             labelled_tile_image(raw_tiles, raw_labels, raw_title, columns=16, tile_px=whole_pixel_tile(P, 112),
                                 font_size=14), prepared=True)
