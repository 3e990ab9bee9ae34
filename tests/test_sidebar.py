"""The shared sidebar: the image set across uploads, removals and page switches; framing; the model box."""
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from vitviz.errors import ModelError
from vitviz.io.images import frame_image, load_image, model_view, pad_to_square, visible_share
from vitviz.sources.preprocess import preprocess
from vitviz.sources.models import ModelSpec, load_model, search_models

APP = str(Path(__file__).resolve().parent.parent / "app.py")
CONFIG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
          "std": (0.229, 0.224, 0.225), "crop_pct": 1.0, "crop_mode": "center"}


def _file(name):
    return name, (ASSETS / name).read_bytes(), "image/jpeg"


def _panorama_bytes(size=(2000, 400)):
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _app():
    return AppTest.from_file(APP, default_timeout=180).run()


def _current(at):
    box = at.sidebar.selectbox(key="current")
    return box.value, box.options


def _run(widget):
    at = widget.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


# Pure functions -------------------------------------------------------------------------------

def test_visible_share_of_a_panorama_is_its_centre_square():
    assert model_view((2000, 400), CONFIG) == pytest.approx((400, 400))
    assert visible_share((2000, 400), CONFIG) == pytest.approx(0.2)
    assert visible_share((500, 500), CONFIG) == pytest.approx(1.0)
    # crop_pct 0.875: shorter side to 256, centre 224 -> (224/256)^2 of a square image
    assert visible_share((300, 300), CONFIG | {"crop_pct": 0.875}) == pytest.approx((224 / 256) ** 2)
    assert visible_share((2000, 400), CONFIG | {"crop_mode": "squash"}) == pytest.approx(1.0)


def test_visible_share_matches_the_real_transform():
    """Columns coded by value: the model input's first and last columns say where the crop fell."""
    w, h = 1000, 250
    ramp = np.tile(np.linspace(0, 255, w), (h, 1)).astype(np.uint8)
    image = Image.fromarray(np.stack([ramp] * 3, -1))
    config = CONFIG | {"interpolation": "bilinear"}
    seen = np.asarray(preprocess([image], config).images[0])[..., 0].astype(float)
    left, right = seen[:, 0].mean() / 255 * w, seen[:, -1].mean() / 255 * w
    assert (right - left) / w == pytest.approx(visible_share((w, h), config), abs=0.01)


def test_pad_to_square_centres_the_whole_image_on_the_fill():
    image = Image.new("RGB", (40, 10), (255, 0, 0))
    padded = np.asarray(pad_to_square(image, (1, 2, 3)))
    assert padded.shape == (40, 40, 3)
    assert (padded[15:25] == (255, 0, 0)).all()
    assert (padded[:15] == (1, 2, 3)).all() and (padded[25:] == (1, 2, 3)).all()
    square = Image.new("RGB", (8, 8))
    assert pad_to_square(square) is square


def test_padded_panorama_is_seen_whole_and_keyed_apart():
    loaded = load_image(_panorama_bytes(), "panorama.png")
    padded = frame_image(loaded, "pad", (124, 116, 104))
    assert padded.sha256 != loaded.sha256 and padded.sha256.startswith(loaded.sha256)
    assert visible_share(padded.image.size, CONFIG) == pytest.approx(1.0)
    assert any("padded from 2000x400 to 2000x2000" in n for n in padded.notes)
    assert frame_image(loaded, "crop") is loaded
    model_input = np.asarray(preprocess([padded.image], CONFIG).images[0])
    assert (model_input[5, 112] == (124, 116, 104)).all()  # the band above the panorama is the fill


# The image set in the app ---------------------------------------------------------------------

@pytest.mark.slow
def test_new_upload_becomes_the_current_image_and_survives_page_switches():
    at = _app()
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg")]))
    assert _current(at) == ("chelsea.jpg", ["chelsea.jpg"])  # the default sample leaves the set
    assert any("chelsea.jpg" in h.value for h in at.header)
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg"), _file("coffee.jpg")]))
    assert _current(at)[0] == "coffee.jpg"
    for page in ("pages/2_heads.py", "pages/1_overview.py", "pages/2_heads.py"):
        at = _run(at.switch_page(page))
        assert _current(at) == ("coffee.jpg", ["chelsea.jpg", "coffee.jpg"])
        assert at.sidebar.file_uploader(key="uploads").value in (None, [])  # re-created empty on the new page


@pytest.mark.slow
def test_an_upload_replaces_the_default_sample_but_not_a_chosen_one():
    at = _app()
    assert _current(at) == ("astronaut.jpg", ["astronaut.jpg"])  # the default, so that a first visit shows something
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg")]))
    assert at.sidebar.multiselect(key="samples").value == []
    at = _run(at.switch_page("pages/14_probes.py"))  # the set the Probes page sorts into groups: the upload alone
    assert [s.label for s in at.selectbox if s.key and s.key.startswith("probe_group_")] == ["chelsea.jpg"]
    at = _app()
    at = _run(at.sidebar.multiselect(key="samples").set_value(["rocket.jpg"]))  # the user's choice
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg")]))
    assert _current(at) == ("chelsea.jpg", ["chelsea.jpg", "rocket.jpg"])


@pytest.mark.slow
def test_chosen_samples_survive_a_page_switch():
    at = _app()
    at = _run(at.sidebar.multiselect(key="samples").set_value(["rocket.jpg", "coffee.jpg"]))
    at = _run(at.sidebar.selectbox(key="current").set_value("coffee.jpg"))
    at = _run(at.switch_page("pages/2_heads.py"))
    assert at.sidebar.multiselect(key="samples").value == ["rocket.jpg", "coffee.jpg"]
    assert _current(at)[0] == "coffee.jpg"
    at = _run(at.switch_page("pages/1_overview.py"))
    assert at.sidebar.multiselect(key="samples").value == ["rocket.jpg", "coffee.jpg"]


@pytest.mark.slow
def test_removing_a_file_in_the_uploader_removes_it_and_its_error():
    at = _app()
    broken = ("broken.png", b"not a png", "image/png")
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([broken, _file("chelsea.jpg")]))
    assert any("broken.png" in e.value for e in at.error)
    kept = [f for f in at.sidebar.file_uploader(key="uploads").value if f.name == "chelsea.jpg"]
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([("chelsea.jpg", kept[0].getvalue(), "image/jpeg")]))
    assert not any("broken.png" in e.value for e in at.error)
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([]))
    assert _current(at)[1] == ["astronaut.jpg"]  # no upload left: the default sample is back
    assert not any(b.label == "Forget uploaded images" for b in at.sidebar.button)


@pytest.mark.slow
def test_removal_after_a_page_switch_keeps_the_earlier_uploads():
    at = _app()
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg")]))
    at = _run(at.switch_page("pages/2_heads.py"))
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("coffee.jpg")]))
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([]))
    assert _current(at)[1] == ["chelsea.jpg"]


@pytest.mark.slow
def test_forget_clears_the_set_and_the_uploader_on_the_same_page():
    at = _app()
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([_file("chelsea.jpg"), _file("coffee.jpg")]))
    forget = next(b for b in at.sidebar.button if b.label == "Forget uploaded images")
    at = _run(forget.click())
    assert _current(at) == ("astronaut.jpg", ["astronaut.jpg"])
    assert at.sidebar.file_uploader(key="uploads_1").value in (None, [])
    at = _run(at.sidebar.multiselect(key="samples").set_value(["astronaut.jpg", "rocket.jpg"]))
    assert _current(at)[1] == ["astronaut.jpg", "rocket.jpg"]  # the forgotten files do not come back


@pytest.mark.slow
def test_panorama_crop_is_named_and_pad_shows_it_whole():
    at = _app()
    at = _run(at.sidebar.file_uploader(key="uploads").set_value([("panorama.png", _panorama_bytes(), "image/png")]))
    captions = [c.value for c in at.caption]
    assert any("panorama.png: the model sees 20% of this image, the centre 400x400 px of 2000x400" in c
               for c in captions), captions
    at = _run(at.sidebar.radio(key="framing").set_value("pad"))
    captions = [c.value for c in at.caption]
    assert not any("the model sees 20%" in c for c in captions)
    assert any("panorama.png: padded from 2000x400 to 2000x2000" in c for c in captions)
    # The framing survives a page switch, and results for crop and pad are cached apart.
    at = _run(at.switch_page("pages/2_heads.py"))
    assert at.sidebar.radio(key="framing").value == "pad"
    from ui.cache import cached_image_result, cached_model

    spec = ModelSpec()
    loaded = load_image(_panorama_bytes(), "panorama.png")
    padded = frame_image(loaded, "pad", (124, 116, 104))
    crop = cached_image_result(spec, loaded.sha256, loaded.image)
    pad = cached_image_result(spec, padded.sha256, padded.image)
    assert crop.model_input.size == pad.model_input.size == (224, 224)
    assert not np.array_equal(np.asarray(crop.model_input), np.asarray(pad.model_input))
    assert (np.asarray(pad.model_input)[3, 112] == (124, 116, 104)).all()
    assert cached_model(spec).data_config["mean"] == pytest.approx((0.485, 0.456, 0.406))


# The model box -------------------------------------------------------------------------------

def test_search_never_turns_the_query_into_a_model_name():
    found = search_models("deit3")
    assert "deit3" not in found and "deit3_small_patch16_224.fb_in1k" in found
    assert search_models("my_custom_vit") == []
    assert search_models("deit3_small_patch16_224")[0] == "deit3_small_patch16_224"  # an exact architecture
    assert search_models("  ") == []


@pytest.mark.slow
def test_choosing_timm_by_name_loads_nothing_until_a_model_is_picked():
    import ui.cache

    at = _app()
    loads = []
    real = ui.cache.load_model
    ui.cache.load_model = lambda spec: loads.append(spec) or real(spec)
    try:
        at = _run(at.sidebar.selectbox(key="model_choice").set_value("timm model by name"))
    finally:
        ui.cache.load_model = real
    assert [s for s in loads if s.name != "bundled"] == []  # nothing but the model already shown was built
    assert at.sidebar.selectbox(key="timm_name").value is None
    assert not at.error
    assert any("still showing bundled" in i.value for i in at.sidebar.info)
    at = _run(at.sidebar.text_input(key="timm_query").input("deit3"))
    assert at.sidebar.selectbox(key="timm_name").value is None
    assert "deit3" not in at.sidebar.selectbox(key="timm_name").options
    assert not at.error
    at = _run(at.sidebar.selectbox(key="timm_name").set_value("deit3_small_patch16_224.fb_in1k"))
    assert any("'deit3_small_patch16_224.fb_in1k' could not be loaded" in e.value for e in at.error)
    assert any("previous model (bundled)" in i.value for i in at.info)
    # Issue 34: the sidebar no longer names the failed model (it kept it); the box stays on timm names, where the
    # checkpoint boxes for an architecture are, with nothing picked; the sentence stays until the next choice.
    assert at.sidebar.selectbox(key="timm_name").value is None
    assert any("no longer names deit3_small_patch16_224.fb_in1k" in i.value for i in at.info)
    at = _run(at.switch_page("pages/2_heads.py"))  # the model box survives a page switch
    assert at.sidebar.selectbox(key="model_choice").value == "timm model by name"
    assert at.sidebar.selectbox(key="timm_name").value is None
    assert any("'deit3_small_patch16_224.fb_in1k' could not be loaded" in e.value for e in at.error)
    at = _run(at.sidebar.text_input(key="timm_query").input("deit"))
    assert not at.error  # another choice: the last failure's sentence goes


@pytest.mark.slow
def test_a_torchvision_name_in_the_model_box_is_loaded_as_torchvision(tmp_path, monkeypatch):
    """torchvision:vit_b_16 typed in the model box is torchvision's (not a hub id hf:torchvision:...): offline and
    not in torch hub's cache, the app shows the sentence the command line gives, and keeps the previous model."""
    import torch

    from ui.model_box import HUGGING_FACE

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))  # an empty cache
    with pytest.raises(ModelError) as cli:
        load_model(ModelSpec("torchvision:vit_b_16"))
    at = _run(_app().sidebar.selectbox(key="model_choice").set_value(HUGGING_FACE))
    at = _run(at.sidebar.text_input(key="hf_name").input("torchvision:vit_b_16"))
    assert str(cli.value).startswith("Model 'torchvision:vit_b_16' could not be loaded: its weights IMAGENET1K_V1")
    assert [e.value for e in at.error if "torchvision" in e.value] == [str(cli.value)]
    assert any("previous model (bundled)" in i.value for i in at.info)
    assert at.sidebar.selectbox(key="model_choice").value == "bundled"  # the sidebar went back (issue 34)
    at = _run(at.sidebar.selectbox(key="model_choice").set_value(HUGGING_FACE))
    at = _run(at.sidebar.text_input(key="hf_name").input("bad:name"))  # was a traceback (HFValidationError)
    assert any("Model 'hf:bad:name': 'bad:name' is not a Hugging Face hub id" in e.value for e in at.error)


def test_a_malformed_hub_id_is_one_sentence():
    for typed in ("hf:torchvision:vit_b_16", "hf:two words/model"):
        with pytest.raises(ModelError, match=r"is not a Hugging Face hub id .*a hub id is owner/name"):
            load_model(ModelSpec(typed))


@pytest.mark.parametrize("hf_offline", [True, False], ids=["HF_HUB_OFFLINE=1", "no HF_HUB_OFFLINE"])
def test_offline_model_not_in_cache_fails_fast_with_the_way_out(monkeypatch, hf_offline, network_calls):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", hf_offline)
    if not hf_offline:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    name = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    with pytest.raises(ModelError) as err:
        load_model(ModelSpec(name=name))
    message = str(err.value)
    assert f"Model {name!r} could not be loaded" in message
    assert "not in the local Hugging Face cache" in message and "no internet" in message
    assert "bundled model" in message and "local checkpoint" in message
    # Fast by construction, not by a stopwatch: offline mode asks no one; without it, one bounded probe
    # (its timeout passed, 1 s) whose refusal is remembered, and no download is ever attempted.
    assert network_calls == ([] if hf_offline else [1.0])


def test_hub_probe_is_bounded_when_name_lookup_hangs(monkeypatch):
    """socket.create_connection's timeout does not bound DNS; the probe must not wait for it."""
    import threading

    from huggingface_hub import constants

    from vitviz.sources import hub

    release, finished, calls = threading.Event(), threading.Event(), []

    def hang(address, timeout=None):
        calls.append(timeout)
        release.wait(60)  # a DNS lookup that does not come back while the test looks
        finished.set()
        raise OSError("gave up")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_probe", {})
    monkeypatch.setattr(hub.socket, "create_connection", hang)
    try:
        assert hub._hub_reachable(timeout=0.5) is False
        assert not finished.is_set()  # it answered while the lookup still hung: bounded by its own timeout
        assert hub._hub_reachable(timeout=0.5) is False  # remembered, not probed again
    finally:
        release.set()
    for thread in threading.enumerate():
        if thread.name == "vitviz-hub-probe":
            thread.join(5)
    assert calls == [0.5]  # one probe, with the timeout passed on
