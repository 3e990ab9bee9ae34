"""CKA (vitviz.analyses.similarity, vitviz.similarity): against the papers' formulas written out in numpy, a peer's
implementation (ckatorch 1.0.3), the invariances CKA must and must not have, and tiny models with planted layers."""
from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pandas as pd
import pytest
import timm
import torch

import vitviz
from conftest import ASSETS, readme_command
from vitviz.analyses.similarity import MinibatchCKA, gram, linear_cka, self_hsic, unbiased_hsic, weighted_hsic
from vitviz.cli import main
from vitviz.errors import VitvizError
from vitviz.lens import Lens
from vitviz.runs.layer_features import CNNFeatures, LensFeatures
from vitviz.sources.models import ModelSpec, _finish

F64 = float(np.finfo(np.float64).eps)
F32 = float(np.finfo(np.float32).eps)


def features(n: int, d: int, seed: int, mean: float = 3.0) -> np.ndarray:
    """Correlated features with a non-zero mean (a CKA that forgot to centre gets them wrong)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + mean


def related(x: np.ndarray, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.tanh(x @ rng.normal(size=(x.shape[1], d)) / np.sqrt(x.shape[1])) + 0.3 * rng.normal(size=(len(x), d))


def kornblith(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA as printed (Kornblith et al. 2019, eq. 5): ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F), centred, float64."""
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def song_hsic(k: np.ndarray, l: np.ndarray) -> float:
    """The unbiased HSIC as the U-statistic it is (Song et al. 2012, the sums over distinct indices of their eq. 4):
    mean over i≠j of k_ij l_ij + mean over distinct (i,j,q,r) of k_ij l_qr - 2 mean over distinct (i,j,q) of k_ij l_iq.
    Written with loops over index tuples, independent of the closed form under test."""
    n = len(k)
    pairs = np.mean([k[i, j] * l[i, j] for i, j in itertools.permutations(range(n), 2)])
    quads = np.mean([k[i, j] * l[q, r] for i, j, q, r in itertools.permutations(range(n), 4)])
    triples = np.mean([k[i, j] * l[i, q] for i, j, q in itertools.permutations(range(n), 3)])
    return pairs + quads - 2 * triples


def tiny_lens(depth: int = 4, seed: int = 0) -> Lens:
    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, depth=depth, embed_dim=48, num_heads=3,
                              img_size=64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return Lens(_finish(model, ModelSpec(name="vit_small_patch16_224", device="cpu"), "random", "tiny ViT", []))


def photos(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (72, 72, 3), dtype=np.uint8) for _ in range(n)]


# --- the estimators against the papers' formulas ------------------------------------------------------------------
def test_linear_cka_equals_kornblith_formula_on_uncentred_features():
    x, y = features(50, 12, 0), related(features(50, 12, 0), 7, 1) + 5
    # Both sides sum n*F products of centred float64 values: a few eps times (n + F) relative.
    assert linear_cka(x, y) == pytest.approx(kornblith(x, y), rel=64 * F64 * (50 + 12))
    assert 0.2 < kornblith(x, y) < 0.95  # a value a wrong formula would miss, not an edge


def test_unbiased_hsic_equals_song_u_statistic_for_every_pair_of_grams():
    x, y = features(8, 5, 2), related(features(8, 5, 2), 3, 3)
    k = gram(torch.from_numpy(np.stack([x, x * 2 + 1])))  # (2, 8, 8): two "layers"
    l = gram(torch.from_numpy(y))[None]
    got = unbiased_hsic(k, l).numpy()
    want = np.array([[song_hsic(ki, l[0].numpy())] for ki in k.numpy()])
    scale = np.abs(k.numpy()).max() * np.abs(l.numpy()).max()  # each term's size; the sums cancel to the answer
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * F64 * scale)
    np.testing.assert_allclose(self_hsic(k).numpy(), [song_hsic(ki, ki) for ki in k.numpy()], rtol=0,
                               atol=64 * F64 * np.abs(k.numpy()).max() ** 2)


def weighted_u_statistic(k: np.ndarray, l: np.ndarray, w: np.ndarray) -> float:
    """Song's three means over distinct indices, each weighted by the product of its examples' weights, by loops."""
    n = len(k)

    def mean(order, term):
        tuples = list(itertools.permutations(range(n), order))
        weights = np.array([np.prod(w[list(t)]) for t in tuples])
        return np.dot(weights, [term(*t) for t in tuples]) / weights.sum()

    return (mean(2, lambda i, j: k[i, j] * l[i, j]) + mean(4, lambda i, j, q, r: k[i, j] * l[q, r])
            - 2 * mean(3, lambda i, j, q: k[i, j] * l[i, q]))


def test_the_bootstraps_weighted_hsic_is_the_weighted_u_statistic_and_the_plain_one_at_unit_weights():
    x, y = features(7, 5, 20), related(features(7, 5, 20), 3, 21)
    k = gram(torch.from_numpy(np.stack([x, x[:, ::-1] ** 2])))
    l = gram(torch.from_numpy(y))[None]
    w = torch.from_numpy(np.random.default_rng(22).exponential(size=(3, 7)))
    got = weighted_hsic(k, l, w).numpy()
    scale = np.abs(k.numpy()).max() * np.abs(l.numpy()).max()
    for r in range(3):
        want = [weighted_u_statistic(ki, l[0].numpy(), w[r].numpy()) for ki in k.numpy()]
        np.testing.assert_allclose(got[r, :, 0], want, rtol=0, atol=256 * F64 * scale)
    np.testing.assert_allclose(weighted_hsic(k, k, w, same=True).numpy(),
                               np.einsum("raa->ra", weighted_hsic(k, k, w).numpy()), rtol=1e3 * F64)
    ones = torch.ones(1, 7, dtype=torch.float64)
    np.testing.assert_allclose(weighted_hsic(k, l, ones)[0].numpy(), unbiased_hsic(k, l).numpy(), rtol=1e3 * F64)
    chosen = [0, 2, 3, 5, 6]  # 0/1 weights: the plain estimator on the chosen examples
    subset = torch.zeros(1, 7, dtype=torch.float64)
    subset[0, chosen] = 1
    np.testing.assert_allclose(weighted_hsic(k, l, subset)[0].numpy(),
                               unbiased_hsic(k[:, chosen][:, :, chosen], l[:, chosen][:, :, chosen]).numpy(),
                               rtol=1e3 * F64)


def test_minibatch_cka_is_the_ratio_of_summed_unbiased_hsics():
    x, y = features(24, 6, 4), related(features(24, 6, 4), 5, 5)
    batches = np.split(np.arange(24), 3)
    accumulator = MinibatchCKA(1, 1, replicates=0)
    for b in batches:
        accumulator.update(gram(torch.from_numpy(x[b]))[None], gram(torch.from_numpy(y[b]))[None])
    grams = [(x[b] @ x[b].T, y[b] @ y[b].T) for b in batches]
    xy = sum(song_hsic(k, l) for k, l in grams)
    xx, yy = sum(song_hsic(k, k) for k, _ in grams), sum(song_hsic(l, l) for _, l in grams)
    cka, low, high = accumulator.result()
    assert cka[0, 0] == pytest.approx(xy / np.sqrt(xx * yy), rel=1e3 * F64)
    assert np.isnan(low).all() and np.isnan(high).all()  # no interval asked for


def test_minibatch_cka_nears_the_full_batch_value_as_batches_grow():
    x = features(2048, 8, 6)
    y = related(x, 8, 7)
    full = linear_cka(x, y)
    gaps = []
    for size in (8, 64, 1024):
        accumulator = MinibatchCKA(1, 1, replicates=0)
        for b in np.split(np.arange(2048), 2048 // size):
            accumulator.update(gram(torch.from_numpy(x[b]))[None], gram(torch.from_numpy(y[b]))[None])
        gaps.append(abs(accumulator.result()[0][0, 0] - full))
    # The biased full-batch estimate and the unbiased minibatch one differ by O(1/n) bias and O(1/sqrt(n)) noise.
    assert gaps[-1] < 0.01 and gaps[-1] < gaps[0]


def test_ckatorch_gives_the_same_numbers():
    ckatorch = pytest.importorskip("ckatorch")
    x, y = features(40, 10, 8), related(features(40, 10, 8), 6, 9)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    assert linear_cka(x, y) == pytest.approx(float(ckatorch.cka_base(tx, ty)), rel=1e3 * F64)
    # Minibatch, linear kernel: ckatorch's cka_batch takes the minibatches stacked (batches, n, F).
    accumulator = MinibatchCKA(1, 1, replicates=0)
    for b in np.split(np.arange(40), 5):
        accumulator.update(gram(tx[b])[None], gram(ty[b])[None])
    peer = ckatorch.cka_batch(tx.reshape(5, 8, 10), ty.reshape(5, 8, 6))
    assert accumulator.result()[0][0, 0] == pytest.approx(float(peer), rel=1e3 * F64)
    # RBF, one batch: ckatorch's unbiased centring (Kornblith's code) gives the same CKA as the unbiased HSIC.
    rbf = MinibatchCKA(1, 1, replicates=0)
    rbf.update(gram(tx, "rbf", 0.8)[None], gram(ty, "rbf", 0.8)[None])
    peer = ckatorch.cka_base(tx, ty, kernel="rbf", unbiased=True, threshold=0.8)
    assert rbf.result()[0][0, 0] == pytest.approx(float(peer), rel=1e3 * F64)


def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling_not_to_other_linear_maps():
    x = features(64, 10, 10)
    y = related(x, 10, 11)
    q, _ = np.linalg.qr(np.random.default_rng(12).normal(size=(10, 10)))
    base = linear_cka(x, y)
    tol = 256 * F64 * 64
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=tol)
    assert linear_cka(x * 7.5, y) == pytest.approx(base, rel=tol)
    stretch = np.diag(np.geomspace(1, 30, 10))  # invertible, not orthogonal: weights some directions 30x
    assert abs(linear_cka(x @ stretch, y) - base) > 0.05

    def minibatch(a):
        acc = MinibatchCKA(1, 1, replicates=0)
        for b in np.split(np.arange(64), 4):
            acc.update(gram(torch.from_numpy(a[b]))[None], gram(torch.from_numpy(y[b]))[None])
        return acc.result()[0][0, 0]

    # The minibatch estimator uses the uncentred Gram matrices: the unbiased HSIC ignores the features' mean.
    assert minibatch(x @ q) == pytest.approx(minibatch(x), rel=tol)
    assert minibatch(x * 0.01 + 4) == pytest.approx(minibatch(x), rel=tol)
    assert abs(minibatch(x @ stretch) - minibatch(x)) > 0.05


# --- planted layers in a tiny ViT, through vitviz.similarity ----------------------------------------------------
def test_a_block_that_copies_its_input_is_identical_to_the_previous_layer():
    lens = tiny_lens()
    with torch.no_grad():  # block 3 (index 2) adds nothing: both branches' last layers write zeros
        blk = lens.model.blocks[2]
        for p in (blk.attn.proj.weight, blk.attn.proj.bias, blk.mlp.fc2.weight, blk.mlp.fc2.bias):
            p.zero_()
    result = vitviz.similarity(lens, lens, photos(12), batch_size=4)
    assert result.cka.shape == (4, 4) and result.images == 12
    # The same float64 Gram matrices on both sides; the cross and self HSIC sum them in other orders and their
    # three terms cancel: a few hundred eps.
    exact = 1e3 * F64
    assert result.cka[2, 1] == pytest.approx(1.0, abs=exact)
    assert result.cka[3, 1] < 1 - 1e-3  # the next block does change them
    np.testing.assert_allclose(np.diag(result.cka), 1.0, atol=exact)
    np.testing.assert_allclose(result.cka, result.cka.T, atol=exact)


@pytest.mark.parametrize("pooling", ["tokens", "mean", "cls"])
def test_a_block_whose_output_is_a_rotation_of_its_input_has_cka_one(pooling):
    lens = tiny_lens()
    with torch.no_grad():
        blk = lens.model.blocks[2]
        for p in (blk.attn.proj.weight, blk.attn.proj.bias, blk.mlp.fc2.weight, blk.mlp.fc2.bias):
            p.zero_()
    q, _ = torch.linalg.qr(torch.randn(48, 48, generator=torch.Generator().manual_seed(0)))
    rotated = LensFeatures(lens, edit={"blocks.2.resid_post": lambda v, point: v @ q})
    result = vitviz.similarity(rotated, rotated, photos(12), pooling=pooling, batch_size=4)
    # The rotation runs in float32: each feature off by ~D eps32 relative, the CKA by a few times that.
    assert result.cka[2, 1] == pytest.approx(1.0, abs=64 * 48 * F32)
    assert result.cka[1, 0] < 0.999  # a real block changes the representation: the 1 above is not a constant


def test_a_block_replaced_by_noise_is_unrelated_to_every_layer_and_its_interval_says_how_near():
    lens = tiny_lens()
    generator = torch.Generator().manual_seed(1)
    noisy = LensFeatures(lens, edit={"blocks.3.resid_post": lambda v, p: torch.randn(v.shape, generator=generator)})
    result = vitviz.similarity(noisy, noisy, photos(64), pooling="mean", batch_size=16, bootstrap=300)
    assert result.settings["minibatches"] == 4
    noise_row = result.cka[3, :3]
    assert np.abs(noise_row).max() < 0.15
    assert (result.low[3, :3] <= noise_row).all() and (noise_row <= result.high[3, :3]).all()
    assert (result.low[3, :3] < 0).all() and (result.high[3, :3] < 0.3).all()  # the interval holds 0, and not 0.3
    assert result.low[1, 0] > 0.5  # the model's own neighbouring blocks stay related, interval and all


def test_a_vit_against_a_cnn_reads_every_stage_and_refuses_cls_pooling():
    lens = tiny_lens(depth=2)
    cnn = CNNFeatures(timm.create_model("resnet18", pretrained=False))
    result = vitviz.similarity(lens, cnn, photos(8), pooling="tokens", batch_size=4)
    assert result.cka.shape == (2, 5) and result.layers_b == ("act1", "layer1", "layer2", "layer3", "layer4")
    assert np.isfinite(result.cka).all() and np.isfinite(result.low).all()
    table = result.table()
    assert list(table.columns) == ["layer_a", "layer_b", "cka", "low", "high", "images"] and len(table) == 10
    assert table.loc[(table.layer_a == 1) & (table.layer_b == 3), "cka"].item() == result.cka[1, 3]
    with pytest.raises(VitvizError, match="no CLS token"):
        vitviz.similarity(lens, cnn, photos(4), pooling="cls", batch_size=4)
    with pytest.raises(VitvizError, match="4 or more"):
        vitviz.similarity(lens, lens, photos(3))


def test_the_curve_pairs_layers_at_the_same_relative_depth_or_each_layer_with_the_next():
    result = vitviz.Similarity(cka=np.arange(12.0).reshape(4, 3), low=np.zeros((4, 3)), high=np.ones((4, 3)),
                               images=4, layers_a=("a",) * 4, layers_b=("b",) * 3)
    assert result.diagonal()["layer_b"].tolist() == [0, 1, 1, 2]  # depth 1/4 -> 1/3, 2/4 -> 2/3 (rounded), ...
    assert result.diagonal()["cka"].tolist() == [0.0, 4.0, 7.0, 11.0]
    within = vitviz.Similarity(cka=np.arange(9.0).reshape(3, 3), low=np.zeros((3, 3)), high=np.ones((3, 3)),
                               images=4, layers_a=("a",) * 3, layers_b=("a",) * 3, settings={"same_model": True})
    assert within.diagonal()[["layer_a", "layer_b", "cka"]].to_numpy().tolist() == [[0, 1, 1.0], [1, 2, 5.0]]


def test_few_images_leave_an_undefined_self_hsic_out_of_the_interval_not_in_it():
    # Four images: many replicates' weighted self-HSIC is <= 0. Such a replicate must not turn a layer's CKA with
    # itself into -1 (the sign of a negative self-HSIC over its absolute value).
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(4, 6)) ** 3)  # heavy tails: ~40 % such replicates
    accumulator = MinibatchCKA(1, 1, replicates=400, seed=1)
    accumulator.update(gram(x)[None], gram(x)[None], same=True)
    assert (accumulator.aa[1:] <= 0).mean() > 0.2
    cka, low, high = accumulator.result()
    assert cka[0, 0] == pytest.approx(1.0, abs=1e3 * F64)
    assert low[0, 0] == pytest.approx(1.0, abs=1e3 * F64) and high[0, 0] == pytest.approx(1.0, abs=1e3 * F64)


# --- the command line, as the README types it -------------------------------------------------------------------
SAMPLES = sorted(p for p in ASSETS.iterdir() if p.suffix == ".jpg")


@pytest.mark.slow
def test_readme_similarity_within_the_bundled_model_writes_the_python_calls_numbers(tmp_path, monkeypatch, bundled):
    monkeypatch.chdir(ASSETS.parent)
    out = tmp_path / "cka"
    args = readme_command(".venv/bin/python -m vitviz similarity assets/ --out", out)
    assert args[:2] == ["-m", "vitviz"] and main(args[2:]) == 0
    table = pd.read_parquet(out / "cka.parquet")
    settings = json.loads((out / "settings.json").read_text())
    assert list(table.columns) == ["layer_a", "layer_b", "cka", "low", "high", "images"] and len(table) == 144
    assert (table["images"] == 4).all() and settings["layers_a"][0] == "block 1" and settings["pooling"] == "tokens"
    lens = Lens(bundled)
    want = vitviz.similarity(lens, lens, SAMPLES)  # the same images, the same seed: the same numbers
    np.testing.assert_array_equal(table.pivot(index="layer_a", columns="layer_b", values="cka").to_numpy(), want.cka)
    np.testing.assert_array_equal(table["low"].to_numpy(), want.low.ravel())
    # A percentile interval over four images need not hold the estimate (it does not for a few pairs at seeds 0-2):
    # the bounds are only ordered.
    assert (table["low"] <= table["high"]).all()
    assert not list(out.glob(".*"))  # no temporary or lock file left behind


@pytest.mark.slow
def test_readme_similarity_of_the_bundled_model_against_a_resnet50_checkpoint(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    resnet = timm.create_model("resnet50", pretrained=False).eval()
    save_file(resnet.state_dict(), tmp_path / "resnet50.safetensors")
    (tmp_path / "photos").mkdir()
    for p in SAMPLES:
        (tmp_path / "photos" / p.name).write_bytes(p.read_bytes())
    monkeypatch.chdir(tmp_path)
    args = readme_command(".venv/bin/python -m vitviz similarity photos/ --model bundled --model resnet50", None)
    assert args[:2] == ["-m", "vitviz"] and main(args[2:]) == 0
    table = pd.read_parquet(tmp_path / "cka_resnet" / "cka.parquet")
    settings = json.loads((tmp_path / "cka_resnet" / "settings.json").read_text())
    assert settings["layers_b"] == ["act1", "layer1", "layer2", "layer3", "layer4"] and settings["pooling"] == "mean"
    assert len(table) == 12 * 5 and table[["cka", "low", "high"]].notna().all().all()
    cnn = CNNFeatures(resnet)  # the checkpoint's weights, read back: the same stages' numbers
    want = vitviz.similarity(vitviz.open("bundled", device="cpu"), cnn, sorted((tmp_path / "photos").iterdir()),
                             pooling="mean")
    np.testing.assert_allclose(table.pivot(index="layer_a", columns="layer_b", values="cka").to_numpy(), want.cka,
                               rtol=0, atol=0)
    # The guide's Python block, run as it stands beside the same files.
    (tmp_path / "assets").mkdir()
    for p in SAMPLES:
        (tmp_path / "assets" / p.name).write_bytes(p.read_bytes())
    section = (ASSETS.parent / "docs" / "guide" / "similarity.md").read_text()
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)
    assert namespace["s"].cka.shape == (12, 12) and namespace["t"].cka.shape == (12, 5)
    np.testing.assert_array_equal(namespace["t"].cka, want.cka)


def test_similarity_refuses_three_models_and_a_point_without_tokens(tmp_path, capsys):
    assert main(["similarity", str(ASSETS), "--model", "a", "--model", "b", "--model", "c",
                 "--out", str(tmp_path / "x")]) == 2
    assert "one model with itself or two models" in capsys.readouterr().err
    with pytest.raises(VitvizError, match="compares token features"):
        LensFeatures(tiny_lens(depth=1), point="attn")


def test_an_unreadable_image_is_skipped_and_the_next_ones_fill_its_minibatch(tmp_path):
    from PIL import Image

    paths = []
    for i, picture in enumerate(photos(9)):
        paths.append(tmp_path / f"p{i}.png")
        Image.fromarray(picture).save(paths[-1])
    paths[2].write_bytes(b"not an image")
    lens = tiny_lens(depth=2)
    good = [p for p in paths if p.name != "p2.png"]
    result = vitviz.similarity(lens, lens, paths, batch_size=4, pooling="mean")
    # Planned as 5 + 4 for nine files: the first minibatch fills up past the bad file (p0..p5), the second is left
    # with three readable images and joins the first rather than being dropped.
    assert result.images == 8 and result.settings["minibatches"] == 1
    assert [name for name, _ in result.settings["skipped"]] == ["p2.png"]
    want = vitviz.similarity(lens, lens, good, batch_size=8, pooling="mean")
    np.testing.assert_array_equal(result.cka, want.cka)
    paths[8].write_bytes(b"not an image either")  # now 5 + 2 readable: the same rule, one minibatch of seven
    assert vitviz.similarity(lens, lens, paths, batch_size=4, pooling="mean").images == 7
    twelve = vitviz.similarity(lens, lens, photos(12), batch_size=5, pooling="mean")
    assert twelve.settings["minibatches"] == 3 and twelve.images == 12  # 4 + 4 + 4: never over batch_size


def test_the_command_exits_1_when_fewer_than_four_images_can_be_read(tmp_path, capsys):
    for i in range(3):
        (tmp_path / f"bad{i}.jpg").write_bytes(b"not an image")
    (tmp_path / "good.jpg").write_bytes((ASSETS / "chelsea.jpg").read_bytes())
    assert main(["similarity", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "skipped bad0.jpg" in err and "fewer than 4 of the 4 images could be read" in err
    assert not (tmp_path / "out" / "cka.parquet").exists()
