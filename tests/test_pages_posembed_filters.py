"""The filter and position-embedding pages through AppTest: values against the core, selection kept."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from vitviz.analyses.filters import patch_filter_pca, patch_filters
from vitviz.analyses.posembed import patch_position_embeddings, position_embedding_similarity

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _chart(at, key):
    chart = next((c for c in at.get("plotly_chart") if key in (c.proto.id or "")), None)
    assert chart is not None, f"no chart {key}"
    return json.loads(chart.proto.spec)


def _z(trace):
    z = trace["z"]
    if isinstance(z, dict):
        shape = [int(n) for n in str(z["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.array(z, dtype=float)


def _page(page):
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _enlarged(at):
    spec = _chart(at, "pos_one")
    return _z(next(t for t in spec["data"] if t["type"] == "heatmap")), spec["layout"]["title"]["text"]


def test_position_page_sliders_are_1_based_and_the_selection_survives_a_grid_change(bundled):
    at = _page("pages/6_position_embeddings.py")
    at.slider(key="pos_row").set_value(4).run()
    at.slider(key="pos_col").set_value(13).run()
    sim = position_embedding_similarity(patch_position_embeddings(bundled.model, bundled.layout), (16, 16))
    z, title = _enlarged(at)
    np.testing.assert_allclose(z, sim[3, 12], atol=1e-6)
    assert title == "position (row 4, col 13)"

    at.slider(key="pos_grid").set_value(32).run()
    assert not at.exception
    # The centre of tile (row 4, col 13) of 16 lies in (row 8, col 26) of 32 (1-based, both).
    assert (at.slider(key="pos_row").value, at.slider(key="pos_col").value) == (8, 26)
    emb = patch_position_embeddings(bundled.model, bundled.layout, (32, 32), native=bundled.native_pos_embed)
    z, title = _enlarged(at)
    np.testing.assert_allclose(z, position_embedding_similarity(emb, (32, 32))[7, 25], atol=1e-6)
    assert title == "position (row 8, col 26)"
    at.slider(key="pos_grid").set_value(16).run()
    assert (at.slider(key="pos_row").value, at.slider(key="pos_col").value) == (4, 13)
    # Both grids sit in the one byte-bounded store (VITVIZ_CACHE_MB), not in a count-bounded st.cache_data.
    import ui.cache

    shapes = {k[2] for k in ui.cache.store().keys() if k[0] == "position_similarity"}
    assert {(16, 16), (32, 32)} <= shapes


def test_position_page_grid_has_a_fixed_colour_bar_and_1_based_labels():
    at = _page("pages/6_position_embeddings.py")
    spec = _chart(at, "pos_grid_fig")
    scatter = next(t for t in spec["data"] if t["type"] == "scatter")
    assert (scatter["marker"]["cmin"], scatter["marker"]["cmax"]) == (-1, 1)
    assert scatter["marker"]["colorbar"]["title"]["text"] == "cosine similarity"
    assert spec["layout"]["xaxis"]["ticktext"][:3] == ["1", "2", "3"]
    assert any("counted from 1" in c.value for c in at.caption)


def test_filters_page_labels_tiles_with_component_and_variance_share(bundled):
    at = _page("pages/5_filters.py")
    bars = next(t for t in _chart(at, "pca_variance")["data"] if t["type"] == "bar")
    expected = patch_filter_pca(patch_filters(bundled.model)).explained_variance_ratio
    y = bars["y"]
    y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else np.array(y)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    tiles = _chart(at, "pca_tiles")
    assert tiles["data"][0]["type"] == "image"
    # Labels and title are the chart's text (sharp on screen, vector in the SVG/PDF), not pixels of the image.
    assert tiles["data"][1]["text"][:2] == [f"PC1 · {100 * expected[0]:.1f}%", f"PC2 · {100 * expected[1]:.1f}%"]
    assert tiles["layout"]["title"]["text"].startswith("First 28 principal components")
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels.count("Chart (svg)") == labels.count("Chart (pdf)") == 3  # PCA tiles, variance bars, raw filters
