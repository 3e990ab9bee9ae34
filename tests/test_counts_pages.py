"""Counts on the Compare models page in plain words, with one image and with two (AppTest)."""
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.mark.parametrize("samples, words", [(["astronaut.jpg"], "1 image"),
                                            (["astronaut.jpg", "chelsea.jpg"], "2 images")])
def test_the_compare_page_counts_the_sidebars_images_in_words(samples, words):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["kept_samples"] = samples
    at.run()
    at.switch_page("pages/9_compare.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.button(key="compare_run").label == f"Add this session's {words} with the current model"
    assert any(f"(the sidebar holds {words})" in i.value for i in at.info)
