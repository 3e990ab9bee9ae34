"""The first visit's explanation (AppTest): on the first page a session opens only, in an expander, gone once closed
and after a reload of a closed one (``?intro=0``). (Collapsing it and the one click from a sample to the heads page
are in tests/test_explorer_browser.py: AppTest neither toggles expanders nor follows st.switch_page under
st.navigation, and its switch_page runs a page without app.py, so the page changes here are a stand-in script's.)"""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
LABEL = "New here? What vitviz shows"


def _explained(at) -> bool:
    return any(e.label == LABEL for e in at.expander)


def _run(at) -> AppTest:
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _pages():
    """app.py's call as a page switch makes it: first_visit with the URL path of the page being run."""
    import streamlit as st

    from ui.onboarding import first_visit

    first_visit(st.session_state.get("page_now", ""))


def _visit(at, page: str) -> AppTest:
    at.session_state["page_now"] = page
    return _run(at)


def test_the_app_opens_with_the_explanation_and_close_removes_it():
    at = _run(AppTest.from_file(APP, default_timeout=240))
    intro = next(e for e in at.expander if e.label == LABEL)
    assert intro.proto.expanded  # open on a first visit
    assert {b.key for b in at.button} >= {"intro_chelsea.jpg", "intro_astronaut.jpg", "intro_close"}
    at.button(key="intro_close").click()
    _run(at)
    assert not _explained(at)
    assert at.query_params["intro"] == "0"  # F5 or a shared link after closing: the URL says it was read
    reloaded = AppTest.from_file(APP, default_timeout=240)
    reloaded.query_params["intro"] = "0"
    assert not _explained(_run(reloaded))


def test_the_explanation_stands_on_the_first_page_only():
    at = _visit(AppTest.from_function(_pages), "rollout")  # a session that opens on the rollout page
    assert _explained(at)
    assert not _explained(_visit(at, ""))  # the overview, visited second: not above it
    assert not _explained(_visit(at, "distance"))
    assert _explained(_visit(at, "rollout"))  # back on the first page: still there until closed
    at.button(key="intro_close").click()
    _run(at)
    assert not _explained(at) and not _explained(_visit(at, "rollout"))
