"""Position embeddings: cosine similarity of every position with every other (ViT paper Fig. 7 centre)."""
import streamlit as st

from ui import keys
from ui.cache import cached_position_similarity
from ui.charts import file_stem, show_chart
from ui.downloads import download_row
from ui.posembed import MAX_GRID, SELECTED, grid_source, select_from_click, select_from_sliders
from ui.state import setup
from ui.navigation import heading
from vitviz.errors import ViewNotApplicable, VitvizError
from vitviz.figures.core import similarity_grid, similarity_map
from vitviz.analyses.posembed import grid_with_rows, position_at, resampled_rows

ctx = setup()
if ctx is None:
    st.stop()
loaded, layout = ctx.loaded, ctx.lens.layout
gh = layout.grid_size[0]
native = loaded.native_pos_embed
heading(__file__)
try:  # at the model's own grid first: a model without the embedding gets its sentence before any control
    cached_position_similarity(ctx.spec, layout.grid_size)
except ViewNotApplicable as exc:
    st.info(str(exc))
    st.stop()
left, right = st.columns([2, 1], gap="small")

with right:
    top = resampled_rows(gh, native.grid_size[0] if native else None, MAX_GRID)
    grid = gh if top == gh else st.slider(
        "Grid rows: the model's own, or resampled from the stored weights as for another input size",
        gh, top, gh, key="pos_grid")
shape = grid_with_rows(grid, layout.grid_size)
try:
    embeddings, similarity = cached_position_similarity(ctx.spec, shape)
except VitvizError as exc:
    st.error(str(exc))
    st.stop()
st.session_state[keys.POS_SHAPE] = shape
row, col = position_at(st.session_state.setdefault(SELECTED, (0.5, 0.5)), shape)
st.session_state[keys.POS_ROW], st.session_state[keys.POS_COL] = row + 1, col + 1

with left:
    show_chart(similarity_grid(similarity, (row, col), height=690), "pos_grid_fig",
               file_stem("posembed_similarity", f"{shape[0]}x{shape[1]}"),
               on_select=select_from_click, selection_mode="points")
with right:
    st.slider("Row (1-based)", 1, shape[0], key=keys.POS_ROW, on_change=select_from_sliders)
    st.slider("Column (1-based)", 1, shape[1], key=keys.POS_COL, on_change=select_from_sliders)
    show_chart(similarity_map(similarity[row, col], (row, col), height=360), "pos_one",
               file_stem("posembed_similarity", f"{shape[0]}x{shape[1]}", f"row{row + 1}_col{col + 1}"))

how = grid_source(layout, native, shape)
with left:
    st.caption(f"Tile (row r, col c) shows the cosine similarity of that position's embedding with every position; "
               f"one fixed −1..1 scale; rows and columns counted from 1. Click a tile to enlarge it. Grid: {how}.")
    if loaded.position_encoding != "learned absolute position embedding":
        st.caption(f"This model's position encoding: {loaded.position_encoding}. Only the learned absolute "
                   "embedding is shown here; the other terms act inside attention (on the heads and anatomy pages), "
                   "they are not vectors added to the tokens.")
download_row("posembed_similarity", {"posembed_similarity": similarity, "position_embeddings": embeddings},
             {"model": ctx.loaded.card()["spec"], "grid": list(shape), "grid_source": how,
              "native_pos_embed": native.to_dict() if native else None,
              "prefix_rows_dropped": layout.pos_embed_prefix_rows,
              "array_indices": "0-based: posembed_similarity[r, c, i, j] is cos(position (r, c), position (i, j))",
              "rows_cols_on_screen": "1-based (row r on screen is index r - 1)",
              "selected_position_1_based": {"row": row + 1, "col": col + 1},
              "colour_scale": {"colormap": "RdBu_r", "lo": -1, "hi": 1, "unit": "cosine similarity"}})
