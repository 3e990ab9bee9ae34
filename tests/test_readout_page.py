"""The Readout page: the heads' direct contributions of the current image, a clicked head's patches, the logit lens
with a probe head, the heads named by class — against the library's own readout of the same image."""
import json
from pathlib import Path

import numpy as np
import pytest

import vitviz
from test_app import _decode

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _chart(at, key: str) -> dict:
    return json.loads(next(c for c in at.get("plotly_chart") if key in c.proto.id).proto.spec)


@pytest.mark.slow
def test_the_readout_page_shows_the_current_images_parts_and_with_a_probe_head_the_logit_lens(bundled, tmp_path):
    from streamlit.testing.v1 import AppTest

    from test_probe_head import write_probe
    from ui.state import PROBE_HEAD

    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["chelsea.jpg", "coffee.jpg"]
    at.run()
    at.switch_page("pages/16_readout.py").run()
    assert not at.exception and not at.error
    assert at.header[0].value.startswith("Readout · ")
    name = at.header[0].value.split(" · ")[1]
    lens = vitviz.open("bundled", device="cpu")
    expected = vitviz.readout(lens, [f"assets/{name}"])
    heat = _chart(at, "readout_heatmap")["data"][0]
    np.testing.assert_allclose(_decode(heat["z"]), expected.heads[0], rtol=1e-5,
                               atol=1e-6 * np.abs(expected.heads).max())
    shown = " ".join(m.value for m in at.markdown)
    assert f"= **{expected.total[0]:.4g}**" in shown
    assert any("no classes to read the layers in" in i.value for i in at.info)  # headless: no logit lens

    probe = write_probe(lens, tmp_path, layer=12, pooling="cls+mean", seed=3)
    at.session_state[PROBE_HEAD] = str(probe)
    at.run()
    assert not at.exception and not at.error
    headed = vitviz.open("bundled", device="cpu", head=probe)
    ll = vitviz.logit_lens(headed, [f"assets/{n}" for n in ("chelsea.jpg", "coffee.jpg")])
    index = ["chelsea.jpg", "coffee.jpg"].index(name)
    lens_chart = _chart(at, "readout_lens")["data"][0]
    final = int(ll.logits[index, -1].argmax())
    assert lens_chart["x"][0] == f"{final}: class {'abc'[final]}"
    np.testing.assert_allclose(_decode(lens_chart["z"])[:, 0], ll.probabilities()[index, :, final],
                               rtol=1e-5, atol=1e-7)
    target = next(s for s in at.selectbox if s.key == "readout_target")
    assert target.value.startswith(f"{final}: class {'abc'[final]}")
    at.toggle(key="readout_names").set_value(True).run()
    assert not at.exception and not at.error
    hover = _chart(at, "readout_heatmap")["data"][0]["text"]
    assert any("writes toward: class" in cell for row in hover for cell in row)
