"""Items of a new researcher's walk through the app, as AppTest sees them (issue 20)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_a_refused_resolution_says_why_and_which_maps_are_shown():
    at = _app()
    at.sidebar.number_input(key="img_size").set_value(5000).run()  # once clamped by the widget with only a tooltip
    assert not at.exception
    assert any("Input resolution 5000 px" in e.value and "largest size that fits is" in e.value for e in at.error)
    assert any("Still showing the previous model" in i.value and "at its own resolution" in i.value
               and "maps below are its" in i.value for i in at.info)


def test_the_device_box_says_when_no_gpu_is_found():
    import torch

    at = _app()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert any(c.value.startswith("GPU: none found") for c in at.sidebar.caption)


def test_the_file_watcher_is_off():
    """12,630 'Inotify queue overflowed' log lines came from watching the venv; the app needs no reloads."""
    import tomllib

    config = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"


def test_distance_heatmap_labels_every_layer_and_its_caption_describes_it():
    import json

    at = _app()
    at.switch_page("pages/4_distance.py").run()
    at.radio(key="distance_view").set_value("layer × head heatmap").run()
    assert not at.exception
    spec = json.loads(next(c for c in at.get("plotly_chart") if "distance_heatmap" in c.proto.id).proto.spec)
    assert spec["layout"]["yaxis"]["dtick"] == 1 and spec["layout"]["xaxis"]["dtick"] == 1
    captions = " ".join(c.value for c in at.caption)
    assert "Each cell: one head's mean attention distance" in captions and "Dotted line" not in captions
