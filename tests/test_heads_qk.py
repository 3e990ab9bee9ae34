"""Queries and keys in one picture (vitviz.heads.qk): AttentionViz's corrections are exact on every registered
adapter's tiny model, the correlation figure equals a direct computation, and the projections tell a planted
positional head from a planted content head.

References from outside the code under test: each adapter's own ``layer_qkv`` (the scale and the bias its
dot-product attention uses) and the Trace's ``attn`` point (the model's probabilities); scipy's ``cdist`` and
``pearsonr`` for the correlation; the paper's recipe written out in numpy for the corrections.
"""
import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from scipy.stats import pearsonr, spearmanr

import vitviz
from vitviz.adapters import adapter_for, run
from vitviz.heads import qk as qkm
from vitviz.layout import TokenLayout

from test_adapters import CASES, LOADERS  # noqa: F401  (every timm / torchvision / Swin example)
from test_adapters_hf import CASES as HF_CASES
from test_families import _images, _load, checkpoints  # noqa: F401
from test_hf_hybrid import hf_folders  # noqa: F401

ALL = [(a, f) for a, f, _ in CASES] + [(a, f) for a, f in HF_CASES]


@pytest.fixture(scope="module")
def lenses(checkpoints, hf_folders, tmp_path_factory):  # noqa: F811
    from vitviz.sources.models import ModelSpec, load_model

    out = {}
    for _, family, _ in CASES:
        out[family] = vitviz.Lens(LOADERS[family](tmp_path_factory) if family in LOADERS else _load(family, checkpoints))
    for _, family in HF_CASES:
        out["hf:" + family] = vitviz.Lens(load_model(ModelSpec(name=hf_folders[family])))
    return out


def _key(adapter_name: str, family: str) -> str:
    return ("hf:" + family) if adapter_name.startswith("hf-") and adapter_name not in ("hf-swin", "hf-swinv2") \
        else family


def _paper_corrections(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AttentionViz's recipe as the paper states it, token rows (M, d): translate keys to the queries' mean, then
    balance the mean norms."""
    k = k + (q.mean(axis=0) - k.mean(axis=0))
    c = np.sqrt(np.mean([np.linalg.norm(r) for r in q]) / np.mean([np.linalg.norm(r) for r in k]))
    return q / c, k * c


@pytest.mark.parametrize("adapter_name,family", ALL, ids=[f"{a}-{f}" for a, f in ALL])
def test_corrected_queries_and_keys_give_every_attention_row_of_the_model(adapter_name, family, lenses):
    lens = lenses[_key(adapter_name, family)]
    assert lens.adapter.name == adapter_name
    x = _images(lens.loaded, 2)
    for layer in (0, lens.num_layers - 1):
        trace = lens.trace(x, keep=[("q", layer), ("k", layer), ("scores", layer), ("attn", layer)])
        with torch.no_grad():  # the adapter's points, read by the adapter itself
            own = run(lens.model, x, keep=(f"blocks.{layer}.q", f"blocks.{layer}.k"))
        reference = None
        if lens.scope == "global":  # the scale and bias the adapter's own dot product uses
            try:
                _, _, _, scale, _, bias = lens.adapter.layer_qkv(lens.model, x, layer)
                reference = (scale, None if bias is None else bias.detach().double().numpy())
            except NotImplementedError:  # torchvision's MultiheadAttention: 1 / sqrt(d), no bias
                reference = (trace["q", layer].shape[-1] ** -0.5, None)
        heads = trace["q", layer].shape[-3]
        for head in range(heads):
            qk = qkm.head_qk(trace, layer, head)
            G, N, d = qk.queries.shape
            assert np.array_equal(qk.queries, own[f"blocks.{layer}.q"][..., head, :, :].double().reshape(G, N, d).numpy())
            assert np.array_equal(qk.keys, own[f"blocks.{layer}.k"][..., head, :, :].double().reshape(G, N, d).numpy())
            attn = trace["attn", layer][..., head, :, :].double().reshape(G, N, N).numpy()
            scores = trace["scores", layer][..., head, :, :].double().reshape(G, N, N).numpy()
            fixed = qkm.correct(qk.queries, qk.keys)
            # the corrections are the paper's, step for step
            pq, pk = _paper_corrections(qk.queries.reshape(-1, d), qk.keys.reshape(-1, d))
            # float64 corrections: means and norms over the image's tokens,
            # summed(n_tokens, EPS64) ~ 1e-14 for a tiny model's <= 50 tokens
            np.testing.assert_allclose(fixed.queries.reshape(-1, d), pq, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(fixed.keys.reshape(-1, d), pk, rtol=1e-12, atol=1e-12)
            parts = qkm.score_scale_and_bias(qk.queries, qk.keys, scores, qk.windows)
            rows = qkm.attention_rows(fixed.queries, fixed.keys, parts.scale, parts.bias)
            # float32 probabilities (<= 1) against float64 from float32 scores: rounding of the scores only.
            assert np.abs(rows - attn).max() <= 1e-6, (layer, head)
            if reference is not None:
                scale, bias = reference
                assert abs(parts.scale - scale) <= 1e-5 * scale
                assert parts.has_bias == (bias is not None and np.ptp(bias) > 0)
                b = None if bias is None else np.broadcast_to(bias[:, head], (2, N, N))
                rows = qkm.attention_rows(fixed.queries, fixed.keys, scale, b)
                assert np.abs(rows - attn).max() <= 1e-6, (layer, head)


def test_translation_meets_the_means_and_scaling_balances_the_norms():
    rng = np.random.default_rng(0)
    q = rng.normal(2.0, 1.0, (3, 10, 8))
    k = rng.normal(-5.0, 0.3, (3, 10, 8))
    moved, t = qkm.translate_keys(q, k)
    # float64 means of 30 keys: summed(30, EPS64) times the mean's scale (~5)
    np.testing.assert_allclose(moved.reshape(-1, 8).mean(0), q.reshape(-1, 8).mean(0), atol=1e-12)
    fixed = qkm.correct(q, k)
    # after scaling: the same mean norm, the same dot products as before scaling
    assert np.linalg.norm(fixed.queries, axis=-1).mean() == pytest.approx(np.linalg.norm(fixed.keys, axis=-1).mean(),
                                                                          rel=1e-12)
    np.testing.assert_allclose(fixed.queries @ np.swapaxes(fixed.keys, -1, -2), q @ np.swapaxes(moved, -1, -2),
                               rtol=1e-10)
    assert fixed.scale == pytest.approx(np.sqrt(np.linalg.norm(q, axis=-1).mean() / np.linalg.norm(moved, axis=-1).mean()))


def test_distance_dot_correlation_equals_scipy_over_the_pairs_of_each_image():
    rng = np.random.default_rng(1)
    # keys a hundred times shorter than the queries: raw distance is the query's norm, not the dot product
    q = rng.normal(0.0, 10.0, (3, 7, 5))
    k = rng.normal(0.0, 0.1, (3, 7, 5))
    distance, dots = [], []
    for g in range(3):  # pairs inside one image only
        distance.append(cdist(q[g], k[g]).ravel())
        dots.append(np.array([[q[g, i] @ k[g, j] for j in range(7)] for i in range(7)]).ravel())
    expected = pearsonr(np.concatenate(distance), np.concatenate(dots)).statistic
    # float64 Pearson over 147 pairs, ours vs scipy's: summed(147, EPS64) = 3.3e-14, |r| <= 1
    assert qkm.distance_dot_correlation(q, k) == pytest.approx(expected, abs=1e-12)
    fixed = qkm.correct(q, k)
    distance = np.concatenate([cdist(fixed.queries[g], fixed.keys[g]).ravel() for g in range(3)])
    dots = np.concatenate([(fixed.queries[g] @ fixed.keys[g].T).ravel() for g in range(3)])
    after = qkm.distance_dot_correlation(fixed.queries, fixed.keys)
    assert after == pytest.approx(pearsonr(distance, dots).statistic, abs=1e-12)
    # distance says nothing before, tracks the dot product after (AttentionViz's point)
    assert after < -0.8 and qkm.distance_dot_correlation(q, k) > -0.2


def _planted(kind: str, gh: int = 4, gw: int = 16, images: int = 1, d: int = 16, seed: int = 0):
    """Queries and keys (images, N, d) of a head that reads only position or only content, with noise.

    Positional: q and k are one random linear map of Fourier features of the patch's column (weight 3) and row
    (weight 1) (periods of twice and four times the grid), so q_i · k_j peaks at the same and neighbouring patches,
    the same in every image, and the column is the main direction. Content: the same map of random features per
    token and image that ignore the token's place."""
    rng = np.random.default_rng(seed)
    rows, cols = np.repeat(np.arange(gh), gw), np.tile(np.arange(gw), gh)
    if kind == "position":
        angles = [np.pi * rows / gh, np.pi * cols / gw, np.pi * rows / (2 * gh), np.pi * cols / (2 * gw)]
        weights = [1.0, 3.0, 1.0, 3.0]
        features = np.stack([w * f(a) for a, w in zip(angles, weights) for f in (np.cos, np.sin)], 1)
        features = np.broadcast_to(features, (images, gh * gw, 8))
    else:
        features = rng.normal(size=(images, gh * gw, 8))
    w = rng.normal(size=(8, d))
    q = features @ w + 0.05 * rng.normal(size=(images, gh * gw, d))
    k = features @ w + 0.05 * rng.normal(size=(images, gh * gw, d))
    return qkm.HeadQK(q, k, np.arange(images), 0, 0), rows, cols


def _order_by_position(picture: qkm.HeadPicture, cols) -> float:
    """|Spearman| between the patch column of every point and its coordinate along the picture's axis that orders
    them best (t-SNE and UMAP pictures come turned at any angle; 1-degree steps over half a turn)."""
    column = cols[picture.token % len(cols)]
    angles = np.deg2rad(np.arange(180))
    along = picture.xy @ np.stack([np.cos(angles), np.sin(angles)])  # (points, 180)
    return max(abs(spearmanr(along[:, i], column).statistic) for i in range(len(angles)))


@pytest.mark.parametrize("projection", ["pca", "tsne", pytest.param("umap", marks=pytest.mark.slow)])
def test_a_planted_positional_head_orders_by_patch_position_and_a_content_head_does_not(projection):
    # One image of 4 x 16 patches. (With two images UMAP's 10 neighbours stay inside the copies of one patch and
    # its clusters fall in any order: 0.66 measured; PCA and t-SNE keep >= 0.99.)
    positional, rows, cols = _planted("position")
    content, _, _ = _planted("content")
    picture = qkm.head_picture(positional, projection, seed=0)
    assert _order_by_position(picture, cols) >= 0.9
    assert _order_by_position(qkm.head_picture(content, projection, seed=0), cols) < 0.5
    assert picture.xy.shape == (2 * 64, 2)
    assert list(picture.kind[:64]) == ["query"] * 64 and list(picture.kind[64:]) == ["key"] * 64


def test_pca_signs_are_fixed_and_equal_sklearn_up_to_sign():
    from sklearn.decomposition import PCA

    points = np.random.default_rng(2).normal(size=(50, 6)) * np.arange(1, 7)
    ours = qkm.project(points, "pca")
    theirs = PCA(2).fit_transform(points)
    for i in range(2):
        assert np.allclose(ours[:, i], theirs[:, i], atol=1e-9) or np.allclose(ours[:, i], -theirs[:, i], atol=1e-9)
    assert np.array_equal(qkm.project(-points[:, ::1] * 1.0 + 0.0, "pca").shape, (50, 2))


def test_the_colour_wheel_tells_every_patch_apart_and_greys_prefix_tokens():
    layout = TokenLayout(("cls", "reg0"), (6, 5), (16, 16), "token", 1)
    colours = qkm.position_colours(layout).astype(int)
    assert colours.shape == (32, 3) and (colours[:2] == 128).all()
    patches = colours[2:]
    assert len({tuple(c) for c in patches}) == 30
    rows, cols = qkm.token_positions(layout)
    assert list(rows[:3]) == [-1, -1, 0] and list(cols[2:8]) == [0, 1, 2, 3, 4, 0]
    # neighbours are closer in colour than opposite corners
    near = np.abs(patches[0] - patches[1]).sum()
    far = np.abs(patches[0] - patches[-1]).sum()
    assert near < far

