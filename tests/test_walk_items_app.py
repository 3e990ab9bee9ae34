"""Walk items of issue 20 as AppTest sees them: the overview grid without a legend, one name per model on
Compare, the selected patch across a resolution change, the Overlay choice's words (the unit checks are in
tests/test_walk_items.py; the filters' downloads in a browser in tests/test_walk_items_browser.py)."""
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from test_compare import parquet_bytes, stats_table
from test_walk_items import _legend_entries
from vitviz.figures.overlay import OVERLAY_HELP, OVERLAY_LABELS, OVERLAY_STYLES

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _chart(at, key: str) -> dict:
    chart = next((c for c in at.get("plotly_chart") if key in (c.proto.id or "")), None)
    assert chart is not None, f"no chart {key}"
    return json.loads(chart.proto.spec)


def test_the_overview_patch_grid_has_no_legend():
    import plotly.graph_objects as go

    spec = _chart(_app(), "grid")
    fig = go.Figure(spec)
    assert any(t.type == "scatter" and t.mode == "text" for t in fig.data)  # the token numbers are on
    assert _legend_entries(fig) == []


def test_compare_lists_the_bundled_model_once_by_one_name():
    """A `vitviz stats --model bundled` table beside this session's run of the same model: one name, two sources."""
    at = _app()
    at.switch_page("pages/9_compare.py").run()
    at.file_uploader(key="compare_uploads").set_value(
        [("stats.parquet", parquet_bytes(stats_table("bundled", np.full((1, 12, 6), 50.0))), "application/octet-stream")]).run()
    at.button(key="compare_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    names = {t["name"].removesuffix(": mean over heads") for t in _chart(at, "compare_plot")["data"]
             if t.get("mode") == "lines" and t["name"].endswith(": mean over heads")}
    assert names == {"bundled (stats.parquet)", "bundled (this session)"}


def test_the_selected_patch_keeps_its_place_when_the_resolution_changes():
    at = _app()
    at.session_state["patch"] = 8 * 16 + 8  # row 9, col 9 (1-based) of the bundled model's 16x16 grid at 224 px
    at.run()
    assert at.session_state["patch"] == 136 and at.session_state["patch_grid"] == (16, 16)
    at.sidebar.number_input(key="img_size").set_value(518).run()  # 37x37 patches of 14 px
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["patch_grid"] == (37, 37)
    assert at.session_state["patch"] == 19 * 37 + 19  # centre 8.5/16 of each side -> 19.66/37: row and col 19
    assert at.query_params["patch"] == [str(19 * 37 + 19)] or at.query_params["patch"] == str(19 * 37 + 19)
    at.sidebar.number_input(key="img_size").set_value(224).run()  # and back to the same patch
    assert at.session_state["patch"] == 136


def test_the_overlay_choice_reads_as_what_it_draws():
    at = _app()
    at.switch_page("pages/3_rollout.py").run()
    assert not at.exception, [e.message for e in at.exception]
    box = at.selectbox(key="style")
    assert box.options == [OVERLAY_LABELS[s] for s in OVERLAY_STYLES]
    assert box.value == "transparent where low"  # the value kept in URLs and settings is unchanged
    assert box.help == OVERLAY_HELP
