"""The Position embeddings page's pieces: the chosen position (kept as fractions of the grid, so it survives a grid
change) set by the sliders or by a click on the grid, and the sentence saying where the grid's embeddings come from."""
from __future__ import annotations

import streamlit as st

from ui import keys
from ui.numbers import whole
from vitviz.analyses.posembed import position_fraction

MAX_GRID = 40  # a 40x40 grid is 1600 tiles of 1600 cells; beyond that nothing is legible
SELECTED = "pos_selected"  # the chosen position as fractions of the grid height/width: survives a grid change


def _shape() -> tuple[int, int]:
    return tuple(st.session_state[keys.POS_SHAPE])


def select_from_sliders() -> None:
    """The Row and Column sliders' position (1-based on screen) becomes the chosen one."""
    position = (st.session_state[keys.POS_ROW] - 1, st.session_state[keys.POS_COL] - 1)
    st.session_state[SELECTED] = position_fraction(position, _shape())


def select_from_click() -> None:
    """A click on a tile of the grid: its marker's customdata is [row, col, ...] 0-based."""
    event = st.session_state.get("pos_grid_fig") or {}
    points = (event.get("selection") or {}).get("points") or []
    if not points:
        return
    point = points[0]
    data = point.get("customdata")
    if isinstance(data, dict):  # some traces send customdata as {"0": row, "1": col, ...}
        data = [data.get(0, data.get("0")), data.get(1, data.get("1"))]
    position = tuple(whole(v) for v in data[:2]) if isinstance(data, (list, tuple)) else ()
    if len(position) != 2 or None in position:
        index = point.get("point_index", point.get("point_number"))
        if index is None:
            return
        position = divmod(int(index), _shape()[1])
    st.session_state[SELECTED] = position_fraction(position, _shape())


def grid_source(layout, native, shape: tuple[int, int]) -> str:
    """Where the embeddings of a ``shape`` grid come from, in words: the model's own grid, the stored weights, or
    resampled from them (``native``: the checkpoint's stored position embedding, or None when unknown)."""
    (gh, gw), (ph, pw) = layout.grid_size, layout.patch_size
    if shape == layout.grid_size:
        return f"the {gh}×{gw} grid this model runs with at {gh * ph}×{gw * pw} px"
    if native is not None and shape == native.grid_size:
        return (f"the stored {shape[0]}×{shape[1]} weights themselves, which this model uses unchanged at "
                f"{shape[0] * ph}×{shape[1] * pw} px")
    if native is not None:
        return (f"resampled from the stored {native.grid_size[0]}×{native.grid_size[1]} weights "
                f"({native.interpolation}, antialias {'on' if native.antialias else 'off'}), exactly as loading this "
                f"model at {shape[0] * ph}×{shape[1] * pw} px fits them")
    return (f"resampled from the {gh}×{gw} grid this model runs with (bicubic, antialias on): this checkpoint's "
            "stored grid is unknown")
