"""``python -m vitviz probe INPUT... --patch-masks DIR``: mask PNGs on the model's patch grid, the files, and each
mistake in a sentence naming the file (nothing written)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import vitviz
from vitviz.cli import main
from vitviz.probes.concepts import ConceptTarget, read_concept
from vitviz.probes.masks import read_mask

from test_probe_head import ARCH, save_backbone
from test_probes import noise_images

IMG = 64  # 4x4 patches of 16 px


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return save_backbone(tmp_path_factory.mktemp("concepts_cli") / "tiny.safetensors", seed=3)


def model_args(weights) -> list[str]:
    return ["--model", ARCH, "--checkpoint", str(weights), "--img-size", str(IMG), "--device", "cpu"]


def grid_png(path, cells: np.ndarray):
    Image.fromarray(np.where(cells, 255, 0).astype(np.uint8)).save(path)


def test_an_image_sized_mask_goes_through_the_models_resize_and_crop(weights, tmp_path):
    lens = vitviz.open(ARCH, checkpoint=str(weights), img_size=IMG, device="cpu")
    # a 128x64 image: shorter side 64 -> 71 (crop_pct 0.9), width 142, centre crop of 64 starts at x = 39. White at
    # x in [64, 76) of the original lands on [32, 45.1) of the model input: 13 of column 2's 16 pixels, none of 3's.
    # A resize without the crop would put it on [32, 38): 6 of 16, and column 2 would not be marked.
    mask = np.zeros((64, 128), np.uint8)
    mask[:, 64:76] = 255
    Image.fromarray(mask).save(tmp_path / "wide.png")
    cells = read_mask(tmp_path / "wide.png", (128, 64), (4, 4), lambda im: lens.preprocess([im]).images[0])
    expected = np.zeros((4, 4), bool)
    expected[:, 2] = True
    np.testing.assert_array_equal(cells, expected)
    grid_png(tmp_path / "grid.png", expected.T)  # one pixel per patch
    np.testing.assert_array_equal(read_mask(tmp_path / "grid.png", (128, 64), (4, 4), None), expected.T)


@pytest.mark.slow
def test_probe_patch_masks_writes_every_layers_probe_and_the_maps(weights, tmp_path, capsys):
    images = noise_images(tmp_path / "images", 3, 5, size=IMG)
    masks = tmp_path / "masks"
    masks.mkdir()
    rng = np.random.default_rng(0)
    painted = [rng.random((4, 4)) < 0.3 for _ in range(2)]
    for path, cells in zip(images, painted):  # img2 has no mask: mapped only
        grid_png(masks / f"{path.stem}.png", cells)
    out = tmp_path / "out"
    assert main(["probe", str(tmp_path / "images"), "--patch-masks", str(masks), "--out", str(out),
                 *model_args(weights)]) == 0
    printed = capsys.readouterr()
    assert "balanced accuracy" in printed.out and "img2.png: 0 concept, 0 not-concept, 16 left out" in printed.err
    assert sorted(p.name for p in out.iterdir()) == ["concept_maps.npz", "probe.json", "probe.safetensors"]
    info = json.loads((out / "probe.json").read_text())
    assert info["kind"] == "patch" and [r["layer"] for r in info["layers"]] == list(range(1, 13))
    assert info["holdout"].startswith("whole painted images") and info["images"][0]["concept"] == int(painted[0].sum())
    maps = np.load(out / "concept_maps.npz")
    assert maps["probability"].shape == (3, 12, 4, 4) and list(maps["names"]) == [str(p) for p in images]
    np.testing.assert_array_equal(maps["labels"][1], painted[1].astype(np.int8))
    concept = read_concept(out / "probe.safetensors")
    assert concept.weight.shape == (12, 192) and concept.num_prefix_tokens == 1
    # the file's probe gives the file's map
    lens = vitviz.open(ARCH, checkpoint=str(weights), img_size=IMG, device="cpu")
    target = ConceptTarget(out / "probe.safetensors", 7)
    tokens = lens.trace(lens.preprocess(images[2:]), keep=[target.point])[target.point]
    probability = 1 / (1 + np.exp(-concept.logits(tokens, 7).double().numpy()))
    np.testing.assert_allclose(probability.reshape(4, 4), maps["probability"][2, 6], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mistake, sentence", [
    ("wrong size", r"img0.png is 5x5 pixels; a mask is the size of its image \(64x64\) or of the patch grid \(4x4"),
    ("no image", r"ghost.png is a mask for ghost, which is not among the images given \(img0, img1\)"),
    ("no masks", r"masks holds no mask PNGs"),
    ("layer", r"--layer picks an image probe's head layer"),
    ("ray", r"--patch-masks runs in this process"),
])
def test_mask_mistakes_get_a_sentence_naming_the_file_and_write_nothing(weights, tmp_path, capsys, mistake, sentence):
    images = noise_images(tmp_path / "images", 2, 6, size=IMG)
    masks = tmp_path / "masks"
    masks.mkdir()
    if mistake == "wrong size":
        Image.new("L", (5, 5), 255).save(masks / "img0.png")
    elif mistake in ("no image", "layer", "ray"):
        grid_png(masks / "img0.png", np.eye(4, dtype=bool))
        if mistake == "no image":
            grid_png(masks / "ghost.png", np.eye(4, dtype=bool))
    out = tmp_path / "out"
    extra = {"layer": ["--layer", "3"], "ray": ["--engine", "ray"]}.get(mistake, [])
    assert main(["probe", *map(str, images), "--patch-masks", str(masks), "--out", str(out), *extra,
                 *model_args(weights)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert __import__("re").search(sentence, err), err
    assert not out.exists() or not any(p.suffix in (".json", ".safetensors", ".npz") for p in out.iterdir())
