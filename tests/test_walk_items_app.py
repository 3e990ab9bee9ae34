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
