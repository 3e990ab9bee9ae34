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
    next(b for b in at.button if "as the model's head" in b.label).click().run()
    assert not at.exception and not at.error
    caption = " ".join(c.value for c in at.sidebar.caption)
    assert "probe head (2 classes: group 1, group 2" in caption
    at.switch_page("pages/1_overview.py").run()
    shown = " ".join(c.value for c in at.caption)
    assert "Head: the probe in probe.safetensors" in shown and "No classifier head" not in shown
