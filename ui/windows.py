"""The views of window-attention models (Swin), called by the heads and distance pages.

A Swin block attends inside local windows of its stage's grid, so the heads page shows where one
clicked patch looks inside its window and the distance page plots how far each head looks within
windows, block by block across stages (:mod:`vitviz.swin`).
"""
from __future__ import annotations

import numpy as np
import streamlit as st
from PIL import Image
from streamlit_image_coordinates import streamlit_image_coordinates

from vitviz.layout import TokenLayout

from vitviz.analyses.maps import threshold_mask
from vitviz.figures.overlay import outline_region
from vitviz.figures.report import outline_patch
from vitviz.swin import (DISTANCE_CONVENTION, WindowGeometry, bounding_box, heads_padded, query_scope,
                         window_attention_for_patch)
from vitviz.figures.window_figures import window_distance_figure

from .cache import cached_image_result
from .charts import file_stem, point_customdata, show_chart
from .display import display_controls, map_figure, panel_download
from .downloads import download_row
from .guard import guarded
from .state import Context
from .words import counted

CLICK_SCALE = 2
DINO_KEEP = 0.6
ENLARGED_PX = 224  # the enlarged window is drawn at least this many pixels wide (whole multiples of its crop)
VIEWS = ("whole image", "the query's window, enlarged")
GRID_PX = 760  # the tiles' share of the page at 1440 px: Swin-T's 24 heads get 6 smaller columns, no blank band
BLOCK_KEY = "window_block"
POINT_KEY = "window_point"  # the clicked point in model-input pixels: the same place whatever the stage


def _enlarged(image: Image.Image, maps: np.ndarray, scope: np.ndarray, patch: int, g: WindowGeometry):
    """The box around the query's reach (one token of context around it), enlarged: (image, maps,
    scope, query index, layout, (rows, cols) slices on the stage grid)."""
    rows, cols = bounding_box(scope, margin=1)
    sy, sx = g.stride
    crop = image.crop((cols.start * sx, rows.start * sy, cols.stop * sx, rows.stop * sy))
    k = max(1, -(-ENLARGED_PX // max(crop.size)))
    crop = crop.resize((crop.width * k, crop.height * k), Image.BICUBIC)
    grid = (rows.stop - rows.start, cols.stop - cols.start)
    layout = TokenLayout(prefix_tokens=(), grid_size=grid, patch_size=(sy * k, sx * k), global_pool="avg",
                         pos_embed_prefix_rows=0)
    r, c = divmod(patch, g.grid_size[1])
    return (crop, maps[:, rows, cols], scope[rows, cols], (r - rows.start) * grid[1] + c - cols.start, layout,
            (rows, cols))


def _typed(g) -> None:
    """The typed query row/column (1-based) as the chosen point: that token's centre in input pixels."""
    row, col = st.session_state[f"window_row_{g.grid_size}"] - 1, st.session_state[f"window_col_{g.grid_size}"] - 1
    st.session_state[POINT_KEY] = ((col + 0.5) * g.stride[1], (row + 0.5) * g.stride[0])


@st.fragment
@guarded("the window heads")
def heads_view(ctx: Context) -> None:
    """Every head of one block: the clicked patch's attention over its window, placed on the image."""
    r = ctx.result
    n = len(r.geometry)
    controls, grid_col = st.columns([1, 3.3])
    with controls:
        b = st.slider("Block (across stages)", 1, n, n, key=BLOCK_KEY) - 1
        g, layout = r.geometry[b], r.geometry[b].layout
        st.caption(g.describe().capitalize() + f"; grid {g.grid_size[0]}×{g.grid_size[1]}.")
        x, y = st.session_state.get(POINT_KEY, (r.model_input.width / 2, r.model_input.height / 2))
        patch = layout.patch_at(x, y)
        row, col = divmod(patch, g.grid_size[1])
        scope = query_scope(g, row, col)
        picker = outline_region(outline_patch(r.model_input, patch, g.grid_size, CLICK_SCALE), scope)
        click = streamlit_image_coordinates(picker, key="window_click", image_format="JPEG", jpeg_quality=85,
                                            width="stretch")
        if click and click.get("unix_time") != st.session_state.get("window_last_click"):
            st.session_state["window_last_click"] = click.get("unix_time")
            scale = click["width"] / r.model_input.width
            st.session_state[POINT_KEY] = (click["x"] / scale, click["y"] / scale)
            st.rerun(scope="fragment")
        # Stage 1's tokens are 4 px: too small to hit on a picker this wide, so row and column can be typed.
        pick_row, pick_col = st.columns(2)
        for key, value in ((f"window_row_{g.grid_size}", row + 1), (f"window_col_{g.grid_size}", col + 1)):
            st.session_state[key] = value
        pick_row.number_input("Query row", 1, g.grid_size[0], key=f"window_row_{g.grid_size}", on_change=_typed,
                              args=(g,))
        pick_col.number_input("Query column", 1, g.grid_size[1], key=f"window_col_{g.grid_size}", on_change=_typed,
                              args=(g,))
        st.caption(f"Click a patch (or type its row and column) to use it as the query. Selected: "
                   f"{layout.token_name(patch)} of stage {g.stage + 1}'s grid ({g.stride[0]} px per token); "
                   "white outline: what it can attend to.")
        view = st.radio("Show", VIEWS, key="window_view", help="The window enlarged: the box around what the query "
                        "can attend to, one token of context around it, so the window's own patches are legible.")
        display = display_controls()

    maps = window_attention_for_patch(r.attention[b], g, row, col)
    H = len(maps)
    masks = np.stack([threshold_mask(m, DINO_KEEP) for m in maps]) if display.style == "DINO mask" else None
    titles = [f"head {h + 1}" for h in range(H)]
    notes = [f"{r.window_distance[b][h]:.1f} px" for h in range(H)]
    title = (f"Block {b + 1} (stage {g.stage + 1}, {'shifted' if g.shifted else 'regular'} windows), every head, "
             f"query patch row {row + 1}, col {col + 1}")
    columns = 3 if H <= 9 else 4 if H <= 16 else 6
    tile_px = None if H <= 9 else GRID_PX // columns - 8
    padding = 1 - maps.sum(axis=(1, 2))
    image, shown, shown_scope, query, shown_layout = r.model_input, maps, scope, patch, layout
    if view == VIEWS[1]:
        image, shown, shown_scope, query, shown_layout, (rows, cols) = _enlarged(r.model_input, maps, scope, patch, g)
        masks = None if masks is None else masks[:, rows, cols]
        title += f"; enlarged: rows {rows.start + 1}–{rows.stop}, cols {cols.start + 1}–{cols.stop}"
    with grid_col:
        rendered, fig = map_figure(image, shown, shown_layout, display, titles=titles, notes=notes, title=title,
                                   masks=masks, query=query, columns=columns, region=shown_scope, tile_px=tile_px)
        stem = file_stem("window_heads", ctx.image.name, f"block{b + 1}", f"r{row + 1}c{col + 1}")
        show_chart(fig, "window_heads_grid", stem, vector=False)
        st.caption(rendered.caption() + " Only the patches inside the white outline set the colour limits. The "
                   "outline is what this query can attend to in this block: its window, and in shifted blocks only "
                   "the part of it that was not brought in from the opposite edge by the cyclic shift (the shift "
                   "mask hides those, weight ≈ e⁻¹⁰⁰). px: the head's mean attention distance within windows in "
                   "this block, over all queries."
                   + (" Enlarged: hover counts rows and columns inside the box." if view == VIEWS[1] else "")
                   + (f" Weight on padding tokens (the grid is padded to whole windows; not on the image): "
                      f"{', '.join(f'head {h + 1} {p:.1%}' for h, p in enumerate(padding))}."
                      if padding.max() > 1e-4 else ""))
        settings = display.settings(rendered) | {
            "image": ctx.image.name, "sha256": ctx.image.sha256, "model": ctx.loaded.card()["spec"],
            "block (1-based, across stages)": b + 1, "stage (1-based)": g.stage + 1,
            "query (row, col) 1-based on the stage grid": [row + 1, col + 1], "geometry (0-based)": g.to_dict(),
            "maps_axis_0": "heads, 0-based (head h on screen = index h - 1)",
            "window_attention": "(nW, H, T, T) this block's probabilities; windows and slots in timm's partition "
                                "order of the cyclically shifted, padded grid"}
        download_row(stem, {"maps": maps, "scope": scope, "window_attention": r.attention[b],
                            "token_positions": g.token_positions()}, settings,
                     panel_download(image, shown, display, titles, title, masks=masks, query=query,
                                    columns=columns, region=shown_scope))


def distance_view(ctx: Context) -> None:
    """Mean attention distance within windows per block and head, one image or the whole set."""
    r = ctx.result
    st.subheader("Within windows, block by block")
    scope = st.radio("Images", [f"current image ({ctx.image.name})",
                               f"the whole set ({counted(len(ctx.images), 'image')})"], horizontal=True,
                     key="distance_scope")
    results = [r]
    if scope.startswith("the whole set"):
        bar = st.progress(0.0, text="Running the model on the image set ...")
        results = []
        for i, im in enumerate(ctx.images):
            results.append(cached_image_result(ctx.spec, im.sha256, im.image))
            bar.progress((i + 1) / len(ctx.images), text=f"{i + 1} of {counted(len(ctx.images), 'image')}")
        bar.empty()
    per_block = [np.stack([res.window_distance[b] for res in results]) for b in range(len(r.geometry))]  # (images, H_b)
    distance = [v.mean(axis=0) for v in per_block]
    spread = [v.std(axis=0) for v in per_block] if len(results) > 1 else None
    names = [im.name for im in ctx.images] if scope.startswith("the whole set") else [ctx.image.name]
    stem = file_stem("window_distance", names[0] if len(names) == 1 else f"{len(names)}images")
    event = show_chart(window_distance_figure(distance, r.geometry, r.uniform_distance, spread, len(names)),
                       "window_distance_plot", stem, on_select="rerun", selection_mode="points")
    points = event.selection.points if event and event.selection else []
    picked = point_customdata(points[0]) if points else []
    if len(picked) >= 2:
        st.session_state[BLOCK_KEY] = int(picked[0])
        st.switch_page("pages/2_heads.py")
    st.caption(f"Convention: {DISTANCE_CONVENTION}. Dotted steps: a head attending uniformly to every key its query "
               "can reach in that block. Dashed lines: patch merging between stages (the token stride doubles, so "
               "the same window reaches twice as far). "
               + (f"Error bars: ± one standard deviation over the {counted(len(names), 'image')}." if spread is not None
                  else "Pick the whole set for the spread over its images."))
    download_row(stem, {"mean_distance": heads_padded(distance), "uniform_window_distance": r.uniform_distance}
                 | ({"mean_distance_std": heads_padded(spread)} if spread is not None else {}),
                 {"images": names, "model": ctx.loaded.card()["spec"], "convention": DISTANCE_CONVENTION,
                  "axes": "mean_distance[block, head], both 0-based; blocks across stages; NaN where the block's "
                          "stage has fewer heads",
                  "geometry (0-based)": [g.to_dict() for g in r.geometry]})
