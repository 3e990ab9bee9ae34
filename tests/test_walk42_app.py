"""Issue 42's walk as AppTest sees it: what the screen says in words where it showed code names (the Probes page's
rule and columns are in tests/test_probes_page.py, the sample set after an upload in tests/test_sidebar.py)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
CODE_NAMES = ("embed_dim", "num_classes", "weights_source", "forward_head", "pre_logits", "vitviz.open", "ReLU(Σ",
              "probe.safetensors'", "z point")


def _screen_text(at) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "error", "warning", "header") for e in at.get(kind)]
    parts += [str(t.value) for t in at.get("table")] + [str(d.value) for d in at.dataframe]
    parts += [w.label for kind in ("file_uploader", "button", "selectbox") for w in at.get(kind)]
    return "\n".join(parts)


def test_the_model_card_and_the_head_box_say_words_not_code_names():
    at = AppTest.from_file(APP, default_timeout=240).run()
    assert not at.exception, [e.message for e in at.exception]
    card = next(t for t in at.get("table"))
    rows = list(card.value.index)
    assert {"token width (dimensions)", "classes (0: no classifier)", "weights from"} <= set(rows), rows
    text = _screen_text(at)
    assert not [name for name in CODE_NAMES if name in text], text
    assert "Head: a trained probe (optional)" in [u.label for u in at.get("file_uploader")]


def test_the_readout_page_says_how_to_give_a_head_in_the_apps_words():
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.switch_page("pages/16_readout.py").run()
    assert not at.exception, [e.message for e in at.exception]
    lens_info = [i.value for i in at.info if "no classifier head" in i.value]
    assert lens_info and "Probes page" in lens_info[0], [i.value for i in at.info]
    assert not [name for name in CODE_NAMES if name in _screen_text(at)]


def test_the_compare_table_shows_every_layer_without_an_inner_scroll(monkeypatch):
    """Streamlit's default height shows ten rows and scrolls the rest inside the table (layers 11-12 were hidden);
    the height the page asks for is what the browser draws (AppTest keeps no height, so the call is read)."""
    import numpy as np
    import streamlit as st
    from test_compare import parquet_bytes, stats_table

    heights = {}
    real = st.dataframe
    monkeypatch.setattr(st, "dataframe", lambda data, **kw: heights.update({kw.get("key"): kw.get("height")})
                        or real(data, **kw))
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.switch_page("pages/9_compare.py").run()
    at.file_uploader(key="compare_uploads").set_value(
        [("stats.parquet", parquet_bytes(stats_table("bundled", np.full((1, 12, 6), 50.0))), "application/octet-stream")]).run()
    at.button(key="compare_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(next(d for d in at.dataframe if "bundled (this session)" in d.value.columns).value) == 12
    assert heights["compare_table"] == "content"
