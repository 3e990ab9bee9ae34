"""The painted-concepts page: patches painted on an image, a probe per layer, probability maps of every image on one
0-1 scale; then the Attribution page explains the concept."""
import json
from pathlib import Path

import numpy as np
import pytest

from test_app import _decode

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
EYES = [r * 16 + c for r in range(5, 8) for c in range(3, 7)] + [r * 16 + c for r in range(6, 9) for c in range(11, 15)]


@pytest.mark.slow
def test_a_painted_concept_is_probed_on_every_layer_mapped_on_every_image_and_explained(bundled):
    from streamlit.testing.v1 import AppTest

    from vitviz.io.images import load_image

    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]
    at.run()
    at.switch_page("pages/15_concepts.py").run()
    assert not at.exception
    assert any("Paint some patches" in i.value for i in at.info)
    sha = load_image(ROOT / "assets" / "chelsea.jpg", "chelsea.jpg").sha256
    at.session_state["concept_paint"] = {(sha, 16, 16): {"concept": set(EYES), "not": set()}}  # what clicks paint
    at.run()
    assert any("chelsea.jpg: 24 concept patches, 0 not-concept patches" in m.value for m in at.markdown)
    next(b for b in at.button if "Fit the concept" in b.label).click().run()
    assert not at.exception and not at.error
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    accuracy = next(v for k, v in charts.items() if "concept_accuracy" in k)
    assert accuracy["data"][0]["x"] == list(range(1, 13)) and accuracy["data"][2]["y"] == [50, 50]
    assert all(0 <= y <= 100 for y in accuracy["data"][0]["y"])
    maps = next(v for k, v in charts.items() if "concept_maps" in k)
    bar = next(t for t in maps["data"] if t.get("marker", {}).get("showscale"))
    assert bar["marker"]["colorbar"]["title"]["text"] == "probability (0-1)"
    assert (bar["marker"]["cmin"], bar["marker"]["cmax"]) == (0.0, 1.0)
    hovers = [t for t in maps["data"] if t["type"] == "heatmap"]
    assert len(hovers) == 4  # every image of the session
    concept = at.session_state["concept_fitted"][1]
    layer = at.slider(key="concept_layer").value
    for tile, image in zip(hovers, [0, 1, 2, 3]):  # the current image (the first sample) first, then the others
        np.testing.assert_allclose(_decode(tile["z"]), concept.probability[image, layer - 1], rtol=1e-6)

    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception
    at.radio(key="attr_concept_what").set_value("the painted concept").run()
    assert not at.exception and not at.error
    methods = at.multiselect(key="attr_methods")
    assert "LeGrad" not in methods.options and "AttnLRP" in methods.options
    captions = " ".join(c.value for c in at.caption)
    assert "LeGrad cannot explain painted concept's logit at layer" in captions
    assert "painted concept's logit at layer" in captions and "summed over the patches" in captions
    at.session_state["patch"] = 100  # a patch picked on another page
    at.run()
    at.radio(key="attr_concept_where").set_value("at the selected patch").run()
    assert not at.exception and not at.error
    assert "at patch 100" in " ".join(c.value for c in at.caption)


@pytest.mark.slow
def test_a_click_toggles_a_patch_a_drag_paints_a_rectangle_and_no_gesture_is_replayed_after_another_image(bundled):
    from streamlit.testing.v1 import AppTest

    from vitviz.io.images import load_image

    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["chelsea.jpg", "rocket.jpg"]
    at.run()
    at.switch_page("pages/15_concepts.py").run()
    sha = {n: load_image(ROOT / "assets" / n, n).sha256 for n in ("chelsea.jpg", "rocket.jpg")}

    def click(name, row, col, when, to=None):  # what the picker sends: mouse down and up on the 448 px picture
        row2, col2 = to or (row, col)              # (2x the 224 px input, 28 px a patch)
        at.selectbox(key="concept_image").set_value(name)
        at.session_state[f"concept_click_{sha[name][:12]}"] = {
            "x1": col * 28 + 5, "y1": row * 28 + 5, "x2": col2 * 28 + 20, "y2": row2 * 28 + 20, "width": 448,
            "height": 448, "unix_time": when}
        at.run()
        assert not at.exception

    def painted(name):
        return at.session_state["concept_paint"][(sha[name], 16, 16)]["concept"]

    click("chelsea.jpg", 2, 15, 1)
    assert painted("chelsea.jpg") == {2 * 16 + 15}
    click("rocket.jpg", 15, 0, 2)
    assert painted("rocket.jpg") == {15 * 16}
    at.selectbox(key="concept_image").set_value("chelsea.jpg").run()  # back: chelsea's last click is not applied again
    assert painted("chelsea.jpg") == {2 * 16 + 15}
    click("chelsea.jpg", 2, 15, 3)  # a second click on the same patch takes it out
    assert painted("chelsea.jpg") == set()
    click("chelsea.jpg", 5, 3, 4, to=(7, 6))  # a drag paints the rectangle it spans: rows 5-7 x columns 3-6
    assert painted("chelsea.jpg") == {r * 16 + c for r in range(5, 8) for c in range(3, 7)}
    at.radio(key="concept_brush").set_value("not concept")
    click("chelsea.jpg", 7, 6, 5, to=(7, 5))  # over two painted patches with the other brush: they change sides
    assert painted("chelsea.jpg") == {r * 16 + c for r in range(5, 8) for c in range(3, 7)} - {117, 118}
    assert at.session_state["concept_paint"][(sha["chelsea.jpg"], 16, 16)]["not"] == {117, 118}


def _parent_of(node, key):
    """The block whose own children hold the widget ``key`` (AppTest's tree has no parent links)."""
    for child in getattr(node, "children", {}).values():
        if getattr(child, "key", None) == key:
            return node
        found = _parent_of(child, key)
        if found is not None:
            return found
    return None


def test_the_two_clear_buttons_sit_side_by_side_as_wide_as_their_labels(bundled):
    """Equal half-width columns put "Clear every image" in the middle of the picture's width, far from its twin
    (1440x900); one wrapping row (ui.downloads.button_row) keeps them together, each as wide as its label."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    at.switch_page("pages/15_concepts.py").run()
    assert not at.exception
    row = _parent_of(at.main, "concept_clear")
    assert row is not None and type(row).__name__ == "Block", type(row).__name__  # not a Column of st.columns
    assert "concept_clear_all" in [getattr(c, "key", None) for c in row.children.values()]
    assert row.proto.flex_container.direction == row.proto.flex_container.Direction.HORIZONTAL
    assert row.proto.flex_container.wrap
