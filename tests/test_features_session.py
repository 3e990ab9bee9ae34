"""Training an SAE in one go (vitviz.features.session) and on the Features page (AppTest, bundled model): the page's
SAE is the one `features train` writes for the same images and settings, its top latents are drawn, and the zip it
offers is a folder that vitviz.load_sae and the page's path box read back."""
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ASSETS
from test_shared_safety import operator_env  # noqa: F401  (a fixture)

# the short runs here (a few epochs) stop before converging on purpose; the defaults' test turns the warning into an error
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.features.sae.NotConvergedWarning")
APP = str(Path(__file__).resolve().parent.parent / "app.py")
TWO = ["astronaut.jpg", "chelsea.jpg"]


@pytest.fixture(scope="module")
def lens():
    import vitviz

    return vitviz.open("bundled", device="cpu")


def _loaded(names):
    from vitviz.io.images import load_image

    return [load_image(ASSETS / n, n) for n in names]


def test_default_settings_converge_on_two_photos(lens):
    """The page's defaults train until the trainer's plateau test stops them, with no NotConvergedWarning: explained
    variance above 0.9 on two sample photos (measured 0.97); the progress fraction rises to 1."""
    import warnings

    from vitviz.features.sae import NotConvergedWarning
    from vitviz.features.session import default_settings, train_small

    done = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotConvergedWarning)
        trained = train_small(lens, _loaded(TWO), default_settings(lens), lambda f, m: done.append((f, m)))
    assert trained.sae.info["training"]["stop_reason"] == "plateau"
    metrics = trained.sae.info["metrics"]
    assert metrics["explained_variance"] > 0.9, metrics
    assert metrics["l0"] == pytest.approx(8.0)
    fractions = [f for f, _ in done]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0 < fractions[0] < 0.01
    assert done[-1][1]["explained_variance"] > done[0][1]["explained_variance"] + 0.5


def test_progress_counts_epochs_when_an_epoch_is_several_forwards(lens, monkeypatch):
    """Fixed epochs, more images than one forward takes: the fraction goes up by 1 / (batches per epoch x epochs)."""
    from vitviz.features import session
    from vitviz.features.train import TrainSettings

    done = []
    monkeypatch.setattr(session, "MAX_BATCH_IMAGES", 1)
    session.train_small(lens, _loaded(TWO), TrainSettings("resid_post", 9, 64, 4, epochs=2),
                        lambda f, m: done.append(f))
    assert done == [0.25, 0.5, 0.75, 1.0]


def test_the_zip_is_the_folder_features_train_writes(lens, tmp_path):
    """The zip holds FOLDER/sae.safetensors and FOLDER/sae.json, the same bytes `features train` writes for the same
    images and settings (the batch size the whole set), and load_sae reads it back to the same encoding."""
    from dataclasses import replace

    import vitviz
    from vitviz.features.session import train_small
    from vitviz.features.train import TrainSettings, train

    settings = TrainSettings("resid_post", 9, 64, 4, epochs=3, batch_tokens=128)
    trained = train_small(lens, _loaded(TWO), settings)
    with zipfile.ZipFile(io.BytesIO(trained.zip)) as z:
        assert sorted(z.namelist()) == [f"{trained.folder}/sae.json", f"{trained.folder}/sae.safetensors"]
        z.extractall(tmp_path / "unzipped")
    ref = tmp_path / "ref"
    train(lens, _loaded(TWO), replace(settings, batch_size=2), ref, progress=False)
    got = tmp_path / "unzipped" / trained.folder
    assert (got / "sae.safetensors").read_bytes() == (ref / "sae.safetensors").read_bytes()
    a, b = json.loads((got / "sae.json").read_text()), json.loads((ref / "sae.json").read_text())
    a.pop("versions"), b.pop("versions")
    assert a == b
    sae = vitviz.load_sae(got)
    x = lens.trace(lens.preprocess([ASSETS / "astronaut.jpg"]), keep=["blocks.8.resid_post"])["blocks.8.resid_post"][0]
    np.testing.assert_array_equal(sae.encode(x).detach().numpy(), trained.sae.encode(x).detach().numpy())


def test_a_shared_servers_cap_is_one_sentence(lens):
    from vitviz.errors import VitvizError
    from vitviz.features.session import SHARED_CAP, train_small
    from vitviz.features.train import TrainSettings

    with pytest.raises(VitvizError, match="2048 latents is more than this server trains at once"):
        train_small(lens, _loaded(TWO), TrainSettings("resid_post", 9, 2048, 8), cap=SHARED_CAP)


def test_a_progress_callback_that_raises_stops_the_run(lens):
    """The page's Cancel: Streamlit raises inside the progress update; the run stops there and leaves no folder."""
    import tempfile

    from vitviz.features.session import default_settings, train_small

    before = set(Path(tempfile.gettempdir()).glob("vitviz-sae-*"))

    def stop(fraction, metrics):
        if metrics["step"] >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_small(lens, _loaded(TWO), default_settings(lens), stop)
    assert set(Path(tempfile.gettempdir()).glob("vitviz-sae-*")) == before


@pytest.mark.slow
def test_features_page_trains_an_sae_and_shows_its_top_latents(lens, tmp_path):
    from streamlit.testing.v1 import AppTest

    import vitviz
    from ui.features import TRAINED
    from vitviz.features.top import image_top_latents

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/12_features.py").run()
    assert not at.exception, [e.message for e in at.exception]
    at.sidebar.multiselect(key="samples").set_value(TWO).run()
    at.checkbox(key="features_train_samples").uncheck().run()
    at.select_slider(key="features_train_latents").set_value(64).run()
    at.checkbox(key="features_train_until").uncheck().run()
    at.number_input(key="features_train_epochs").set_value(20).run()
    assert not at.exception, [e.message for e in at.exception]
    assert "features_image" not in " ".join(c.proto.id for c in at.get("plotly_chart"))
    at.button(key="features_train").click().run()
    assert not at.exception, [e.message for e in at.exception]
    trained = at.session_state[TRAINED]
    m = trained.sae.info["metrics"]
    assert any(f"explained variance {m['explained_variance']:.3f}" in s.value for s in at.success)
    assert trained.sae.latents == 64 and trained.sae.info["layer"] == 9
    assert trained.sae.info["images"]["names"] == TWO

    # the page's top latents are those of this SAE on the current image (astronaut.jpg)
    from test_features_page import _chart

    point = "blocks.8.resid_post"
    tokens = lens.trace(lens.preprocess([ASSETS / "astronaut.jpg"]), keep=[point])[point][0, 1:]
    maps = trained.sae.encode(tokens).detach().numpy().T.reshape(64, 16, 16)
    titles = [a["text"] for a in _chart(at, "features_image")["layout"]["annotations"]]
    assert [int(t.split()[1]) for t in titles] == [int(j) for j in image_top_latents(maps, 8, "max")]
    assert "features_latent_patches" in " ".join(c.proto.id for c in at.get("plotly_chart"))

    # trained again (other k): the page follows the new SAE, nothing cached from the first one is shown
    at.number_input(key="features_train_topk").set_value(2).run()
    at.button(key="features_train").click().run()
    assert not at.exception, [e.message for e in at.exception]
    again = at.session_state[TRAINED]
    assert again.sae.topk == 2
    maps2 = again.sae.encode(tokens).detach().numpy().T.reshape(64, 16, 16)
    titles2 = [a["text"] for a in _chart(at, "features_image")["layout"]["annotations"]]
    assert [int(t.split()[1]) for t in titles2] == [int(j) for j in image_top_latents(maps2, 8, "max")]
    assert titles2 != titles
    at.number_input(key="features_train_topk").set_value(8).run()
    at.button(key="features_train").click().run()  # the first settings again: the stored SAE, not trained twice
    assert at.session_state[TRAINED] is trained

    [zip_button] = [b.proto for b in at.get("download_button") if b.proto.label == "Download (zip)"]
    assert zip_button.ignore_rerun  # a plain browser download: the click reruns nothing
    # the download, unzipped, is what load_sae and the page's path box read: the same latents drawn
    with zipfile.ZipFile(io.BytesIO(trained.zip)) as z:
        z.extractall(tmp_path)
    folder = tmp_path / trained.folder
    back = vitviz.load_sae(folder)
    np.testing.assert_array_equal(back.decoder.detach().numpy(), trained.sae.decoder.detach().numpy())
    at.text_input(key="features_sae").input(str(folder)).run()
    at.radio(key="features_source").set_value("the one at the path").run()
    assert not at.exception, [e.message for e in at.exception]
    assert [a["text"] for a in _chart(at, "features_image")["layout"]["annotations"]] == titles


@pytest.mark.slow
def test_on_a_shared_server_the_page_trains_within_the_cap_without_a_path_box(operator_env):
    from streamlit.testing.v1 import AppTest

    from ui.features import TRAINED
    from vitviz.features.session import SHARED_CAP

    operator_env(VITVIZ_SHARED="1", VITVIZ_MAX_RUNS="1")
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/12_features.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not any(t.key == "features_sae" for t in at.text_input)  # no server path a browser user names
    assert any("Give an SAE above (train one)" in i.value for i in at.info)
    assert any(f"This server trains at most {SHARED_CAP.text()} at once." in c.value for c in at.caption)
    assert at.select_slider(key="features_train_latents").options[-1] == str(SHARED_CAP.latents)
    assert at.number_input(key="features_train_epochs").max == SHARED_CAP.epochs
    at.checkbox(key="features_train_samples").uncheck().run()
    at.select_slider(key="features_train_latents").set_value(64).run()
    at.checkbox(key="features_train_until").uncheck().run()
    at.number_input(key="features_train_epochs").set_value(5).run()
    at.button(key="features_train").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state[TRAINED].sae.latents == 64
    assert "features_image" in " ".join(c.proto.id for c in at.get("plotly_chart"))
