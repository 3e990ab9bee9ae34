"""The "Repair" choice on the heads, rollout and attribution pages (ui/repair.py): the maps after the repair are
the core's maps of the repaired forward (computed here from the adapters' edit= and capture, not through the page),
the choice holds across pages, and an edit given to :func:`vitviz.adapters.editing` reaches every run inside."""
import base64
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from test_registers import load_planted, planted_checkpoint  # noqa: F401  (shared fixture)

from vitviz.analyses import registers as R
from vitviz.adapters import editing, run

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _heatmaps(at, key: str) -> list[np.ndarray]:
    chart = next(c for c in at.get("plotly_chart") if key in (c.proto.id or ""))

    def z(t):
        v = t["z"]
        if isinstance(v, dict):
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(
                [int(n) for n in str(v["shape"]).split(",")])
        return np.array(v, dtype=float)

    return [z(t) for t in json.loads(chart.proto.spec)["data"] if t["type"] == "heatmap"]


def test_editing_reaches_every_run_inside_and_only_in_its_thread():
    """``editing(e)`` makes run(x) equal run(x, edit=e) (composed before the run's own edit), and nothing
    outside the block or in another thread sees it."""
    from test_registers import tiny_vit

    model = tiny_vit()
    x = torch.randn(2, 3, 64, 64)
    halve = {"blocks.1.attn_out": lambda v, p: 0.5 * v}
    plain = run(model, x, keep=("logits",))["logits"]
    direct = run(model, x, keep=("logits",), edit=halve)["logits"]
    assert not torch.allclose(plain, direct)
    seen = {}
    with editing(halve):
        inside = run(model, x, keep=("logits",))["logits"]
        # the run's own edit is applied after the context's: doubling again restores the plain output
        twice = run(model, x, keep=("logits",), edit={"blocks.1.attn_out": lambda v, p: 2 * v})["logits"]
        t = threading.Thread(target=lambda: seen.setdefault("other", run(model, x, keep=("logits",))["logits"]))
        t.start()
        t.join()
    torch.testing.assert_close(inside, direct, rtol=0, atol=0)
    torch.testing.assert_close(twice, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(seen["other"], plain, rtol=0, atol=0)
    torch.testing.assert_close(run(model, x, keep=("logits",))["logits"], plain, rtol=0, atol=0)


def test_trained_register_repair_drops_the_register_keys_in_every_layer():
    """DINOv2-style model with 4 registers: after the repair no query attends to a register, rows sum to 1."""
    from test_registers import tiny_vit

    from vitviz.trace import trace_for_analysis as capture
    from vitviz.layout import TokenLayout

    model = tiny_vit(reg_tokens=4, class_token=True, no_embed_class=True)
    layout = TokenLayout.from_model(model)
    repair = R.Repair("trained")
    assert repair.why_not(model, layout) is None
    assert R.Repair("trained").why_not(tiny_vit(), TokenLayout.from_model(tiny_vit())) is not None
    a = capture(model, torch.randn(1, 3, 64, 64), edit=repair.edit(model, layout), layout=layout).stack("attn")[0]
    regs = [i for i, n in enumerate(layout.prefix_tokens) if n.startswith("reg")]
    assert len(regs) == 4
    assert float(a[..., regs].abs().max()) == 0
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_repair_choice_shows_sink_masking_before_and_after_on_heads_rollout_and_attribution(bundled):
    """Sink masking on the bundled model, chosen on the heads page, holds on the rollout and attribution pages;
    each page's 'after' map is the core's map of the forward with the sinks masked; the output change is shown."""
    from streamlit.testing.v1 import AppTest

    from conftest import ASSETS
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.analyses.maps import layer_maps
    from vitviz.analyses.per_image import analyse_images as forward
    from vitviz.analyses.rollout import rollout

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    at.selectbox(key="repair_choice").set_value("sinks").run()
    assert not at.exception, [e.message for e in at.exception]

    image = at.sidebar.selectbox(key="current").value
    pil = load_image(ASSETS / image).image
    x = preprocess([pil], bundled.data_config).tensor
    layout = bundled.layout
    sinks = forward(bundled, [pil]).sinks
    mask = R.sink_mask(sinks, layout)
    assert mask.any(), "the bundled model has patch sinks on the sample photos"
    after = capture(bundled.model, x, edit=R.mask_keys(mask), layout=layout).stack("attn")[0].numpy()
    L = after.shape[0]

    heads = _heatmaps(at, "heads_repair_maps")
    expected = layer_maps(after, layout, L - 1, "cls").mean(0)
    np.testing.assert_allclose(heads[1], expected, rtol=1e-4, atol=1e-7)
    assert any("pooled cosine" in c for df in at.dataframe for c in df.value.columns)
    # the faithfulness before / after, on demand (about 400 forwards: clicked only in its own test)
    assert "Faithfulness before and after sink masking" in at.button(key="heads_faithfulness_run").label

    at.switch_page("pages/3_rollout.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="repair_choice").value == "sinks"
    assert at.button(key="rollout_faithfulness_run")
    roll = _heatmaps(at, "rollout_repair_maps")
    np.testing.assert_allclose(roll[1], rollout(after, layout).map, rtol=1e-4, atol=1e-7)

    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="repair_choice").value == "sinks"
    assert at.button(key="attribution_faithfulness_run")
    attr = _heatmaps(at, "attribution_repair_maps")
    assert len(attr) >= 2 and not np.allclose(attr[0], attr[1])
    # One colour rule per method: AttnLRP (signed) red/blue around 0, LeGrad and Grad-CAM (never negative) sequential
    # from 0 in their own figures (all three were drawn red/blue here).
    from vitviz.figures.colour import reference_stops

    def scales(key):
        chart = next(c for c in at.get("plotly_chart") if re.search(key + r"(?!_\d)", c.proto.id or ""))
        return [t.get("colorscale") or t["marker"]["colorscale"] for t in json.loads(chart.proto.spec)["data"]
                if t.get("colorscale") or t.get("marker", {}).get("showscale")]

    assert at.multiselect(key="attr_methods").value == ["attnlrp", "legrad", "gradcam"]
    assert {str(c) for c in scales("attribution_repair_maps")} == {str(reference_stops("RdBu_r"))}
    for key in ("attribution_repair_maps_1", "attribution_repair_maps_2"):  # LeGrad, Grad-CAM
        assert scales(key) == [reference_stops("Inferno")]


def test_repair_faithfulness_scores_the_before_maps_plainly_and_the_after_maps_with_the_repair(planted_checkpoint):
    """On the planted ViT-Ti (10 classes): the 'before' curves are perturbation_curves of the plain rollout; the
    'after' curves start (0 % deleted) at the repaired model's probability of the unrepaired top-1 class, so the
    repair runs in every scoring forward; the random band has its 10 seeds on both sides."""
    from test_registers import LAYER, NEURON

    from conftest import ASSETS
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.perturbation.curves import perturbation_curves, random_seed_maps
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.runs.registers_run import repair_faithfulness
    from vitviz.analyses.rollout import rollout

    _, weights = planted_checkpoint
    loaded = load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint=str(weights), img_size=64))
    image = load_image(ASSETS / "chelsea.jpg").image
    register = R.TestTimeRegister(((LAYER, NEURON),))
    result = repair_faithfulness(loaded, image, R.Repair("register", register), methods=("rollout",), seeds=3)
    x = preprocess([image], loaded.data_config).tensor
    layout = loaded.layout
    with torch.no_grad():
        logits = run(loaded.model, x, keep=("logits",))["logits"][0]
        repaired = run(loaded.model, x, keep=("logits",), edit=register.edit(layout))["logits"][0]
    target = int(logits.argmax())
    plain_rollout = rollout(capture(loaded.model, x).stack("attn")[0].numpy(), layout).map
    expected = perturbation_curves(loaded.model, x[0], {"rollout": plain_rollout} | random_seed_maps(layout.grid_size,
                                                                                                     seeds=3),
                                   layout, target=target)
    np.testing.assert_allclose(result.before.deletion, expected.deletion, rtol=1e-6, atol=1e-9)
    # float32 softmax of the same logits by two code paths: 1e-6 absolute on a probability
    np.testing.assert_allclose(result.after.deletion[:, 0], float(repaired.softmax(-1)[target]), atol=1e-6)
    assert abs(float(repaired.softmax(-1)[target]) - float(logits.softmax(-1)[target])) > 1e-6
    assert result.band_before.seeds == result.band_after.seeds == 3
    assert {r["side"] for r in result.table() if r["method"] == "rollout"} == {"before", "after"}


@pytest.mark.slow
def test_attribution_page_after_map_is_the_attribution_of_the_repaired_forward(planted_checkpoint):
    """The planted ViT-Ti with its register (the Registers page's search, best 1 neuron) chosen on the Attribution
    page: the 'after' AttnLRP map is AttnLRP of the top-1 logit with the register run in the forward (the reference
    runs it through vitviz.adapters.editing in this process), the 'before' map that of the model as it is, and the
    two differ by far more than the tolerance (a page whose 'after' silently equalled 'before' fails); LeGrad and
    Grad-CAM are left out with their sentence."""
    from streamlit.testing.v1 import AppTest

    from test_registers import LAYER, NEURON

    from conftest import ASSETS
    from attribution_names import attribute, default_target
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.layout import TokenLayout
    from vitviz.sources.models import ModelSpec, load_model

    model, weights = planted_checkpoint
    at = AppTest.from_file(APP, default_timeout=300).run()
    name = load_planted(at, weights)
    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    at.slider(key="registers_k").set_value(1).run()  # offers the best neuron to the other pages
    assert not at.error, [e.value for e in at.error]
    assert any("Largest patch norm / median in the last layer: before" in c.value and "the extra token's norm there"
               in c.value for c in at.caption)  # the register's before and after, drawn
    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert set(at.multiselect(key="attr_methods").value) >= {"attnlrp", "legrad", "gradcam"}
    at.selectbox(key="repair_choice").set_value("register").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("LeGrad and Grad-CAM" in c.value and "left out under the test-time register" in c.value
               for c in at.caption)
    before, after = _heatmaps(at, "attribution_repair_maps")  # AttnLRP only: one row, before | after

    image = at.sidebar.selectbox(key="current").value
    loaded = load_model(ModelSpec(name=name, checkpoint=str(weights), img_size=64))
    x = preprocess([load_image(ASSETS / image).image], loaded.data_config).tensor
    layout = TokenLayout.from_model(loaded.model)
    with torch.no_grad():
        top1 = int(run(loaded.model, x, keep=("logits",))["logits"][0].argmax())
    target = default_target(loaded.model, top1)
    plain = attribute(loaded.model, x, "attnlrp", target).patches[0]
    with editing(R.TestTimeRegister(((LAYER, NEURON),)).edit(layout)):
        repaired = attribute(loaded.model, x, "attnlrp", target).patches[0]
    # The maps are drawn over the photo; each tile's hover heatmap carries the map as float32, row 0 at the top.
    # Both sides are the same float64 computation on the same float32 model in two processes: 1e-6 of the map's
    # largest |value| covers the summation order and float32's rounding (6e-8 relative).
    tol = 1e-6 * np.abs(plain).max()
    np.testing.assert_allclose(before, plain, rtol=0, atol=tol)
    np.testing.assert_allclose(after, repaired, rtol=0, atol=tol)
    assert np.abs(repaired - plain).max() > 1000 * tol  # the register changes the map: equality above means something


def _grey_with_a_white_square() -> bytes:
    """A photo the bundled model puts patch norms above 2x the median on in layers 1-4 and in no later layer
    (largest / median 3.9 in layer 1, 1.01 in layer 12): outliers, but none in the detection layer."""
    import io

    from PIL import Image

    pixels = np.full((224, 224, 3), 128, np.uint8)
    pixels[100:116, 100:116] = 255
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.slow
def test_registers_page_with_outliers_but_none_in_the_detection_layer_says_so_and_draws_the_rest(bundled):
    """Two images, threshold 2.0: outliers emerge in layer 1 but no image has one in the last layer, so no neuron
    is ranked. The page says why in a sentence (it raised IndexError in neuron_maps), offers no register, and still
    draws sink masking below; the norm chart's x axis spans the layers and its line label sits right of layer 1."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.sidebar.file_uploader(key="uploads").set_value([("square.png", _grey_with_a_white_square(), "image/png")]).run()
    at.sidebar.multiselect(key="samples").set_value(["astronaut.jpg"]).run()  # chosen: an upload replaces the default
    at.switch_page("pages/11_registers.py").run()
    at.slider(key="registers_factor").set_value(2.0).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert any("Outliers emerge in layer 1 (1 of 2 images has one there)" in c.value for c in at.caption)
    assert any("Largest patch norm / median in the last layer: before" in c.value and "extra token" not in c.value
               for c in at.caption)  # sink masking's before and after: no token added
    said = [i.value for i in at.info if i.value.startswith("No image of the set has an outlier in layer 12")]
    assert said and "outliers appear only in layers 1, 2, 3, 4" in said[0], [i.value for i in at.info]
    assert not any("Test-time register" in s.value for s in at.subheader)
    assert any("Sink masking" in s.value for s in at.subheader)
    spec = json.loads(next(c for c in at.get("plotly_chart") if "registers_norms" in (c.proto.id or "")).proto.spec)
    assert spec["layout"]["xaxis"]["range"] == [0.5, 12.5]
    label = next(a for a in spec["layout"]["annotations"] if a["text"].startswith("outliers emerge"))
    assert label["text"] == "outliers emerge (layer 1)" and label["xanchor"] == "left"
