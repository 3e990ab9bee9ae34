"""ui/guard.py: an exception while drawing shows vitviz's sentence where it happened and the page goes on; what the
page drew before stays; Streamlit's own control flow (st.stop) passes through."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _sections():
    import streamlit as st

    from ui.guard import guarded
    from vitviz.errors import VitvizError

    st.markdown("drawn before")
    with guarded("the first map"):
        st.markdown("first map, top half")
        raise KeyError(b"image")
    with guarded("the second map"):
        raise VitvizError("photo.jpg: not an image the model can read.")

    @guarded("the third map")
    def third():
        raise ZeroDivisionError("division by zero")

    third()
    st.markdown("drawn after")
    with guarded("the end"):
        st.stop()
    st.markdown("never drawn")


def test_a_failing_section_shows_the_sentence_and_the_rest_of_the_page_is_drawn():
    at = AppTest.from_function(_sections).run()
    assert not at.exception, [e.message for e in at.exception]
    assert [e.value for e in at.error] == [
        "vitviz could not draw the first map (KeyError: b'image'). This is a fault in vitviz, not in your image or "
        "settings; the rest of the page is shown, and the details are in the server's log.",
        "photo.jpg: not an image the model can read.",
        "vitviz could not draw the third map (ZeroDivisionError: division by zero). This is a fault in vitviz, not in "
        "your image or settings; the rest of the page is shown, and the details are in the server's log."]
    assert [m.value for m in at.markdown] == ["drawn before", "first map, top half", "drawn after"]


@pytest.mark.slow
def test_app_py_runs_every_page_inside_the_guard(monkeypatch):
    """A fault outside any section (here in the Overview page's call of view_applies) is caught by app.py's guard:
    the sentence names the page, and what the page drew before stays."""
    import ui.state

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(ui.state, "view_applies", broken)
    at = AppTest.from_file(APP, default_timeout=180).run()
    assert not at.exception, [e.message for e in at.exception]
    assert [e.value for e in at.error if "planted" in e.value] == [
        "vitviz could not draw the Overview page (RuntimeError: planted). This is a fault in vitviz, not in "
        "your image or settings; the rest of the page is shown, and the details are in the server's log."]
    assert any(t.value.endswith("as the model sees it") for t in at.header)  # drawn before the fault
    assert any(s.value == "Model" for s in at.subheader)


@pytest.mark.slow
def test_a_failing_chart_on_the_registers_page_leaves_the_sections_after_it(monkeypatch):
    import vitviz.figures.registers_figures

    def broken(*args, **kwargs):
        raise ValueError("planted")

    monkeypatch.setattr(vitviz.figures.registers_figures, "norm_by_layer", broken)
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert [e.value for e in at.error][0].startswith("vitviz could not draw the token norms by layer (ValueError: planted)")
    assert any("No outliers: nothing to repair" in i.value for i in at.info)
    assert any("Sink masking" in s.value for s in at.subheader)
