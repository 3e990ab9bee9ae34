"""Downloads that never rerun: every page's buttons are plain browser downloads (``on_click="ignore"``).

(That a click's file arrives, twice, with no spinner left: tests/test_explorer_browser.py for the heads page,
tests/test_walk_items_browser.py for the filters page.)"""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.mark.parametrize("page", ["pages/2_heads.py", "pages/3_rollout.py", "pages/6_position_embeddings.py"])
def test_every_download_button_of_a_page_reruns_nothing(page):
    at = AppTest.from_file(APP, default_timeout=240)
    at.query_params["intro"] = "0"
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    buttons = [b.proto for b in at.get("download_button")]
    assert len(buttons) >= 2
    assert [b.label for b in buttons if not b.ignore_rerun] == []
