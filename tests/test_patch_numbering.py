"""One number for one patch on every page (issue 34): the Overview grid's label, its hover, the heads page's
picker and the rollout's readout all call the patch at row 10, column 5 of the bundled model's 16x16 grid
"patch 148" (0-based raster index, rows and columns from 1), as the downloads' arrays index it."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
PATCH, NAME = 9 * 16 + 4, "patch 148 (row 10, col 5)"  # row 10, column 5 (1-based) of 16 columns


def test_the_overview_heads_and_rollout_pages_call_one_patch_by_one_number():
    at = AppTest.from_file(APP, default_timeout=240)
    at.session_state["patch"] = PATCH
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    grid = next(c for c in at.get("plotly_chart") if "grid" in (c.proto.id or ""))
    text = next(t for t in json.loads(grid.proto.spec)["data"] if t.get("mode") == "text")
    # The label drawn on the patch is its patch number; it was the token's sequence index (CLS = 0), here 149.
    assert text["text"][PATCH] == "148" and text["hovertext"][PATCH] == NAME
    assert any("Patch numbers count from 0 in raster order" in c.value for c in at.caption)

    at.switch_page("pages/2_heads.py").run()
    assert any(c.value.endswith(f"Selected: {NAME}") for c in at.caption), [c.value for c in at.caption]
    heads = next(c for c in at.get("plotly_chart") if "heads_grid" in (c.proto.id or ""))
    hover = next(t for t in json.loads(heads.proto.spec)["data"] if t["type"] == "heatmap")
    assert hover["hovertemplate"].startswith("patch %{customdata[0]} (row %{customdata[1]}, col %{customdata[2]})")
    custom = hover["customdata"]
    if isinstance(custom, dict):  # plotly's typed array: base64 of the (gh, gw, 3) values
        import base64

        import numpy as np
        custom = np.frombuffer(base64.b64decode(custom["bdata"]), dtype=custom["dtype"]).reshape(16, 16, 3).tolist()
    assert custom[9][4] == [148, 10, 5]  # was the token's sequence index, 149
    at.switch_page("pages/3_rollout.py").run()
    at.radio(key="rollout_readout").set_value("clicked patch").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(c.value.endswith(f"Selected: {NAME}") for c in at.caption)
    assert any(c.value.startswith(f"Readout: {NAME}.") for c in at.caption)
