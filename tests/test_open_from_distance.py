"""A head opened from the distance plot: the heads page shows its layer and head, and says so while it shows them
(AppTest, the server-drawn grid)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
NOTE = "Opened from the distance plot: layer 4, head 5"


def _notes(at) -> list[str]:
    return [s.value for s in at.success if s.value.startswith("Opened from the distance plot")]


def test_the_opened_note_stays_through_a_rerun_and_goes_with_another_layer():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.session_state["opened_from_distance"] = (4, 5)  # what the distance page sets before switch_page
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.slider(key="heads_layer").value == 4 and at.selectbox(key="compare_head").value == 5
    assert [n[:len(NOTE)] for n in _notes(at)] == [NOTE]
    assert at.query_params["layer"] == "4" and at.query_params["chead"] == "5"
    at.run()  # a rerun that changes nothing the note speaks of (CI once lost the note to one)
    assert [n[:len(NOTE)] for n in _notes(at)] == [NOTE]
    # A rerun whose URL still holds the view from before the switch (a browser that sent it before applying the new
    # query string): the server-drawn grid shows its widgets' layer and head, so the note stays.
    at.query_params["layer"], at.query_params["chead"] = "12", "1"
    at.run()
    assert at.slider(key="heads_layer").value == 4
    assert [n[:len(NOTE)] for n in _notes(at)] == [NOTE]
    at.slider(key="heads_layer").set_value(3).run()  # another layer: the note no longer says what is shown
    assert _notes(at) == []
    at.slider(key="heads_layer").set_value(4).run()  # and does not come back with the layer
    assert _notes(at) == []


def test_in_the_browser_drawn_grid_the_note_follows_the_reported_view(monkeypatch):
    monkeypatch.setenv("VITVIZ_DRAW", "browser")  # no widgets: the grid's layer and head are the view it reports
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.session_state["opened_from_distance"] = (4, 5)
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert [n[:len(NOTE)] for n in _notes(at)] == [NOTE]
    at.run()
    assert [n[:len(NOTE)] for n in _notes(at)] == [NOTE]
    at.query_params["layer"] = "3"  # the browser moved its layer and wrote the URL (ui.persist.remember_view)
    at.run()
    assert _notes(at) == []
