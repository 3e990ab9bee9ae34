"""``python -m vitviz readout`` as the docs type it (docs/guide/readout.md), and that page's Python lines for the readout.

The probe lines run on the bundled model with a probe written by tests/test_probe_head.write_probe (random weights,
layer 9, cls+mean pooling); the reference for the written numbers is the probe applied by hand to the bundled model's
own timm blocks (as tests/test_readout.py does in memory), not vitviz's readout.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

import vitviz
from conftest import ASSETS, readme_command
from vitviz.cli import main

pytestmark = pytest.mark.slow


def probe_logits_by_hand(bundled, probe_lens, x: torch.Tensor, layer: int) -> np.ndarray:
    model = bundled.model
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        for blk in model.blocks[:layer + 1]:
            tokens = blk(tokens)
        normed = model.norm(tokens)
        pooled = torch.cat([normed[:, 0], normed[:, model.num_prefix_tokens:].mean(1)], -1)
        head = probe_lens.model.head
        return (pooled @ head.weight.T + head.bias).numpy()


@pytest.fixture(scope="module")
def probe_folder(tmp_path_factory):
    """A folder with photos/ (three sample photos), assets/ and probe/probe.safetensors (layer 9, 1-based)."""
    from test_probe_head import write_probe

    folder = tmp_path_factory.mktemp("readout")
    (folder / "photos").mkdir()
    for name in ("chelsea.jpg", "coffee.jpg", "rocket.jpg"):
        shutil.copy(ASSETS / name, folder / "photos" / name)
    os.symlink(ASSETS, folder / "assets")
    bundled = vitviz.open("bundled", device="cpu")
    write_probe(bundled, folder / "probe", layer=9, pooling="cls+mean", seed=3)
    return folder, bundled


def test_the_probe_line_writes_parts_that_add_up_to_the_probe_applied_by_hand(probe_folder, monkeypatch, capsys):
    folder, bundled = probe_folder
    monkeypatch.chdir(folder)
    assert main(readme_command(".venv/bin/python -m vitviz readout photos/ --head probe/probe.safetensors", None)[2:]) == 0
    out = folder / "readout-probe"
    table = pd.read_parquet(out / "readout.parquet")
    settings = json.loads((out / "settings.json").read_text())
    lens = vitviz.open("bundled", device="cpu", head="probe/probe.safetensors")
    x = lens.preprocess([f"photos/{n}" for n in ("chelsea.jpg", "coffee.jpg", "rocket.jpg")])
    expected = probe_logits_by_hand(bundled, lens, x.tensor, layer=8)[:, 1]
    sums = table.groupby("image").value.sum().to_numpy()
    magnitude = table.assign(a=table.value.abs()).groupby("image").a.sum().to_numpy()
    assert np.all(np.abs(sums - expected) <= 1.2e-7 * magnitude * 30)  # float32 rounding of ~80 terms
    assert settings["target"]["class"] == 1 and settings["indices"].startswith("image, layer, head and class 0-based")
    assert set(table.component) == {"embed", "attn_head", "attn_bias", "mlp", "bias"}
    assert len(table) == 3 * (1 + 9 * 6 + 9 + 9 + 1)
    heads = table[table.component == "attn_head"]
    assert heads.layer.max() == 8 and heads["head"].max() == 5
    lens_table = pd.read_parquet(out / "logit_lens.parquet")
    last = lens_table[(lens_table.layer == 8) & (lens_table["rank"] == 1)].sort_values("image")
    all_logits = probe_logits_by_hand(bundled, lens, x.tensor, layer=8)
    assert last["class"].tolist() == all_logits.argmax(-1).tolist()
    np.testing.assert_allclose(last.logit.to_numpy(), all_logits.max(-1), rtol=1e-5, atol=1e-5)
    maps = np.load(out / "head_patches.npz")["head_patches"]
    assert maps.shape == (3, 9, 6, 16, 16)
    tuned = pd.read_parquet(out / "tuned_lens.parquet")
    assert list(tuned.layer) == list(range(9)) and {"kl_plain", "kl_tuned", "top1_plain", "top1_tuned"} <= set(tuned)
    printed = capsys.readouterr().out
    assert re.search(r"3 images, target logit of class 1 \(class b\): the head with the largest mean direct share "
                     r"is layer \d+ head \d+", printed)


def test_the_bundled_line_splits_the_pooled_projection_and_has_no_logit_lens(probe_folder, monkeypatch, tmp_path):
    folder, bundled = probe_folder
    monkeypatch.chdir(folder)
    assert main(readme_command(".venv/bin/python -m vitviz readout assets/ --out", tmp_path / "out")[2:]) == 0
    table = pd.read_parquet(tmp_path / "out" / "readout.parquet")
    assert table.image.nunique() == 4
    assert not (tmp_path / "out" / "logit_lens.parquet").exists()
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    assert settings["target"]["kind"] == "projection" and "no classifier head" in settings["logit_lens"]
    # the projection of the pooled vector on its own direction is its norm: the parts add up to it
    x = bundled.preprocess(sorted(str(p) for p in ASSETS.glob("*.jpg")))
    pooled = bundled.trace(x, keep=["pooled"])["pooled"]
    sums = table.groupby("image").value.sum().to_numpy()
    np.testing.assert_allclose(sums, pooled.norm(dim=-1).numpy(), rtol=1e-4)


def test_a_bad_target_is_a_sentence_naming_it(probe_folder, monkeypatch, tmp_path, capsys):
    folder, _ = probe_folder
    monkeypatch.chdir(folder)
    code = main(["readout", "photos/chelsea.jpg", "--head", "probe/probe.safetensors", "--target", "zebra", "--out",
                 str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--target 'zebra' is neither a class index nor a class name" in err and "Traceback" not in err


def test_the_readmes_python_lines_for_the_readout_run_as_written(probe_folder, monkeypatch):
    folder, _ = probe_folder
    monkeypatch.chdir(folder)
    readme = (ASSETS.parent / "docs" / "guide" / "readout.md").read_text()
    block = re.search(r"```python\n(import vitviz\nlens = vitviz.open\(\"bundled\", head=\"probe/probe.safetensors\"\)"
                      r".*?)```", readme, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README readout block", "exec"), scope)
    r = scope["r"]
    assert r.heads.shape == (2, 9, 6) and r.patches(layer=8, head=2).shape == (2, 16, 16)
    assert np.all(np.abs(r.residual) <= 1e-4 * np.abs(r.total).max())
    assert scope["ll"].logits.shape == (2, 9, 3) and scope["ll"].patches.shape == (2, 9, 257, 3)
    assert len(scope["tuned"].fit) == 9
    # the shared forward's readouts are the ones each ran alone (the same arithmetic: equality is the point)
    np.testing.assert_array_equal(scope["r1"].heads, r.heads)
    np.testing.assert_array_equal(scope["ll1"].logits, scope["ll"].logits)


def test_readout_on_ray_writes_the_tables_the_local_engine_writes(tmp_path, ray_session):
    """One Ray actor holding a tiny ViT with a head: the same rows and values as this process computes."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "tiny.safetensors"))
    common = [str(ASSETS / "chelsea.jpg"), str(ASSETS / "coffee.jpg"), str(ASSETS / "rocket.jpg"), "--model",
              "vit_tiny_patch16_224", "--checkpoint", str(tmp_path / "tiny.safetensors"), "--img-size", "32",
              "--device", "cpu", "--batch-size", "2"]
    assert main(["readout", *common, "--out", str(tmp_path / "local")]) == 0
    assert main(["readout", *common, "--engine", "ray", "--workers", "1", "--out", str(tmp_path / "ray")]) == 0
    for name in ("readout.parquet", "logit_lens.parquet"):
        local, ray = (pd.read_parquet(tmp_path / where / name) for where in ("local", "ray"))
        pd.testing.assert_frame_equal(local.drop(columns=["value", "logit", "prob"], errors="ignore"),
                                      ray.drop(columns=["value", "logit", "prob"], errors="ignore"))
        numeric = [c for c in ("value", "logit", "prob") if c in local]
        np.testing.assert_allclose(local[numeric].to_numpy(), ray[numeric].to_numpy(), rtol=1e-5, atol=1e-6)
    assert json.loads((tmp_path / "ray" / "settings.json").read_text())["engine"] == "ray"
