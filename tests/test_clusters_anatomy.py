"""Token clusters and the anatomy of an attention row: known answers, the model's own numbers, both pages."""
import json

import numpy as np
import pytest
import timm
import torch

from conftest import ASSETS, FAMILIES, TINY, tiny_model
from vitviz.analyses.anatomy import attention_anatomy, block_output, layer_qkv, softmax
from vitviz.trace import trace_for_analysis as capture
from vitviz.analyses.clusters import cluster_overlay, order_by_size, token_clusters


def _planted(sizes=(40, 25, 15), dim=8, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), dim)) * 10
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(sizes)])
    order = rng.permutation(len(labels))  # groups scattered over the grid, not in blocks
    labels = labels[order]
    return centres[labels] + rng.normal(size=(len(labels), dim)) * 0.1, labels


def test_kmeans_recovers_planted_groups_numbered_by_size():
    points, planted = _planted()
    result = token_clusters(points, (8, 10), 3)
    # Label 0 is the largest planted group (40), 1 the next (25), 2 the smallest (15): exact, not up to permutation.
    np.testing.assert_array_equal(result.labels.ravel(), planted)
    np.testing.assert_array_equal(result.sizes, [40, 25, 15])
    # The inertia is scikit-learn's (a sum of squared distances to the centroids: not a mean, not a root).
    from sklearn.cluster import KMeans

    assert result.inertia == pytest.approx(KMeans(n_clusters=3, n_init=10, random_state=0).fit(points).inertia_,
                                           rel=1e-9)


def test_order_by_size_breaks_ties_by_first_patch():
    np.testing.assert_array_equal(order_by_size(np.array([5, 5, 2, 9, 9, 9, 2])), [1, 1, 2, 0, 0, 0, 2])
    np.testing.assert_array_equal(order_by_size(np.array([3, 1, 1, 3])), [0, 1, 1, 0])


def test_kmeans_reruns_give_identical_labels():
    rng = np.random.default_rng(3)
    points = rng.normal(size=(256, 32))  # no structure: the init matters, the seed must fix it
    first = token_clusters(points, (16, 16), 7)
    np.testing.assert_array_equal(first.labels, token_clusters(points, (16, 16), 7).labels)


def test_cluster_k_outside_two_to_twelve_is_a_sentence():
    with pytest.raises(ValueError, match="between 2 and 12"):
        token_clusters(np.zeros((16, 4)), (4, 4), 13)


def test_cluster_overlay_colours_regions_and_draws_boundaries():
    from PIL import Image

    image = Image.new("RGB", (4, 2), (0, 0, 0))
    labels = np.array([[0, 1]])  # left half cluster 0, right half cluster 1
    out = np.asarray(cluster_overlay(image, labels, [(200, 0, 0), (0, 0, 200)], opacity=0.5))
    np.testing.assert_array_equal(out[0, 0], [100, 0, 0])
    np.testing.assert_array_equal(out[0, 3], [0, 0, 100])
    np.testing.assert_array_equal(out[:, 2], [[255, 255, 255]] * 2)  # the boundary column


def _tiny_cases():
    cases = [(f, None) for f in FAMILIES]
    # A q/k-norm family (the anatomy shows the norm as a step): not in the capture list's pretrained set.
    return cases + [("qk_norm", ("vit_small_patch16_224", {"qk_norm": True}))]


def _model(family, spec):
    if spec is None:
        return tiny_model(family)
    torch.manual_seed(0)
    model = timm.create_model(spec[0], pretrained=False, **(TINY | spec[1]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("family,spec", _tiny_cases(), ids=[c[0] for c in _tiny_cases()])
def test_anatomy_softmax_and_weighted_values_match_the_model(family, spec):
    model = _model(family, spec)
    torch.manual_seed(1)
    images = torch.randn(1, 3, *model.patch_embed.img_size)
    out = capture(model, images)
    layer, head = len(model.blocks) - 1, 1
    query = out.layout.num_tokens - 3  # a patch query
    qkv = layer_qkv(model, images, layer)
    if family == "qk_norm":
        assert any("normalised per head" in s for s in qkv.steps)
    # The attention block's own output before the projection, through timm's fused forward.
    seen = {}
    hook = model.blocks[layer].attn.proj.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach()))
    try:
        with torch.no_grad():
            model.forward_features(images)
    finally:
        hook.remove()
    d = qkv.head_dim
    for q in (query, 0):
        a = attention_anatomy(qkv, head, q)
        np.testing.assert_allclose(softmax(a.scaled), out.stack("attn")[0, layer, head, q].numpy(), atol=1e-6)
        np.testing.assert_allclose(a.scaled, a.scores * a.scale)
        assert a.scale == pytest.approx(d ** -0.5)
        np.testing.assert_allclose(a.contributions.sum(0), seen["x"][0, q, head * d:(head + 1) * d].numpy(),
                                   atol=1e-5)


def test_anatomy_without_scaling_is_sharper_on_a_known_row():
    from vitviz.analyses.anatomy import LayerQKV

    # One head, d = 4, three tokens: scores q·k = 0, 4, 8; the scale 1/2 halves them.
    q = np.zeros((1, 3, 4))
    q[0, 0] = [2, 0, 0, 0]
    k = np.zeros((1, 3, 4))
    k[0, :, 0] = [0, 2, 4]
    v = np.eye(3, 4)[None]
    a = attention_anatomy(LayerQKV(q=q, k=k, v=v, scale=0.5, steps=[]), head=0, query=0)
    np.testing.assert_allclose(a.scores, [0, 4, 8])
    np.testing.assert_allclose(a.weights, np.exp([0, 2, 4]) / np.exp([0, 2, 4]).sum())
    np.testing.assert_allclose(a.unscaled_weights, np.exp([0, 4, 8]) / np.exp([0, 4, 8]).sum())
    assert a.entropy(a.unscaled_weights) < a.entropy(a.weights)
    np.testing.assert_allclose(a.output, a.weights @ v[0])
    assert list(a.top_contributors(2)) == [2, 1]


def test_block_output_of_last_layer_is_what_capture_normalises():
    model = tiny_model("deit3")
    images = torch.randn(1, 3, 64, 64)
    out = capture(model, images)
    tokens = block_output(model, images, len(model.blocks) - 1)
    with torch.inference_mode():
        final = model.norm(tokens)
    np.testing.assert_allclose(final.numpy(), out["final_norm"].numpy(), atol=1e-5)
    np.testing.assert_allclose(tokens.norm(dim=-1).numpy(), out.stack("resid_post.norm")[:, -1].numpy(), rtol=1e-5)


@pytest.mark.slow
def test_cli_clusters_match_sklearn_and_rerun_identically(tmp_path, bundled):
    from sklearn.cluster import KMeans

    from vitviz.cli import main

    image = str(ASSETS / "chelsea.jpg")
    runs = {"a": ["--clusters", "5"], "layer": ["--clusters", "4", "--cluster-layer", "6"]}
    for name, extra in runs.items():
        assert main(["analyze", image, "--out", str(tmp_path / name), *extra]) == 0
    data = np.load(tmp_path / "a" / "analysis.npz")
    labels = data["clusters"]
    assert labels.shape == (1, 16, 16) and labels.dtype.kind == "i"
    sizes = np.bincount(labels.ravel())
    assert len(sizes) == 5 and (np.diff(sizes) <= 0).all()

    patches = data["features"][0, 1:].astype(np.float64)
    flat = labels[0].ravel()
    ours = sum(((patches[flat == c] - patches[flat == c].mean(0)) ** 2).sum() for c in range(5))  # numpy, by hand
    reference = KMeans(n_clusters=5, n_init=10, random_state=1).fit(patches).inertia_
    # Both ways: a local optimum near scikit-learn's best of 10 (another seed), neither worse nor
    # impossibly better (an inertia on the wrong scale, e.g. a mean, is far below).
    assert abs(ours / reference - 1) <= 0.01, (ours, reference)
    info = json.loads((tmp_path / "a" / "settings.json").read_text())["analysis"]["clusters"]
    assert info["k"] == 5 and info["layer (1-based)"] == "final features"
    assert info["inertia_per_image"][0] == pytest.approx(ours)
    # A rerun on the same features gives the same labels (the app clusters these features the same way).
    np.testing.assert_array_equal(token_clusters(patches, (16, 16), 5).labels, labels[0])

    # --cluster-layer 6: the output of block 6 (index 5), not the final features.
    layer = np.load(tmp_path / "layer" / "analysis.npz")["clusters"][0]
    tokens = block_output(bundled.model, torch.from_numpy(data["input"]), 5)[0, 1:].float().numpy()
    np.testing.assert_array_equal(layer, token_clusters(tokens, (16, 16), 4).labels)
    assert json.loads((tmp_path / "layer" / "settings.json").read_text())["analysis"]["clusters"]["layer (1-based)"] == 6


def test_cli_cluster_layer_without_clusters_is_a_sentence(tmp_path, capsys):
    from vitviz.cli import main

    image = str(ASSETS / "chelsea.jpg")
    assert main(["analyze", image, "--out", str(tmp_path), "--cluster-layer", "3"]) == 2
    assert "--cluster-layer needs --clusters K" in capsys.readouterr().err


@pytest.mark.slow
def test_overview_clusters_view_shows_the_core_labels(bundled):
    from test_app import _heatmaps, _page, _traces
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    at = _page(None)
    z = _heatmaps(at, "clusters")[0]
    batch = preprocess([load_image(ASSETS / "astronaut.jpg").image], bundled.data_config)
    features = capture(bundled.model, batch.tensor)["final_norm"][0, 1:].numpy()
    np.testing.assert_array_equal(z - 1, token_clusters(features, (16, 16), 4).labels)
    at.slider(key="cluster_k").set_value(6).run()
    at.selectbox(key="cluster_source").set_value("keys of one head").run()
    assert not at.exception
    legend = [t["name"] for t in _traces(at, "clusters") if t["type"] == "scatter"]
    assert len(legend) == 6 and legend[0].startswith("1: ")
    assert len(np.unique(_heatmaps(at, "clusters")[0])) == 6


@pytest.mark.slow
def test_anatomy_page_row_equals_the_heads_page_map(bundled):
    from test_app import _core_attention, _heatmaps, _page
    from vitviz.analyses.maps import query_attention_map

    heads = _page("pages/2_heads.py")
    heads.slider(key="heads_layer").set_value(3).run()
    heads_map = _heatmaps(heads, "heads_grid")[1]  # layer 3, head 2, CLS query

    at = _page("pages/7_anatomy.py")
    at.slider(key="anatomy_layer").set_value(3).run()
    at.selectbox(key="anatomy_head").set_value(2).run()
    assert not at.exception
    row = _heatmaps(at, "anatomy_row")[0]
    np.testing.assert_allclose(row, heads_map, atol=1e-6)
    attention, layout = _core_attention(bundled, "astronaut.jpg")
    np.testing.assert_allclose(row, query_attention_map(attention, layout, 2, 1, "cls"), atol=1e-6)

    at.session_state["patch"] = 40
    at.radio(key="anatomy_query").set_value("clicked patch").run()
    assert not at.exception
    np.testing.assert_allclose(_heatmaps(at, "anatomy_row")[0], query_attention_map(attention, layout, 2, 1, 40),
                               atol=1e-6)
    # The score map shows q·k of the clicked patch's query with every patch key, from the model's own q and k.
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    batch = preprocess([load_image(ASSETS / "astronaut.jpg").image], bundled.data_config)
    a = attention_anatomy(layer_qkv(bundled.model, batch.tensor, 2), head=1, query=layout.num_prefix_tokens + 40)
    np.testing.assert_allclose(_heatmaps(at, "anatomy_scores")[0], layout.to_grid(a.scores[layout.patch_slice]),
                               rtol=1e-5, atol=1e-4)


def test_anatomy_right_axes_draw_their_own_round_ticks_not_fractions_of_the_left_axis():
    """plotly.js syncs an overlaying axis's ticks to the left axis by default: fractions of its range, so the tick
    meant as 0 read 2.2e-17 on the contributions chart (its ".2g" format showed the float). Each right axis asks for
    its own ticks, formatted by plotly (which rounds to the tick spacing)."""
    from vitviz.analyses.anatomy import LayerQKV
    from vitviz.figures.explain_figures import contributions_figure, sorted_scores_figure
    from vitviz.layout import TokenLayout

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 5, 4)) for _ in range(3))
    a = attention_anatomy(LayerQKV(q=q, k=k, v=v, scale=0.5, steps=[]), head=0, query=0)
    layout = TokenLayout(("cls",), (2, 2), (16, 16), "token", 1)
    for fig in (sorted_scores_figure(a, layout), contributions_figure(a, layout)):
        right = fig.layout.yaxis2
        assert right.overlaying == "y" and right.tickmode == "auto" and right.tickformat is None


def test_the_anatomy_pages_numbers_on_a_row_worked_by_hand():
    """One head, three tokens (CLS + a 1 x 2 grid), d = 2: every number the Attention anatomy page prints, from the
    definitions (the weights are chosen so the softmax is [1/2, 1/4, 1/4])."""
    from vitviz.analyses.anatomy import LayerQKV, span
    from vitviz.layout import TokenLayout

    layout = TokenLayout(prefix_tokens=("cls",), grid_size=(1, 2), patch_size=(16, 16), global_pool="token",
                         pos_embed_prefix_rows=1)
    q = np.zeros((1, 3, 2))
    q[0, 0] = [np.log(2) * 2, 0.0]  # with keys (1, 0), (0, 1), (0, 1) and scale 1/2: scaled scores ln 2, 0, 0
    k = np.array([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    v = np.array([[[4.0, 0.0], [0.0, 3.0], [0.0, -1.0]]])
    a = attention_anatomy(LayerQKV(q=q, k=k, v=v, scale=0.5, steps=[], bias=None), head=0, query=0)
    # Tolerances: the softmax's exp may round differently by an ulp or two on another CPU's libm; 1e-14 is ~45 ulps of
    # a number near 1, far below what a wrong formula gives (the weights' shares differ by 25 % and more).
    np.testing.assert_allclose(a.weights, [0.5, 0.25, 0.25], rtol=1e-14)
    np.testing.assert_allclose(a.scores_times_scale, [np.log(2), 0, 0], atol=1e-15)
    assert span(a.scores) == (0.0, 2 * np.log(2), 2 * np.log(2))
    # output = 0.5 (4, 0) + 0.25 (0, 3) + 0.25 (0, -1) = (2, 0.5); ‖output‖² = 4.25
    np.testing.assert_allclose(a.output, [2.0, 0.5], rtol=1e-14)
    assert a.output_norm == pytest.approx(np.sqrt(4.25), rel=1e-14)
    np.testing.assert_allclose(a.output_shares, [4 / 4.25, 0.375 / 4.25, -0.125 / 4.25], rtol=1e-14)
    np.testing.assert_allclose(a.contribution_norms, [2.0, 0.75, 0.25], rtol=1e-14)
    np.testing.assert_allclose(a.value_norms, [4.0, 3.0, 1.0], rtol=1e-14)
    assert a.q_norm == pytest.approx(2 * np.log(2), rel=1e-14)
    entropy = -(0.5 * np.log(0.5) + 2 * 0.25 * np.log(0.25))  # = 1.5 ln 2
    assert a.tokens_worth(a.weights) == pytest.approx(np.exp(entropy), rel=1e-14)  # 2^1.5 tokens' worth
    assert a.uniform_entropy == pytest.approx(np.log(3), rel=1e-14)
    np.testing.assert_array_equal(a.patch_row(layout), np.array([[[0.25, 0.25]]], np.float32))
    assert a.held_by(layout.patch_slice) == pytest.approx((0.5, 0.25 / 4.25), rel=1e-14)
    assert a.held_by([0, 2]) == pytest.approx((0.75, 3.875 / 4.25), rel=1e-14)
    assert a.held_by(slice(None)) == pytest.approx((1.0, 1.0), rel=1e-14)
    assert layout.centre_patch == 1  # a 1 x 2 grid: the right one of the two middle patches


def test_patch_grid_leaves_out_every_prefix_token_and_keeps_the_raster_order():
    from vitviz.layout import TokenLayout

    # a class token and two registers before a 2 x 3 grid: token 3 is patch 0 (row 0, col 0), token 8 patch 5
    layout = TokenLayout(prefix_tokens=("cls", "reg0", "reg1"), grid_size=(2, 3), patch_size=(16, 16),
                         global_pool="token", pos_embed_prefix_rows=1)
    values = np.array([100., 101., 102., 0., 1., 2., 10., 11., 12.])
    np.testing.assert_array_equal(layout.patch_grid(values), [[0., 1., 2.], [10., 11., 12.]])
    stacked = layout.patch_grid(np.stack([values, -values]))  # leading axes kept: (2, 9) -> (2, 2, 3)
    np.testing.assert_array_equal(stacked[1], [[0., -1., -2.], [-10., -11., -12.]])
    with pytest.raises(ValueError, match="expected 9 token values, got 6"):
        layout.patch_grid(values[3:])  # patch values alone are to_grid's


def test_the_centre_patch_of_odd_and_even_grids():
    from vitviz.layout import TokenLayout

    def centre(gh, gw):
        return TokenLayout(prefix_tokens=("cls",), grid_size=(gh, gw), patch_size=(16, 16), global_pool="token",
                           pos_embed_prefix_rows=1).centre_patch
    assert centre(3, 5) == 1 * 5 + 2  # row 1, column 2: the middle
    assert centre(16, 16) == 8 * 16 + 8
    assert centre(2, 7) == 1 * 7 + 3
