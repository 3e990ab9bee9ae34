"""``python -m vitviz probe`` and ``analyze --head``: files, table, mistakes in a sentence."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitviz.cli import main

from test_probe_head import ARCH, IMG, open_backbone, save_backbone, timm_twin
from test_probes import noise_images, write_csv


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe_cli")
    weights = save_backbone(root / "tiny.safetensors", seed=2)
    for i, cls in enumerate(("cat", "dog")):
        noise_images(root / "set" / cls, 4, 10 + i)
    return root, weights


def model_args(weights) -> list[str]:
    return ["--model", ARCH, "--checkpoint", str(weights), "--img-size", str(IMG), "--device", "cpu"]


@pytest.mark.slow
def test_probe_writes_the_head_and_analyze_head_gives_the_probe_logits(setup, tmp_path, capsys):
    root, weights = setup
    out = tmp_path / "probe"
    assert main(["probe", str(root / "set"), "--folders", "--layer", "5", "--pooling", "mean", "--out", str(out),
                 *model_args(weights)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "5  " in printed and "<- head" in printed and "chance (largest class): 0.500" in printed
    # stderr is no terminal here: one plain line per step, no "\r" (a log showed "features 4/4^Mfeatures and ...")
    assert "\r" not in captured.err and any(line.startswith("8/8 images") for line in captured.err.splitlines()), \
        captured.err
    info = json.loads((out / "probe.json").read_text())
    for row in info["layers"]:  # each layer's C and how many outer folds chose an end of the grid, as printed
        assert f"   {row['C']:g} ({row['C_at_edge']}/{row['folds']})" in printed.splitlines()[row["layer"]]
    search = info["head"]["C_search"]
    assert search["C"] == info["head"]["C"] and search["grid"] == [1e-3, 1e-2, 1e-1, 1.0, 10.0]
    assert (f"note: the head's {search['note']}" in captured.err) == (search["C_at_edge"] is not None)
    assert info["layer"] == 5 and info["pooling"] == "mean" and info["classes"] == ["cat", "dog"]
    assert [r["layer"] for r in info["layers"]] == list(range(1, 13)) and info["chance"] == 0.5
    assert {"accuracy", "low", "high"} <= set(info["layers"][0]) and info["sklearn"]
    assert sorted(i["name"] for i in info["images"])[0] == "cat/img0.png" and len(info["images"]) == 8

    analysis = tmp_path / "analysis"
    image = root / "set" / "dog" / "img1.png"
    assert main(["analyze", str(image), "--head", str(out / "probe.safetensors"), "--attribution", "attnlrp",
                 "--out", str(analysis), *model_args(weights)]) == 0
    arrays = np.load(analysis / "analysis.npz")
    probed = open_backbone(weights, head=out / "probe.safetensors")
    with torch.no_grad():
        expected = timm_twin(probed.model)(probed.preprocess([image]).tensor)
    np.testing.assert_allclose(arrays["logits"], expected.numpy(), rtol=1e-5, atol=1e-6)
    assert arrays["attention"].shape[1] == 5  # the model is the backbone's first 5 blocks and the probe
    settings = json.loads((analysis / "settings.json").read_text())
    assert settings["model"]["probe"] == {"layer": 5, "pooling": "mean", "classes": ["cat", "dog"],
                                          "file": "probe.safetensors"}


def test_probe_mistakes_get_a_sentence_and_write_nothing(setup, tmp_path, capsys):
    root, weights = setup
    bad = write_csv(tmp_path / "labels.csv", [(str(root / "set/cat/img0.png"), "cat"), ("nope.png", "dog"),
                                              (str(root / "set/dog/img0.png"), "dog")])
    assert main(["probe", "--labels", str(bad), "--out", str(tmp_path / "o"), *model_args(weights)]) == 2
    assert "labels.csv line 3: " in capsys.readouterr().err and not list((tmp_path / "o").glob("*"))
    assert main(["probe", str(root / "set"), "--folders", "--layer", "13", "--out", str(tmp_path / "o"),
                 *model_args(weights)]) == 2
    assert "--layer 13 is not a layer" in capsys.readouterr().err
    assert not (tmp_path / "o" / "probe.json").exists()


@pytest.mark.slow
def test_faithfulness_head_runs_chefers_protocols_on_the_probe_classes(setup, tmp_path):
    from test_probe_head import write_probe

    root, weights = setup
    head = write_probe(open_backbone(weights), tmp_path / "probe", 4, "cls")
    out = tmp_path / "faith"
    args = ["faithfulness", str(root / "set" / "cat"), "--head", str(head), "--methods", "attnlrp,gradient_rollout,random",
            "--protocols", "positive,negative", "--steps", "3", "--random-seeds", "2", "--out", str(out),
            *model_args(weights)]
    assert main(args) == 0
    settings = json.loads((out / "settings.json").read_text())
    assert settings["run"]["head"] == str(head)
    import pandas as pd

    aucs = pd.read_parquet(out / "auc.parquet")
    assert set(aucs["protocol"]) >= {"positive", "negative"} and len(set(aucs["image"])) == 4
    # the same folder with another head is another run: refused, not mixed
    other = write_probe(open_backbone(weights), tmp_path / "probe2", 3, "cls")
    assert main([*args[:2], "--head", str(other), *args[4:]]) == 2


@pytest.mark.slow
def test_the_readme_probes_example_runs_as_written(tmp_path, bundled):
    """The probes example (docs/guide/probes.md), typed as it stands, on photos/<class>/ made of crops of two sample photos."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    root = Path(__file__).resolve().parent.parent
    for name in ("astronaut", "rocket"):
        photo = Image.open(root / "assets" / f"{name}.jpg").convert("RGB")
        (tmp_path / "photos" / name).mkdir(parents=True)
        W, H = photo.size
        for i, (x, y) in enumerate([(0, 0), (W // 4, H // 4), (W // 2, 0), (0, H // 2)]):
            photo.crop((x, y, x + W // 2, y + H // 2)).save(tmp_path / "photos" / name / f"{i}.jpg")
    section = (root / "docs" / "guide" / "probes.md").read_text()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["dict_keys(['layer', 'accuracy', 'low', 'high', 'folds', 'C', 'C_at_edge'])",
                                        "2 ('astronaut', 'rocket') True"]
    assert (tmp_path / "probe" / "probe.json").is_file()


def test_stats_head_reads_the_probed_model_and_records_the_head(setup, tmp_path):
    """`stats --head`: the probed model is the backbone's first `layer` blocks, so the table has those layers only
    (the backbone alone has more), and the summary names the head; a --head per --model is checked like --checkpoint."""
    import pandas as pd

    from test_probe_head import write_probe

    root, weights = setup
    head = write_probe(open_backbone(weights), tmp_path / "probe", 3, "cls")
    args = ["stats", str(root / "set" / "dog"), "--workers", "0", *model_args(weights)]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--head", str(head), "--out", str(tmp_path / "headed")]) == 0
    plain = pd.read_parquet(tmp_path / "plain" / "stats.parquet")
    headed = pd.read_parquet(tmp_path / "headed" / "stats.parquet")
    depth = open_backbone(weights).num_layers
    assert sorted(set(plain["layer"])) == list(range(depth)) and depth > 3
    assert sorted(set(headed["layer"])) == [0, 1, 2]
    # the blocks the probed model keeps attend as the backbone's do
    key = ["image", "layer", "head"]
    same = plain[plain["layer"] < 3].sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(same[key + ["entropy"]], headed.sort_values(key).reset_index(drop=True)[key + ["entropy"]])
    summary = json.loads((tmp_path / "headed" / "summary.json").read_text())
    assert summary["settings"]["heads"] == [str(head)]
    assert main([*args, "--head", str(head), "--head", str(head), "--out", str(tmp_path / "two")]) == 2
