"""The Queries & keys page (AppTest, bundled model, the default sample photo): the scatter is the library's picture,
nothing else is computed on the first paint, and the ablation heatmap is the library's effects."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ASSETS

APP = str(Path(__file__).resolve().parent.parent / "app.py")
pytestmark = pytest.mark.slow


def _charts(at) -> dict:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _chart(at, key: str) -> dict:
    found = [spec for chart_id, spec in _charts(at).items() if key in chart_id]
    assert len(found) == 1, (key, list(_charts(at)))
    return found[0]


def _values(v) -> np.ndarray:
    if isinstance(v, dict):  # plotly's typed arrays
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).astype(float)
    return np.asarray(v, dtype=float)


def test_queries_and_keys_page_draws_the_library_picture_and_the_ablation_on_demand(bundled):
    from streamlit.testing.v1 import AppTest

    import vitviz
    from ui.state import SAMPLES
    from vitviz.heads import patching, qk

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/13_queries_keys.py").run()
    assert not at.exception, [e.message for e in at.exception]
    ids = " ".join(_charts(at))
    assert "qk_grid" not in ids and "heads_ablation_map" not in ids  # computed only when asked
    lens = vitviz.Lens(bundled)
    x = lens.preprocess([ASSETS / SAMPLES[0]])
    L = lens.num_layers
    expected = qk.layer_pictures(lens, x, L - 1, [0], "pca").pictures[0]
    spec = _chart(at, "qk_scatter")
    queries = next(t for t in spec["data"] if t["name"] == "queries")
    np.testing.assert_allclose(_values(queries["x"]), expected.xy[expected.kind == "query", 0], atol=1e-5)
    np.testing.assert_allclose(_values(queries["y"]), expected.xy[expected.kind == "query", 1], atol=1e-5)
    assert f"{expected.correlation_after:+.2f}" in spec["layout"]["title"]["text"]

    layer = 5  # layer 6 (0-based 5): its heads' ablation can change layer 7's attention
    at.slider(key="qk_layer").set_value(layer + 1).run()
    at.button(key="heads_ablate_button").click().run()
    assert not at.exception, [e.message for e in at.exception]
    [heatmap] = [t for t in _chart(at, "heads_ablation_map")["data"] if t["type"] == "heatmap"]
    effects = patching.ablate(lens, x, [(layer, h) for h in range(lens.num_heads)], "zero")
    change = 1.0 - effects.grid("pooled_cosine", L, lens.num_heads)[layer]
    np.testing.assert_allclose(_values(heatmap["z"]).reshape(-1), change, atol=1e-6)
    # the maps before and after switching off the head with the largest effect: the library's readout maps of the
    # next layer
    strongest = int(np.argmax(change))
    assert at.selectbox(key="heads_ablate_show").value == (layer, strongest)
    maps = [t for t in _chart(at, "heads_before_after")["data"] if t["type"] == "heatmap"]
    assert len(maps) == 2
    before = patching.readout_maps(lens, x, layer=layer + 1)
    after = patching.readout_maps(lens, x, patching.ablation_edit([(layer, strongest)], "zero"), layer=layer + 1)
    assert np.abs(after - before).max() > 1e-4
    for trace, expected in zip(maps, (before, after)):
        np.testing.assert_allclose(_values(trace["z"]).reshape(after.shape), expected, rtol=1e-5, atol=1e-7)
