"""Issue 34's app items as AppTest sees them (bundled model, offline): the model search's offline marks, the settings
downloads of the heads page, padding patches kept out of rollout, the Registers tables' headers and numbers.
(The sidebar's way back after a failed load: tests/test_sidebar.py; what only a browser shows: test_walk2_browser.py.)"""
import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from tolerance import EPS32

APP = str(Path(__file__).resolve().parent.parent / "app.py")
CACHED = "deit3_small_patch16_224.fb_in1k"


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.query_params["intro"] = "0"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


@pytest.fixture
def downloads(monkeypatch) -> dict:
    """Every download row a page draws, by file stem: (arrays, settings) as the page handed them over."""
    import ui.downloads

    seen, real = {}, ui.downloads.download_row

    def spy(name, arrays, settings, png=None, **kwargs):
        seen[name] = (arrays, settings)
        return real(name, arrays, settings, png, **kwargs)

    monkeypatch.setattr(ui.downloads, "download_row", spy)  # pages import it on every run
    # ui modules (ui/heads.py, ...) bound it when first imported, perhaps by an earlier test of this process.
    for module in [m for name, m in list(sys.modules.items())
                   if name.startswith("ui.") and getattr(m, "download_row", None) is real]:
        monkeypatch.setattr(module, "download_row", spy)
    return seen


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """A Hugging Face cache holding one timm tag's weights file (as hf_hub_download leaves it), nothing else."""
    from huggingface_hub import constants

    repo = tmp_path / "models--timm--deit3_small_patch16_224.fb_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"not read by the search")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    return tmp_path


def test_weights_on_disk_finds_a_cached_tag_and_nothing_else(hub_cache):
    from vitviz.sources.models import search_models, weights_on_disk

    names = search_models("deit3_small")
    assert CACHED in names and len(names) > 1
    assert weights_on_disk(names + ["not_a_timm_model"]) == {CACHED}


@pytest.mark.slow
def test_the_model_search_marks_what_loads_offline(hub_cache):
    from ui.model_box import ON_DISK

    at = _app()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input("deit3_small").run()
    options = at.sidebar.selectbox(key="timm_name").options
    assert f"{ON_DISK}{CACHED}" in options  # the mark first: the sidebar cuts long names at the end
    assert [o for o in options if o.startswith(ON_DISK)] == [f"{ON_DISK}{CACHED}"]
    assert any(c.value.startswith(f"1 of the {len(options)} listed has its weights on this machine")
               for c in at.sidebar.caption)


@pytest.mark.slow
def test_heads_settings_carry_the_colour_scales_clipped_patches_model_and_image_hash(monkeypatch, downloads):
    """The browser-drawn grid's settings JSON had only the display choices; Compare layers' had no model or image
    hash. The limits are checked against numpy's percentile of the downloaded maps, the patches set apart excluded."""
    monkeypatch.setenv("VITVIZ_DRAW", "browser")
    at = _app()
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    sha = hashlib.sha256((ASSETS / "astronaut.jpg").read_bytes()).hexdigest()
    heads = [v for k, v in downloads.items() if k.startswith("heads_astronaut_layer12")]
    compare = [v for k, v in downloads.items() if k.startswith("compare_astronaut_head1")]
    assert len(heads) == len(compare) == 1
    for arrays, settings in (heads[0], compare[0]):
        maps = arrays["maps"].reshape(len(arrays["maps"]), -1)
        scales, clipped = settings["colour_scales"], settings["clipped_patches"]
        keep = np.ones(maps.shape[1], bool)
        keep[settings["patches_setting_no_limit"]] = False
        assert len(scales) == len(clipped) == len(maps)
        for m, scale, above in zip(maps, scales, clipped):
            top = np.percentile(m[keep], 99)  # robust per head: 0 to the map's 99th percentile
            # The maps are float32: numpy interpolates between the two order statistics in float32 here, the app in
            # float64 (b - a, times the fraction, plus a: three roundings, each <= eps32 / 2 of the result).
            assert scale["lo"] == 0 and scale["hi"] == pytest.approx(top, rel=2 * EPS32)
            # Which patches are above the limit the settings state: compared with that limit, not with our copy of it.
            assert above == np.flatnonzero((m > scale["hi"] * (1 + 1e-9)) & keep).tolist()
        assert sum(map(len, clipped)) > 0  # layer 12 of the bundled model clips some patches: not a vacuous check
        assert settings["sha256"] == sha
        assert settings["model"]["name"] == "bundled"


@pytest.mark.slow
def test_padding_patches_are_kept_out_of_rollout_and_its_colour_scale(downloads):
    """chelsea.jpg (451 x 300) padded to a square: its padding patches receive no rollout mass when kept out (an
    excluded token's column is zeroed in every layer, so no path reaches it), and they set no colour limit."""
    from vitviz.io.images import frame_image, load_image, mean_colour
    from vitviz.sources.preprocess import padding_patches
    from vitviz.sources.models import ModelSpec, load_model

    loaded = load_model(ModelSpec())
    padded = frame_image(load_image(ASSETS / "chelsea.jpg"), "pad", mean_colour(loaded.data_config))
    padding = np.flatnonzero(padding_patches(padded, loaded.data_config, loaded.layout.grid_size))
    assert len(padding) > 0
    at = _app()
    at.sidebar.multiselect(key="samples").set_value(["chelsea.jpg"]).run()
    at.sidebar.radio(key="framing").set_value("pad").run()
    at.switch_page("pages/3_rollout.py").run()
    assert not at.exception, [e.message for e in at.exception]
    (arrays, settings), = [v for k, v in downloads.items() if k.startswith("rollout_chelsea")]
    shown = arrays["rollout"].ravel()
    assert np.all(shown[padding] == 0) and shown.sum() == pytest.approx(1 - sum(
        settings["prefix_share"].values()), abs=1e-9)
    assert settings["padding_patches"] == padding.tolist()
    assert set(padding.tolist()) <= set(settings["patches_setting_no_limit"])
    assert set(padding.tolist()) <= set(settings["kept_out_patches (0-based)"])
    downloads.clear()
    at.toggle(key="rollout_exclude_padding").set_value(False).run()
    (arrays, _), = [v for k, v in downloads.items() if k.startswith("rollout_chelsea")]
    assert arrays["rollout"].ravel()[padding].sum() > 0  # without the choice the padding draws mass


@pytest.mark.slow
def test_registers_tables_speak_words_and_show_how_far_the_cosine_is_from_1():
    at = _app()
    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    tables = [df.value for df in at.dataframe]
    assert tables and not [c for t in tables for c in t.columns if "_" in str(c)]  # no data names as headers
    change = next(t for t in tables if "1 − pooled cosine" in t.columns)
    np.testing.assert_allclose(change["1 − pooled cosine"], np.clip(1 - change["pooled cosine (before vs after)"], 0,
                                                                     None), rtol=0, atol=0)
    assert (change["1 − pooled cosine"] > 0).all()  # sink masking moves the pooled vector, if only a little
