"""The app through Streamlit's AppTest: real uploads, sliders, page switches; values checked against the core."""
import base64
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from vitviz.trace import trace_for_analysis as capture
from vitviz.cli import main as cli_main
from vitviz.io.images import load_image
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.maps import query_attention_map
from vitviz.analyses.rollout import rollout

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _decode(value):
    """Plotly sends numpy arrays as typed base64 ({dtype, bdata, shape})."""
    if isinstance(value, dict) and "bdata" in value:
        shape = [int(n) for n in str(value.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).reshape(shape)
    return np.array(value, dtype=float)


def _traces(at, key):
    chart = next(c for c in at.get("plotly_chart") if c.proto.id and key in c.proto.id) \
        if any(key in (c.proto.id or "") for c in at.get("plotly_chart")) else None
    assert chart is not None, f"no chart {key}"
    return json.loads(chart.proto.spec)["data"]


def _heatmaps(at, key):
    return [_decode(t["z"]) for t in _traces(at, key) if t["type"] == "heatmap"]


def _page(page, uploads=None):
    at = AppTest.from_file(APP, default_timeout=180).run()
    if uploads:
        at.sidebar.file_uploader(key="uploads").set_value(uploads).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _core_attention(bundled, name):
    batch = preprocess([load_image(ASSETS / name).image], bundled.data_config)
    out = capture(bundled.model, batch.tensor)
    return out.stack("attn")[0].numpy(), out.layout


def test_heads_page_map_equals_the_core_function(bundled):
    at = _page("pages/2_heads.py")
    at.slider(key="heads_layer").set_value(3).run()
    assert not at.exception
    attention, layout = _core_attention(bundled, "astronaut.jpg")
    maps = _heatmaps(at, "heads_grid")
    assert len(maps) == 6
    expected = query_attention_map(attention, layout, layer=2, head=1, query="cls")
    np.testing.assert_allclose(maps[1], expected, atol=1e-6)
    at.slider(key="heads_layer").set_value(7).run()
    assert not np.allclose(_heatmaps(at, "heads_grid")[1], expected)
    np.testing.assert_allclose(_heatmaps(at, "heads_grid")[1],
                               query_attention_map(attention, layout, 6, 1, "cls"), atol=1e-6)


def test_heads_page_threshold_mask_and_ranking(bundled):
    at = _page("pages/2_heads.py")
    at.slider(key="keep").set_value(0.5).run()
    masked = _heatmaps(at, "heads_grid")[0]
    assert np.isnan(masked).any() and np.isfinite(masked).any()
    at.selectbox(key="ranking").set_value("entropy (low = focused)").run()
    titles = [a["text"] for a in json.loads(next(c for c in at.get("plotly_chart")
                                                 if "heads_grid" in c.proto.id).proto.spec)["layout"]["annotations"]]
    entropies = [float(t.split(">H ")[1].split(" nats")[0]) for t in titles]
    assert entropies == sorted(entropies)


def test_compare_layers_side_by_side(bundled):
    at = _page("pages/2_heads.py")
    at.slider(key="compare_2_0").set_value(2).run()
    at.slider(key="compare_2_1").set_value(9).run()
    attention, layout = _core_attention(bundled, "astronaut.jpg")
    a, b = _heatmaps(at, "compare_grid")
    np.testing.assert_allclose(a, query_attention_map(attention, layout, 1, 0, "cls"), atol=1e-6)
    np.testing.assert_allclose(b, query_attention_map(attention, layout, 8, 0, "cls"), atol=1e-6)


def test_compare_layers_spread_over_the_depth_when_panels_grow(bundled):
    """2 -> 4 panels once gave layers 1, 12, 8, 12 (the two old sliders kept their values)."""
    at = _page("pages/2_heads.py")
    at.number_input(key="compare_n").set_value(4).run()
    assert [at.slider(key=f"compare_4_{i}").value for i in range(4)] == [1, 5, 8, 12]


def test_bad_upload_shows_a_sentence_and_the_good_image_still_renders():
    good = (ASSETS / "chelsea.jpg").read_bytes()
    at = _page(None, [("broken.png", b"not a png", "image/png"), ("chelsea.jpg", good, "image/jpeg")])
    assert any("broken.png: is not an image file" in e.value for e in at.error)
    assert "chelsea.jpg" in at.sidebar.selectbox(key="current").options
    # The upload survives a page switch and is analysed there.
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception
    assert "chelsea.jpg" in at.sidebar.selectbox(key="current").options
    at.sidebar.selectbox(key="current").set_value("chelsea.jpg").run()
    assert any("chelsea.jpg" in h.value for h in at.header)
    assert len(_heatmaps(at, "heads_grid")) == 6


def test_rollout_page_follows_its_sliders(bundled):
    at = _page("pages/3_rollout.py")
    at.slider(key="discard").set_value(0.5).run()
    at.selectbox(key="fusion").set_value("max").run()
    attention, layout = _core_attention(bundled, "astronaut.jpg")
    expected = rollout(attention, layout, fusion="max", discard=0.5)
    np.testing.assert_allclose(_heatmaps(at, "rollout_fig")[0], expected.map, rtol=1e-5)
    at.slider(key="layer_range").set_value((3, 8)).run()
    partial = rollout(attention, layout, fusion="max", discard=0.5, start=2, end=8)
    np.testing.assert_allclose(_heatmaps(at, "rollout_fig")[0], partial.map, rtol=1e-5)
    assert any("needs a classifier head" in i.value for i in at.info)


def test_rollout_page_rolls_out_a_clicked_patch(bundled):
    at = _page("pages/3_rollout.py")
    at.radio(key="rollout_readout").set_value("clicked patch").run()
    assert any("Click a patch" in i.value for i in at.info)  # nothing drawn before a patch is picked
    at.session_state["patch"] = 37  # the click handler's result (a real click is the browser test's)
    at.run()
    assert not at.exception
    attention, layout = _core_attention(bundled, "astronaut.jpg")
    expected = rollout(attention, layout, query=37)
    assert expected.readout == "patch 37 (raster order, 0-based)"
    np.testing.assert_allclose(_heatmaps(at, "rollout_fig")[0], expected.map, rtol=1e-5)
    assert not np.allclose(expected.map, rollout(attention, layout).map)  # not the CLS readout
    np.testing.assert_allclose(_heatmaps(at, "raw_fig")[0],
                               np.mean([query_attention_map(attention, layout, -1, h, 37) for h in range(6)], axis=0),
                               atol=1e-6)
    assert any("Readout: patch 37 (row 3, col 6)" in c.value for c in at.caption)


def test_distance_page_dots_equal_the_cli(tmp_path):
    at = _page("pages/4_distance.py")
    heads = [t for t in _traces(at, "distance_plot") if t.get("mode") == "markers"]
    assert cli_main(["analyze", str(ASSETS / "astronaut.jpg"), "--out", str(tmp_path)]) == 0
    expected = np.load(tmp_path / "analysis.npz")["mean_distance"]
    assert [t["name"] for t in heads] == [f"head {h + 1}" for h in range(expected.shape[1])]
    np.testing.assert_allclose(np.stack([_decode(t["y"]) for t in heads], axis=1), expected, rtol=1e-6)
    at.radio(key="distance_scope").set_value(at.radio(key="distance_scope").options[1]).run()
    assert not at.exception


def test_filters_and_position_pages(bundled):
    from vitviz.analyses.filters import patch_filter_pca, patch_filters
    from vitviz.analyses.posembed import patch_position_embeddings, position_embedding_similarity

    at = _page("pages/5_filters.py")
    bars = next(t for t in _traces(at, "pca_variance") if t["type"] == "bar")
    expected = patch_filter_pca(patch_filters(bundled.model)).explained_variance_ratio
    np.testing.assert_allclose(_decode(bars["y"]), expected, rtol=1e-6)

    at = _page("pages/6_position_embeddings.py")
    at.slider(key="pos_row").set_value(3).run()
    at.slider(key="pos_col").set_value(12).run()
    sim = position_embedding_similarity(patch_position_embeddings(bundled.model, bundled.layout), (16, 16))
    np.testing.assert_allclose(_heatmaps(at, "pos_one")[0], sim[2, 11], atol=1e-6)
    at.slider(key="pos_grid").set_value(24).run()
    assert not at.exception
    assert _heatmaps(at, "pos_one")[0].shape == (24, 24)


def test_a_model_that_cannot_load_keeps_the_previous_one():
    at = _page("pages/2_heads.py")
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input("vit_not_a_model").run()
    assert any("No timm model" in w.value and "vit_not_a_model" in w.value for w in at.sidebar.warning)
    at.sidebar.text_input(key="timm_query").input("deit3_small").run()
    at.sidebar.selectbox(key="timm_name").set_value("deit3_small_patch16_224.fb_in1k").run()
    # Offline and not in the cache: a sentence naming the model, and the bundled model stays.
    assert any("deit3_small_patch16_224.fb_in1k" in e.value and "bundled" in e.value for e in at.error)
    assert any("previous model" in i.value for i in at.info)
    assert len(_heatmaps(at, "heads_grid")) == 6


def test_concurrent_sessions_match_a_session_alone(bundled):
    """Several sessions in threads, each on its own photo, against the one cached model.

    AppTest keeps a process-global Runtime that each script run creates and deletes, so two
    AppTest runs cannot overlap; the sessions' runs are interleaved under a lock. The cached
    model and per-image results are then hammered by plain threads with no lock at all.
    """
    from PIL import Image

    from ui.cache import cached_image_result, cached_model
    from vitviz.sources.models import ModelSpec

    names = ["chelsea.jpg", "coffee.jpg", "rocket.jpg"]
    lock = threading.Lock()

    def session(name, out, i):
        try:
            with lock:
                at = _page("pages/2_heads.py")
            with lock:
                at.sidebar.multiselect(key="samples").set_value([name]).run()
            with lock:
                at.slider(key="heads_layer").set_value(5).run()
            out[i] = _heatmaps(at, "heads_grid")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread below
            out[i] = exc

    alone = {}
    for i, name in enumerate(names):
        session(name, alone, i)
    together = {}
    threads = [threading.Thread(target=session, args=(n, together, i)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(len(names)):
        assert not isinstance(together[i], BaseException), repr(together[i])
        for a, b in zip(alone[i], together[i]):
            np.testing.assert_array_equal(a, b)
    assert not np.allclose(alone[0][0], alone[1][0])

    # The cache layer itself, 8 threads at once, no lock: one model, results equal to serial.
    spec = ModelSpec()
    model_ids, results = set(), {}
    images = {n: Image.open(ASSETS / n).convert("RGB") for n in names}

    def work(i):
        name = names[i % len(names)]
        model_ids.add(id(cached_model(spec)))
        results[i] = cached_image_result(spec, f"thread-test-{name}", images[name]).attention

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(model_ids) == 1
    for i in range(8):
        serial, _ = _core_attention(bundled, names[i % len(names)])
        np.testing.assert_array_equal(results[i], serial)
