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
    from ui.keys import PROBE_HEAD

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
    patch_chart = _chart(at, "readout_patch_lens")["data"]
    hover = next(t for t in patch_chart if t.get("type") == "heatmap")
    per_patch = vitviz.logit_lens(headed, [f"assets/{name}"], per_patch=True).patches[0, -1, 1:]  # last block
    probs = np.exp(per_patch - per_patch.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True))[:, final]
    np.testing.assert_allclose(np.sort(_decode(hover["z"]).ravel()), np.sort(probs), rtol=1e-4, atol=1e-6)
    next(b for b in at.button if b.key == "readout_tuned").click().run()
    assert not at.exception and not at.error
    fit = next(d.value for d in at.dataframe if "KL tuned (nats)" in d.value.columns)
    assert list(fit["block"]) == list(range(1, 13)) and set(fit["images held out"]) == {1}
    at.toggle(key="readout_names").set_value(True).run()
    assert not at.exception and not at.error
    hover = _chart(at, "readout_heatmap")["data"][0]["text"]
    assert any("writes toward: class" in cell for row in hover for cell in row)

    # The heads page names every head the same way (its first rank over the image set)
    at.switch_page("pages/2_heads.py").run()
    at.toggle(key="heads_names_on").set_value(True).run()
    assert not at.exception and not at.error
    grid = at.dataframe[0].value
    assert grid.shape == (12, 6) and list(grid.index[:2]) == ["layer 1", "layer 2"]
    names = vitviz.residual.head_names(headed, [f"assets/{n}" for n in ("chelsea.jpg", "coffee.jpg")])
    first = names[(names["rank"] == 1) & (names.layer == 11) & (names["head"] == 3)].iloc[0]
    assert grid.loc["layer 12", "head 4"].startswith(first.label + " (")


def test_the_readout_page_splits_clips_score_for_the_typed_text_and_names_heads_with_textspan(tmp_path):
    """A saved tiny CLIPModel folder picked in the sidebar: the target is the typed text's score, its heads' values
    are vitviz.readout's with vitviz.TextTarget of that text, and TextSpan's table lists the late heads."""
    from streamlit.testing.v1 import AppTest

    from tiny_clip import save_tiny_clip

    folder = save_tiny_clip(tmp_path / "clip")
    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["chelsea.jpg", "coffee.jpg"]
    at.run()
    at.sidebar.selectbox(key="model_choice").set_value("Hugging Face (hub id or local folder)").run()
    at.sidebar.text_input(key="hf_name").input(folder).run()
    at.switch_page("pages/16_readout.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.text_input(key="readout_text").input("a red car").run()
    assert not at.exception and not at.error
    name = at.header[0].value.split(" · ")[1]
    lens = vitviz.open(folder, device="cpu")
    expected = vitviz.readout(lens, [f"assets/{name}"], target=vitviz.TextTarget("a red car"))
    heat = _chart(at, "readout_heatmap")["data"][0]
    np.testing.assert_allclose(_decode(heat["z"]), expected.heads[0], rtol=1e-5,
                               atol=1e-6 * np.abs(expected.heads).max())
    next(b for b in at.button if b.key == "readout_textspan").click().run()
    assert not at.exception and not at.error
    spans = next(d.value for d in at.dataframe if "variance explained" in d.value.columns)
    assert set(spans.layer) == {1, 2, 3} and spans["rank"].max() == 3
