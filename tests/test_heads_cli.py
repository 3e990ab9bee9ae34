"""``python -m vitviz qk`` and ``python -m vitviz heads`` on a tiny random ViT-Ti checkpoint (64 px): the files hold
what the library computes (recomputed here from the Trace with numpy), indices as documented, and mistakes get a
sentence with nothing written."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import vitviz
from vitviz.cli import main
from vitviz.heads import patching as pt
from vitviz.heads import qk as qkm

from conftest import ASSETS
from test_heads_patching import NAME, SIZE, _plant, _random, _save

IMAGES = [str(ASSETS / n) for n in ("chelsea.jpg", "coffee.jpg")]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads_cli")
    return {"random": _save(_random(), folder / "random.safetensors"),
            "planted": _save(_plant(_random()), folder / "planted.safetensors")}


def _common(path, out):
    return ["--model", NAME, "--checkpoint", path, "--img-size", str(SIZE), "--device", "cpu", "--out", str(out)]


def test_qk_writes_every_token_of_every_image_once_per_kind_with_the_correlations_of_the_library(weights, tmp_path):
    assert main(["qk", *IMAGES, "--layer", "3", *_common(weights["random"], tmp_path)]) == 0
    table = pd.read_parquet(tmp_path / "qk.parquet")
    settings = json.loads((tmp_path / "settings.json").read_text())
    correlations = json.loads((tmp_path / "correlations.json").read_text())
    N = 17  # CLS + 4 x 4 patches
    assert len(table) == 3 * 2 * 2 * N  # heads x images x kinds x tokens
    assert set(table["layer"]) == {3} and sorted(set(table["head"])) == [1, 2, 3]
    assert settings["layer"] == 3 and settings["heads"] == [1, 2, 3]
    one = table[(table["head"] == 2) & (table["image"] == IMAGES[1]) & (table["kind"] == "key")]
    assert list(one["token"]) == list(range(N))
    assert one["row"].isna().tolist() == [True] + [False] * 16
    assert one["token_name"].iloc[0] == "cls"
    assert list(one["row"].iloc[1:]) == [r for r in range(4) for _ in range(4)]
    assert list(one["column"].iloc[1:]) == list(range(4)) * 4
    # the correlations from the Trace, by hand: head 2 (1-based) of layer 3
    lens = vitviz.open(NAME, checkpoint=weights["random"], img_size=SIZE, device="cpu")
    trace = lens.trace(IMAGES, keep=[("q", 2), ("k", 2)])
    q = trace["q", 2][:, 1].double().numpy()
    k = trace["k", 2][:, 1].double().numpy()
    k = k + (q.reshape(-1, q.shape[-1]).mean(0) - k.reshape(-1, k.shape[-1]).mean(0))
    c = np.sqrt(np.linalg.norm(q, axis=-1).mean() / np.linalg.norm(k, axis=-1).mean())
    q, k = q / c, k * c
    dots = np.concatenate([(q[i] @ k[i].T).ravel() for i in range(2)])
    dist = np.concatenate([np.linalg.norm(q[i][:, None] - k[i][None], axis=-1).ravel() for i in range(2)])
    assert correlations[1]["head"] == 2
    assert correlations[1]["correlation_after"] == pytest.approx(np.corrcoef(dist, dots)[0, 1], abs=1e-9)
    assert correlations[1]["bias_not_in_picture"] is False
    # the coordinates are the library's PCA of the corrected points
    expected = qkm.project(np.concatenate([q.reshape(-1, q.shape[-1]), k.reshape(-1, k.shape[-1])]), "pca")
    head2 = table[table["head"] == 2]
    np.testing.assert_allclose(head2[["x", "y"]].to_numpy(), expected, atol=1e-6)


def test_heads_patch_and_ablate_write_the_planted_head_as_the_one_that_matters(weights, tmp_path):
    out = tmp_path / "patch"
    assert main(["heads", str(ASSETS / "chelsea.jpg"), str(ASSETS / "rocket.jpg"), "--patch", "all",
                 *_common(weights["planted"], out)]) == 0
    table = pd.read_parquet(out / "effects.parquet")
    settings = json.loads((out / "settings.json").read_text())
    assert settings["command"] == "heads --patch" and settings["image_b"].endswith("rocket.jpg")
    moved = table[table["kind"] == "pooled_towards_a"].set_index(["layer", "head"])["effect"]
    assert len(moved) == 36
    assert moved[(2, 3)] == pytest.approx(1.0, abs=1e-5)  # layer 2, head 3 (1-based) is the planted one
    assert moved.drop((2, 3)).abs().max() == 0.0
    out = tmp_path / "ablate"
    assert main(["heads", *IMAGES, "--ablate", "2.3,5", "--mode", "mean", *_common(weights["planted"], out)]) == 0
    table = pd.read_parquet(out / "effects.parquet")
    change = table[table["kind"] == "logit_change"]
    assert len(change) == 4 * 2  # 4 heads x 2 images
    planted = (change["layer"] == 2) & (change["head"] == 3)
    assert (change[~planted]["effect"] == 0).all()  # layer 5's heads write nothing into the stream
    assert (change[planted]["effect"].abs() > 0.01).all()
    assert json.loads((out / "settings.json").read_text())["mode"] == "mean"


@pytest.mark.parametrize("argv,words", [
    (["qk", *IMAGES, "--layer", "13"], "--layer 13 is not a layer of this model (1 to 12)"),
    (["qk", *IMAGES, "--layer", "2", "--head", "4"], "--head 4 is not a head of layer 2 (1 to 3)"),
    (["heads", *IMAGES, "--ablate", "2.9"], "head 9 in '2.9' is out of range"),
    (["heads", IMAGES[0], "--patch", "1.1"], "--patch takes two images"),
])
def test_mistakes_get_a_sentence_and_write_nothing(weights, tmp_path, capsys, argv, words):
    assert main([*argv, *_common(weights["random"], tmp_path)]) == 2
    assert words in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_readme_qk_command_runs_on_the_bundled_model(tmp_path):
    from conftest import readme_command

    assert main(readme_command(".venv/bin/python -m vitviz qk", tmp_path)[2:]) == 0
    correlations = json.loads((tmp_path / "correlations.json").read_text())
    assert [c["head"] for c in correlations] == [1, 2, 3, 4, 5, 6]
    # the bundled model's last layer on the four photos: the corrections bring distance closer to the dot product
    # on average (-0.64 -> -0.77 measured), though not in every head (head 5: -0.63 -> -0.46)
    assert np.mean([c["correlation_after"] for c in correlations]) < np.mean(
        [c["correlation_before"] for c in correlations]) - 0.05
    assert not any(c["bias_not_in_picture"] for c in correlations)  # DINOv2: no bias added to the scores
