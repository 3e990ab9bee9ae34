"""Position embeddings: cosine similarity of every position with every other (ViT paper Fig. 7 centre)."""
import streamlit as st

from ui.downloads import download_row
from ui.state import setup
from vitviz.figures import similarity_grid, similarity_map
from vitviz.posembed import patch_position_embeddings, position_embedding_similarity

ctx = setup()
if ctx is None:
    st.stop()
layout = ctx.result.layout
gh, gw = layout.grid_size
st.header("Position-embedding similarity")
grid = st.slider("Grid (patches per side): the model's own, or resampled as for a higher-resolution fine-tune",
                 gh, max(gh, 2 * gh), gh, key="pos_grid")
try:
    embeddings = patch_position_embeddings(ctx.loaded.model, layout, grid_size=(grid, grid * gw // gh))
except ValueError as exc:
    st.error(str(exc))
    st.stop()
shape = (grid, grid * gw // gh)
similarity = position_embedding_similarity(embeddings, shape)
left, right = st.columns([3, 2])
with left:
    st.plotly_chart(similarity_grid(similarity), key="pos_grid_fig")
    st.caption("Tile (i, j) shows the cosine similarity of position (i, j)'s embedding with every position; "
               "colour scale fixed at −1..1." + (" Resampled as timm does for this model." if grid != gh else ""))
with right:
    row = st.slider("Row", 1, shape[0], shape[0] // 2, key="pos_row") - 1
    col = st.slider("Column", 1, shape[1], shape[1] // 2, key="pos_col") - 1
    st.plotly_chart(similarity_map(similarity[row, col], (row, col)), key="pos_one")
download_row("posembed_similarity", {"posembed_similarity": similarity},
             {"model": ctx.loaded.card()["spec"], "grid": shape, "prefix_rows_dropped": layout.pos_embed_prefix_rows})
