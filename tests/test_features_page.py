"""The Features page (AppTest, bundled model): an SAE folder given, the current image's top latents are the ones its
tokens encode to (computed here without the page), each tile's hover values are that latent's map; mistakes get a
sentence."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ASSETS

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _charts(at) -> dict:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _chart(at, key):
    [spec] = [s for cid, s in _charts(at).items() if key in cid]
    return spec


def _decode(v) -> np.ndarray:
    """A Plotly array as sent: a list, or base64 bytes with dtype and shape."""
    import base64

    if isinstance(v, dict):
        shape = [int(n) for n in str(v.get("shape", -1)).split(",")]
        v = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(shape)
    return np.asarray(v, dtype=float)


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    """A small SAE on the bundled model's layer 9 tokens of one photo, saved as features train saves it."""
    import vitviz
    from vitviz.features import SAE

    lens = vitviz.open("bundled", device="cpu")
    point = "blocks.8.resid_post"
    tokens = lens.trace(lens.preprocess([ASSETS / "astronaut.jpg"]), keep=[point])[point][0, 1:]
    sae = SAE.fit(tokens, latents=64, topk=4, seed=0, epochs=5, batch_size=64)
    sae.info |= {"model": {"name": "bundled", "token_layout": lens.layout.to_dict()}, "point": point,
                 "point_kind": "resid_post", "layer": 9}
    out = tmp_path_factory.mktemp("sae") / "sae"
    sae.save(out)
    return out, sae, tokens


@pytest.mark.slow
def test_features_page_shows_the_images_top_latents_and_their_maps(sae_dir):
    from streamlit.testing.v1 import AppTest

    from vitviz.features.top import image_top_latents

    out, sae, tokens = sae_dir
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/12_features.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Give an SAE above" in i.value for i in at.info)
    at.text_input(key="features_sae").input(str(out)).run()
    assert not at.exception, [e.message for e in at.exception]
    # 5 epochs of 4 steps end on their budget with the explained variance still rising: the page says so
    assert sae.info["training"]["warning"] and any(sae.info["training"]["warning"] in w.value for w in at.warning)
    z = sae.encode(tokens).detach().numpy()  # (256, K), astronaut.jpg is the first sample
    maps = z.T.reshape(64, 16, 16)
    expected = image_top_latents(maps, 8, "max")
    spec = _chart(at, "features_image")
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert [int(t.split()[1]) for t in titles] == [int(j) for j in expected]
    hover = [t for t in spec["data"] if t["type"] == "heatmap"]
    for trace, j in zip(hover, expected):
        got = _decode(trace["z"])
        # the hover heatmap may be drawn bottom-up: compare either orientation; float32 encode vs the page's, ~1e-5
        assert np.allclose(got, maps[j], atol=1e-4) or np.allclose(got[::-1], maps[j], atol=1e-4)
    assert "features_latent_patches" in " ".join(_charts(at)) and "features_histogram" in " ".join(_charts(at))

    assert "features_drivers_fig" not in " ".join(_charts(at))  # nothing computed before it is asked for
    at.toggle(key="features_drivers").set_value(True).run()
    assert not at.exception, [e.message for e in at.exception]
    import vitviz
    from vitviz.features.splice import feature_attribution

    lens = vitviz.open("bundled", device="cpu")
    scores = feature_attribution(lens, lens.preprocess([ASSETS / "astronaut.jpg"]), sae).scores[0]
    top = np.argsort(-np.abs(scores), kind="stable")[:12]
    [bars] = _chart(at, "features_drivers_fig")["data"]
    assert bars["x"] == [f"latent {j}" for j in top]
    np.testing.assert_allclose(_decode(bars["y"]), scores[top], rtol=1e-4, atol=1e-6)  # float32, two forwards

    at.number_input(key="features_del_steps").set_value(2).run()
    at.number_input(key="features_del_seeds").set_value(1).run()
    at.toggle(key="features_deletion").set_value(True).run()
    assert not at.exception, [e.message for e in at.exception]
    from vitviz.features.deletion import concept_deletion

    sample = at.sidebar.multiselect(key="samples").value
    assert sample == ["astronaut.jpg"]  # the page's set: one photo
    d = concept_deletion(lens, lens.preprocess([ASSETS / "astronaut.jpg"]), sae, steps=2, random_seeds=1,
                         names=["astronaut.jpg"])
    lines = {t["name"]: t for t in _chart(at, "features_deletion_fig")["data"]}
    top_line = d.curves[d.curves.order == "top"].sort_values("step").value.to_numpy()
    np.testing.assert_allclose(_decode(lines["top latents by score"]["y"]), top_line, rtol=1e-5)
    assert any(d.sentence.split(" (")[0] in c.value for c in at.caption)

    # a click on the image sets the shared patch (the picker is a browser component AppTest cannot click)
    patch = 4 * 16 + 6
    at.session_state["patch"] = patch
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    firing = np.flatnonzero(z[patch] > 0)
    buttons = {b.key: b for b in at.button if b.key and b.key.startswith("features_open_")}
    assert sorted(int(k.rsplit("_", 1)[1]) for k in buttons) == sorted(firing.tolist())
    for j in firing:  # each button says its latent's activation at the patch, to 3 significant digits
        label = buttons[f"features_open_{j}"].label
        assert label.startswith(f"latent {j} · ")
        assert abs(float(label.split(" · ")[1]) - z[patch, j]) <= 5e-3 * z[patch, j] + 1e-4
    assert any("Patch 70 (row 5, col 7)" in m.value for m in at.markdown)  # named as on every page
    # opening the weakest of them (not one of the image's top latents, typically) shows its view
    weakest = int(firing[np.argmin(z[patch, firing])])
    at.button(key=f"features_open_{weakest}").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="features_latent").value == weakest
    assert f"Latent {weakest}:" in _chart(at, "features_latent_patches")["layout"]["title"]["text"]
    # the bundled model has no head: the nearest classes say why not
    assert any("Nearest classes need a classifier head" in i.value for i in at.info)
    # with a probe head (the sidebar's Head box: here the Probes page's trained probe), its classes are listed
    from test_probe_head import write_probe
    from vitviz.features.classes import nearest_classes

    head = write_probe(lens, out.parent / "probe", layer=12, pooling="cls+mean", seed=3)
    at.session_state["probe_head"] = str(head)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [table] = [d.value for d in at.dataframe if "cosine" in d.value.columns]
    expected = nearest_classes(vitviz.open("bundled", device="cpu", head=head), sae, [weakest], n=5)
    assert table["class"].tolist() == expected.label.tolist() == [f"class {c}" for c in "abc"][:len(table)]
    np.testing.assert_allclose(table["cosine"], expected.cosine.round(4), atol=1e-4)

    at.text_input(key="features_sae").input(str(out.parent / "missing")).run()
    assert any("no such file or folder" in e.value for e in at.error)
