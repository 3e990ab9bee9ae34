"""The attribution panel beside rollout and under the heads grid: the Attribution page's cached computation, target
and figure, one method at a time, computed only when chosen; refusals are the model's sentences."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import ASSETS
import attribution_names as A
from vitviz.figures.attribution_figures import maps_figure
from vitviz.io.images import load_image
from vitviz.sources.preprocess import preprocess

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _z(trace) -> np.ndarray:
    """A heatmap's values as drawn (row 0 at the bottom) turned back to the array's order (row 0 at the top)."""
    v = trace["z"]
    if isinstance(v, dict):
        shape = [int(n) for n in str(v["shape"]).split(",")]
        v = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(shape)
    return np.asarray(v, dtype=float)[::-1]


def _charts(at) -> dict:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def _chart(at, key: str) -> dict:
    found = [spec for chart_id, spec in _charts(at).items() if key in chart_id]
    assert len(found) == 1, (key, list(_charts(at)))
    return found[0]


def _heatmaps(spec: dict) -> list[dict]:
    return [t for t in spec["data"] if t["type"] == "heatmap"]


def _input(bundled, name: str):
    return preprocess([load_image(ASSETS / name).image], bundled.data_config).tensor


def _close(shown, ref):
    # Float32 relevance of a 224 px ViT-S: rounding moves each patch sum by ~1e-7 of the largest; 1e-5 of the
    # largest is far below the differences between methods or images (order 1 of the largest).
    np.testing.assert_allclose(shown, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_a_map_beside_another_figure_drops_the_input_and_wraps_its_title():
    """One signed patch map [[-2, 0], [1, 4]]: its limits are ±(99th percentile of |value|) = 2 + 0.97 * (4 - 2)
    = 3.94 (numpy's linear interpolation over 0, 1, 2, 4), so one patch (4) is clipped, and the title says so."""
    grid = np.array([[[-2.0, 0.0], [1.0, 4.0]]])
    res = A.Attribution("attnlrp", grid, None, np.array([3.0]), A.Projection(vector="forward_head(pre_logits=True)"))
    fig = maps_figure(Image.new("RGB", (32, 32)), [res], pixels=False, target_text=res.target.text(),
                      with_input=False, wrap=40)
    assert [t.type for t in fig.data] == ["image", "heatmap"]  # the map over the model input, then its values
    np.testing.assert_array_equal(np.asarray(fig.data[1].z)[::-1], grid[0])
    assert fig.data[1].zmin == pytest.approx(-3.94) and fig.data[1].zmax == pytest.approx(3.94)
    lines = fig.layout.title.text.split("<br>")
    plain = [line.removeprefix("<sup>").removesuffix("</sup>") for line in lines]
    assert all(len(p) <= 40 for p, line in zip(plain, lines) if not line.startswith("<sup>"))
    assert all(len(p) <= 56 for p in plain)
    text = " ".join(plain)
    assert "Attribution of the projection of forward_head(pre_logits=True) on its unperturbed direction" in text
    assert "red raises the target" in text and "1 patch beyond ±3.94 drawn at the end colour" in text
    # The Attribution page's figure: the input first, the title wrapped to the figure's own width (as wide as its
    # tiles and their colour bars: a one-line title ran past it)
    full = maps_figure(Image.new("RGB", (32, 32)), [res], pixels=False, target_text=res.target.text())
    assert [t.type for t in full.data] == ["image", "image", "heatmap"]
    lines = [line for line in full.layout.title.text.split("<br>") if not line.startswith("<sup>")]
    assert " ".join(lines) == "Attribution of the " + res.target.text()
    assert all(len(line) * 9 <= full.layout.width for line in lines)


@pytest.mark.slow
def test_rollout_panel_shows_the_attribution_pages_map_for_the_same_settings(bundled):
    """Off on the first paint; chosen, it draws the library's AttnLRP of the current image, the same values as the
    Attribution page's, with the target stated; LeGrad and another image follow."""
    from streamlit.testing.v1 import AppTest

    from ui.state import SAMPLES

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/3_rollout.py").run()
    assert not at.exception, [e.message for e in at.exception]
    ids = " ".join(_charts(at))
    assert "raw_fig" in ids and "rollout_attr_fig" not in ids  # nothing computed until asked for
    at.radio(key="rollout_beside").set_value("attribution").run()
    assert not at.exception, [e.message for e in at.exception]
    spec = _chart(at, "rollout_attr_fig")
    [trace] = _heatmaps(spec)
    title = spec["layout"]["title"]["text"].replace("<br>", " ")
    assert "Attribution of the projection of" in title and "signed maps" in title
    assert trace["zmin"] == -trace["zmax"]  # the colour bar centred on 0
    panel = _z(trace)
    x = _input(bundled, SAMPLES[0])
    attnlrp = A.relevance(bundled.model, x, "attnlrp").patches[0]
    _close(panel, attnlrp)
    assert any("Target: projection of" in c.value for c in at.caption)

    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    page = _z(_heatmaps(_chart(at, "attr_maps"))[0])  # AttnLRP, patches: the page's defaults
    _close(panel, page)

    at.switch_page("pages/3_rollout.py").run()
    at.radio(key="rollout_beside").set_value("attribution").run()
    at.selectbox(key="rollout_attr_method").set_value("legrad").run()
    assert not at.exception, [e.message for e in at.exception]
    legrad = _z(_heatmaps(_chart(at, "rollout_attr_fig"))[0])
    _close(legrad, A.legrad(bundled.model, x).patches[0])
    assert np.abs(legrad - attnlrp).max() > 0.1 * np.abs(attnlrp).max()

    other = next(n for n in SAMPLES if n != SAMPLES[0])
    at.sidebar.multiselect(key="samples").set_value([SAMPLES[0], other]).run()
    at.sidebar.selectbox(key="current").set_value(other).run()
    assert not at.exception, [e.message for e in at.exception]
    shown = _z(_heatmaps(_chart(at, "rollout_attr_fig"))[0])
    _close(shown, A.legrad(bundled.model, _input(bundled, other)).patches[0])


@pytest.mark.slow
def test_rollout_panel_says_why_a_method_or_the_view_is_refused(bundled, monkeypatch):
    """A method the model refuses is not offered and its sentence is shown (AttnLRP refused: CP-LRP is drawn); a
    family attribution cannot reach gives its one sentence, and the rest of the rollout page is still drawn."""
    from streamlit.testing.v1 import AppTest

    from ui.state import SAMPLES
    from vitviz.adapters import Adapter, adapter_for

    family = type(adapter_for(bundled.model))
    planted = "AttnLRP is refused for this model (a sentence planted by the test)."
    monkeypatch.setattr(family, "why_not_attribution",
                        lambda self, model, method: planted if method == "attnlrp" else None)
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/3_rollout.py").run()
    at.radio(key="rollout_beside").set_value("attribution").run()
    assert not at.exception, [e.message for e in at.exception]
    box = at.selectbox(key="rollout_attr_method")
    assert "AttnLRP" not in box.options and box.value == "cp-lrp"
    assert any(planted in c.value for c in at.caption)
    _close(_z(_heatmaps(_chart(at, "rollout_attr_fig"))[0]),
           A.relevance(bundled.model, _input(bundled, SAMPLES[0]), "cp-lrp").patches[0])

    monkeypatch.setattr(family, "why_not_attribution", Adapter.why_not_attribution)
    monkeypatch.setattr(family, "readout", Adapter.readout)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Attribution (AttnLRP, LeGrad, Grad-CAM) is not supported yet" in i.value for i in at.info)
    ids = " ".join(_charts(at))
    assert "rollout_attr_fig" not in ids and "rollout_fig" in ids
    assert any("Attention flow" in s.value for s in at.subheader)  # the page went on below the panel


@pytest.mark.slow
def test_heads_page_shows_an_attribution_map_when_asked(bundled):
    """The heads page (issue 22: the methods on the heads and rollout pages too): nothing is computed on the first
    paint; switched on, it draws the library's AttnLRP of the current image, and Grad-CAM when chosen."""
    from streamlit.testing.v1 import AppTest

    from ui.state import SAMPLES

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert "heads_attr_fig" not in " ".join(_charts(at))  # nothing computed until asked for
    at.toggle(key="heads_attr_on").set_value(True).run()
    assert not at.exception, [e.message for e in at.exception]
    [trace] = _heatmaps(_chart(at, "heads_attr_fig"))
    assert trace["zmin"] == -trace["zmax"]  # signed AttnLRP, centred on 0
    x = _input(bundled, SAMPLES[0])
    _close(_z(trace), A.relevance(bundled.model, x, "attnlrp").patches[0])
    at.selectbox(key="heads_attr_method").set_value("gradcam").run()
    assert not at.exception, [e.message for e in at.exception]
    _close(_z(_heatmaps(_chart(at, "heads_attr_fig"))[0]), A.gradcam(bundled.model, x).patches[0])


def test_attribution_maps_are_drawn_over_the_model_input_with_the_display_choices():
    """Each method's map is a tile over the model input, coloured as the attention maps are: AttnLRP (signed)
    diverging, 0 letting the photo through under 'transparent where low'; LeGrad (non-negative) on the Display's
    sequential map; a heatmap overlay at opacity 1 shows the colours alone. Three panels a row, each row
    ``plot_height`` tall (the heads tiles' size on the page)."""
    import io

    from vitviz.figures.colour import lookup_table

    def tile(fig, i):
        source = [t for t in fig.data if t.type == "image"][i].source
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).convert("RGB"))

    photo = Image.new("RGB", (32, 32), (90, 160, 40))
    signed = A.Attribution("attnlrp", np.array([[[-2.0, 0.0], [1.0, 2.0]]]), None, np.array([1.0]), A.Projection())
    legrad = A.Attribution("legrad", np.array([[[0.0, 0.5], [1.0, 1.0]]]), None, np.array([1.0]), A.Projection())
    fig = maps_figure(photo, [signed, legrad], pixels=False, plot_height=270, cmap="Viridis")
    assert len([t for t in fig.data if t.type == "image"]) == 3 and fig.layout.height == 270 + fig.layout.margin.t
    low = tile(fig, 1)
    assert tuple(low[4, 20]) == (90, 160, 40)  # AttnLRP's 0 (row 0, column 1): the photo itself
    assert low[4, 4, 2] > low[4, 4, 0]  # -2: blue
    heat = maps_figure(photo, [signed, legrad], pixels=False, style="heatmap", opacity=1.0, cmap="Viridis")
    assert tuple(tile(heat, 1)[4, 20]) == tuple(lookup_table("RdBu_r")[128])  # 0 at the diverging centre
    assert tuple(tile(heat, 2)[4, 4]) == tuple(lookup_table("Viridis")[0])  # LeGrad's 0 at the sequential bottom
