"""The app, driven through Streamlit's AppTest: real uploads, sliders, values checked."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from vitviz.capture import capture
from vitviz.images import load_image, preprocess
from vitviz.maps import query_attention_map

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _heatmap(at):
    """The heatmap values sent to the browser (plotly encodes numpy arrays as typed base64)."""
    data = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    z = next(trace for trace in data if trace["type"] == "heatmap")["z"]
    if isinstance(z, dict):
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape([int(n) for n in str(z["shape"]).split(",")])
    return np.array(z, dtype=float)


def test_app_shows_the_attention_map_the_core_computes(bundled):
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception
    at.slider[0].set_value(4).run()   # layer 4
    at.slider[1].set_value(3).run()   # head 3
    assert not at.exception
    batch = preprocess([load_image(ASSETS / "astronaut.jpg").image], bundled.data_config)
    attention = capture(bundled.model, batch.tensor).attention[0].numpy()
    expected = query_attention_map(attention, bundled.layout, layer=3, head=2, query="cls")
    np.testing.assert_allclose(_heatmap(at), expected, atol=1e-6)
    at.slider[0].set_value(12).run()
    assert not np.allclose(_heatmap(at), expected)


def test_bad_upload_shows_a_sentence_and_the_good_image_still_renders():
    at = AppTest.from_file(APP, default_timeout=120).run()
    good = (ASSETS / "chelsea.jpg").read_bytes()
    at.sidebar.file_uploader[0].set_value([("broken.png", b"not a png", "image/png"),
                                            ("chelsea.jpg", good, "image/jpeg")]).run()
    assert not at.exception
    assert any("broken.png: is not an image file" in e.value for e in at.error)
    assert len(at.get("plotly_chart")) == 1
    assert "chelsea.jpg" in at.get("plotly_chart")[0].proto.spec
