"""The Probes page: the session's images sorted into groups, accuracy per layer, the probe as the model's head."""
import json
from pathlib import Path

import pytest

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.mark.slow
def test_probes_page_trains_every_layer_and_its_probe_becomes_the_head(bundled):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]
    at.run()
    at.switch_page("pages/14_probes.py").run()
    assert not at.exception
    boxes = [s for s in at.selectbox if s.key and s.key.startswith("probe_group_")]
    assert len(boxes) == 4 and [b.value for b in boxes] == ["group 1", "group 2", "group 1", "group 2"]
    next(b for b in at.button if "Train a probe" in b.label).click().run()
    assert not at.exception and not at.error
    spec = json.loads(next(c for c in at.get("plotly_chart") if "probe_accuracy" in c.proto.id).proto.spec)
    accuracy, chance = spec["data"][0], spec["data"][1]
    assert accuracy["x"] == list(range(1, 13)) and chance["y"] == [50.0, 50.0]
    assert all(0 <= y <= 100 for y in accuracy["y"])
    # the head's C search (4 images, 2 inner folds): every C predicts both held-out images, C = 1e-3 wins the tie
    assert any(c.value == "The head's C = 0.001 is the smallest of the search's range (0.001 to 10); it tied with "
               "C = 0.01 (1.000; ties go to the smaller C): the accuracy is flat there." for c in at.caption)
    table = next(d.value for d in at.dataframe)  # the columns in words, not probe.json's keys
    assert list(table.columns) == ["layer", "accuracy (out of fold)", "95 % interval from", "95 % interval to",
                                   "cross-validation folds", "regularisation C (inverse)",
                                   "folds whose C hit the grid's end"]
    next(b for b in at.button if "as the model's head" in b.label).click().run()
    assert not at.exception and not at.error
    caption = " ".join(c.value for c in at.sidebar.caption)
    assert "probe head (2 classes: group 1, group 2" in caption
    at.switch_page("pages/1_overview.py").run()
    shown = " ".join(c.value for c in at.caption)
    assert "Head: the probe in probe.safetensors" in shown and "No classifier head" not in shown


@pytest.mark.slow
def test_the_button_says_the_rule_before_a_press_and_an_error_replaces_the_instructions(monkeypatch):
    """Three images alternate into groups 2 + 1: the button is disabled and says why; with a fourth (2 + 2) it can be
    pressed, and a failure shows its sentence without the instructions that contradict it."""
    from streamlit.testing.v1 import AppTest
    import vitviz.probes
    from vitviz.errors import VitvizError

    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["kept_samples"] = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg"]
    at.run()
    at.switch_page("pages/14_probes.py").run()
    assert not at.exception
    button = next(b for b in at.button if "Train a probe" in b.label)
    assert button.disabled
    rule = "class 'group 2' has this one image only; cross-validation holds images out"
    assert rule in button.help and any(rule in c.value for c in at.caption)
    at.sidebar.multiselect(key="samples").set_value(["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]).run()
    assert not next(b for b in at.button if "Train a probe" in b.label).disabled

    def fails(*args, **kwargs):
        raise VitvizError("the model ran out of patience.")

    monkeypatch.setattr(vitviz.probes, "fit", fails)
    next(b for b in at.button if "Train a probe" in b.label).click().run()
    assert [e.value for e in at.error] == ["the model ran out of patience."]
    assert not [i.value for i in at.info if "press the button" in i.value]
