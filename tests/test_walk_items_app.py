"""Walk items of issue 20 as AppTest sees them: the overview grid without a legend, one name per model on
Compare, the selected patch across a resolution change, the Overlay choice's words (the unit checks are in
tests/test_walk_items.py; the filters' downloads in a browser in tests/test_walk_items_browser.py)."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

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
