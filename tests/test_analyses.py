"""The analyses against answers computed by hand or in float64."""
import numpy as np
import pytest
import torch

from conftest import tiny_model
from vitviz.trace import trace_for_analysis as capture
from vitviz.analyses.distance import (conv_receptive_field, layer_attention_distance, mean_attention_distance,
                             stream_mean_attention_distance)
from vitviz.analyses.filters import patch_filter_pca
from vitviz.layout import TokenLayout
from vitviz.analyses.posembed import position_embedding_similarity
from vitviz.analyses.rollout import (attention_gradients, discard_lowest, fuse_heads, gradient_rollout, rollout,
                            rollout_step)
from vitviz.analyses.tokens import artifact_tokens, feature_pca_rgb, top_classes


def _layout(grid, prefix=("cls",), patch=16):
    return TokenLayout(tuple(prefix), grid, (patch, patch), "token" if "cls" in prefix else "avg",
                       len(prefix))


# ---- rollout -------------------------------------------------------------------------------

def test_rollout_of_identity_attention_keeps_every_token_on_itself():
    layout = _layout((2, 2))
    eye = np.broadcast_to(np.eye(5), (3, 2, 5, 5))
    result = rollout(eye, layout)
    np.testing.assert_allclose(rollout_step(np.eye(5)), np.eye(5))
    np.testing.assert_allclose(result.map, 0)          # the CLS token keeps all its mass
    assert result.prefix_share == {"cls": pytest.approx(1.0)}
    no_cls = rollout(np.broadcast_to(np.eye(4), (3, 2, 4, 4)), _layout((2, 2), prefix=()))
    np.testing.assert_allclose(no_cls.map, 0.25)       # mean of patch rows of I: 1/4 on each patch


def test_rollout_two_layer_hand_example_in_order():
    layout = _layout((1, 1))
    a1 = np.array([[0.2, 0.8], [0.6, 0.4]])
    a2 = np.array([[0.5, 0.5], [0.1, 0.9]])
    result = rollout(np.stack([a1, a2])[:, None], layout)
    # A1' = [[.6,.4],[.3,.7]], A2' = [[.75,.25],[.05,.95]], R = A2' A1' -> CLS row [.525, .475]
    assert result.map[0, 0] == pytest.approx(0.475)
    assert result.prefix_share["cls"] == pytest.approx(0.525)
    np.testing.assert_allclose(result.per_layer[:, 0, 0], [0.4, 0.475])
    only_second = rollout(np.stack([a1, a2])[:, None], layout, start=1)
    assert only_second.map[0, 0] == pytest.approx(0.25)


def test_discard_spares_the_readout_column_and_rows_are_renormalised():
    a = np.array([[0.1, 0.3, 0.6], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]])
    kept = discard_lowest(a, 1 / 3, keep_column=0)
    np.testing.assert_allclose(kept, [[0.1, 0.3, 0.6], [0.2, 0.0, 0.6], [0.5, 0.4, 0.0]])
    step = rollout_step(kept)
    np.testing.assert_allclose(step.sum(axis=1), 1.0)
    np.testing.assert_allclose(step[1], [0.1 / 0.9, 0.5 / 0.9, 0.3 / 0.9])
    result = rollout(a[None, None], _layout((1, 2)), discard=1 / 3)
    np.testing.assert_allclose(result.map[0], [0.15, 0.3])


def test_rollout_rows_sum_to_one_after_discard_on_random_attention():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 3, 10, 10))
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    layout = _layout((3, 3))
    for discard in (0.0, 0.5, 0.9):
        result = rollout(attention, layout, discard=discard, fusion="max")
        total = result.map.sum() + sum(result.prefix_share.values())
        assert total == pytest.approx(1.0)


def test_head_fusion():
    heads = np.array([[[0.2, 0.8]], [[0.6, 0.4]]])  # (H=2, 1, 2)
    np.testing.assert_allclose(fuse_heads(heads, "mean"), [[0.4, 0.6]])
    np.testing.assert_allclose(fuse_heads(heads, "max"), [[0.6, 0.8]])
    np.testing.assert_allclose(fuse_heads(heads, "min"), [[0.2, 0.4]])


def test_excluded_tokens_carry_no_mass():
    layout = _layout((1, 3))
    attention = np.full((2, 1, 4, 4), 0.25)
    result = rollout(attention, layout, exclude_tokens=(3,))
    assert result.map[0, 2] == 0
    assert result.map.sum() + result.prefix_share["cls"] == pytest.approx(1.0)


# ---- gradient rollout ----------------------------------------------------------------------

def _logit_with_attention_delta(model, x, target, layer, head, q, k, eps):
    """An independent forward: timm modules, attention written out, one entry nudged by eps."""
    h = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    for i, blk in enumerate(model.blocks):
        attn, y = blk.attn, blk.norm1(h)
        B, N, C = y.shape
        qkv = attn.qkv(y).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        qq, kk, vv = qkv.unbind(0)
        a = ((qq * attn.scale) @ kk.transpose(-2, -1)).softmax(-1)
        if i == layer:
            a = a.clone()
            a[0, head, q, k] += eps
        out = attn.proj((a @ vv).transpose(1, 2).reshape(B, N, C))
        h = h + blk.ls1(out)
        h = h + blk.ls2(blk.mlp(blk.norm2(h)))
    return float(model.forward_head(model.norm(h))[0, target])


def test_attention_gradients_match_finite_differences_layer_by_layer():
    model = tiny_model("vit_augreg").double()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    attention, grads, target = attention_gradients(model, x, target=7)
    assert target == 7
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for layer in range(2):
            for _ in range(4):
                head, q, k = rng.integers(4), rng.integers(17), rng.integers(17)
                eps = 1e-6
                up = _logit_with_attention_delta(model, x, 7, layer, head, q, k, eps)
                down = _logit_with_attention_delta(model, x, 7, layer, head, q, k, -eps)
                assert grads[layer, head, q, k] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)
    assert np.allclose(attention, capture(model, x).stack("attn")[0].double().numpy())


def test_gradient_rollout_hand_example():
    layout = _layout((1, 1))
    a = np.array([[[[0.5, 0.5], [0.2, 0.8]]]])          # L=1, H=1
    g = np.array([[[[1.0, 2.0], [-1.0, 0.5]]]])
    # (g*a)+ = [[.5, 1.], [0, .4]]; R = I + that -> CLS row [1.5, 1.0]
    np.testing.assert_allclose(gradient_rollout(a, g, layout), [[1.0]])


def test_gradient_rollout_needs_a_head():
    with pytest.raises(ValueError, match="needs a classifier head"):
        attention_gradients(tiny_model("dino"), torch.randn(1, 3, 64, 64))


# ---- mean attention distance ---------------------------------------------------------------

def test_mean_distance_known_answers():
    layout = _layout((14, 14))
    N = layout.num_tokens
    uniform = np.full((1, 2, N, N), 1.0 / N)            # CLS column dropped, rows renormalised
    np.testing.assert_allclose(layer_attention_distance(uniform, layout), 116.5, atol=0.1)
    self_only = np.broadcast_to(np.eye(N), (1, 2, N, N))
    np.testing.assert_allclose(layer_attention_distance(self_only, layout), 0, atol=1e-12)
    # Every patch attending only to its right neighbour (or left, in the last column): one patch = 16 px.
    layout2 = _layout((2, 3), prefix=())
    a = np.zeros((1, 1, 6, 6))
    for p in range(6):
        a[0, 0, p, p + 1 if p % 3 < 2 else p - 1] = 1
    np.testing.assert_allclose(layer_attention_distance(a, layout2), 16.0)


def test_streamed_distance_over_32_images_equals_mean_of_single_images():
    model = tiny_model("dinov2_reg")
    images = torch.randn(32, 3, 70, 70, generator=torch.Generator().manual_seed(0))
    seen = []
    streamed = stream_mean_attention_distance(model, images.split(8), capture(model, images[:1]).layout,
                                              progress=seen.append)
    singles = np.concatenate([mean_attention_distance(capture(model, images[i:i + 1]).stack("attn").numpy(),
                                                      capture(model, images[:1]).layout) for i in range(32)])
    assert seen == [8, 16, 24, 32]
    assert streamed.per_image.shape == (32, 2, 4)
    np.testing.assert_allclose(streamed.per_image, singles, rtol=1e-5)
    np.testing.assert_allclose(streamed.mean, singles.mean(axis=0), rtol=1e-5)
    assert "renormalised" in streamed.convention


def test_conv_receptive_field():
    np.testing.assert_array_equal(conv_receptive_field(4), [3, 5, 7, 9])


# ---- filters and position embeddings -------------------------------------------------------

def test_filter_pca_recovers_known_orthogonal_patterns_in_order():
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.normal(size=(3 * 4 * 4, 3)))
    patterns = basis.T.reshape(3, 3, 4, 4)
    coeffs = rng.normal(size=(200, 3)) * [9.0, 4.0, 1.0]
    filters = np.einsum("dk,kcpq->dcpq", coeffs - coeffs.mean(0), patterns)
    pca = patch_filter_pca(filters, n_components=3)
    for i in range(3):
        cos = abs((pca.components[i] * patterns[i]).sum())
        assert cos > 0.999, i
    assert list(pca.explained_variance_ratio) == sorted(pca.explained_variance_ratio, reverse=True)
    assert pca.explained_variance_ratio.sum() == pytest.approx(1.0)
    assert pca.tiles.shape == (3, 4, 4, 3) and pca.tiles.min() == 0 and pca.tiles.max() == 1


def test_cosine_grid_of_orthonormal_embeddings_is_identity():
    sim = position_embedding_similarity(np.eye(6, 10) * 3.0, (2, 3))
    np.testing.assert_allclose(sim.reshape(6, 6), np.eye(6), atol=1e-12)
    assert sim[1, 2, 1, 2] == pytest.approx(1.0) and sim[0, 0, 1, 2] == pytest.approx(0.0)


# ---- token diagnostics ---------------------------------------------------------------------

def test_artifact_tokens_are_the_ten_times_median_outliers():
    layout = _layout((2, 3))
    norms = np.array([500.0, 1, 1.2, 0.9, 15, 1.1, 9])  # CLS is large but not a patch
    np.testing.assert_array_equal(artifact_tokens(norms, layout), [4])


def test_feature_pca_separates_two_clusters():
    layout = _layout((2, 2))
    feats = np.zeros((5, 8))
    feats[[1, 2], 0] = 5.0
    feats[1:] += np.random.default_rng(0).normal(scale=0.01, size=(4, 8))
    rgb = feature_pca_rgb(feats, layout)
    assert rgb.shape == (2, 2, 3) and rgb.min() >= 0 and rgb.max() <= 1
    first = rgb[..., 0].ravel()
    assert abs(first[0] - first[1]) < 0.1 and abs(first[2] - first[3]) < 0.1 and abs(first[0] - first[2]) > 0.9


def test_top_classes_have_imagenet_labels():
    logits = np.zeros(1000)
    logits[281], logits[285] = 5.0, 4.0
    top = top_classes(logits, k=2)
    assert [t[0] for t in top] == [281, 285]
    assert "tabby" in top[0][1]
    assert top[0][2] == pytest.approx(np.exp(5) / (np.exp(5) + np.exp(4) + 998))


# ---- raw attention views -------------------------------------------------------------------

def test_query_and_key_maps_read_rows_and_columns():
    from vitviz.analyses.maps import key_attention_map, query_attention_map

    layout = _layout((2, 2))
    a = np.zeros((1, 1, 5, 5))
    a[0, 0, 0] = [0.2, 0.1, 0.2, 0.3, 0.2]      # CLS row
    a[0, 0, 1:, 3] = [0.5, 0.25, 0.125, 1.0]    # every patch query's weight on key patch 2
    np.testing.assert_allclose(query_attention_map(a, layout, 0, 0, "cls"), [[0.1, 0.2], [0.3, 0.2]])
    np.testing.assert_allclose(key_attention_map(a, layout, 0, 0, key=2), [[0.5, 0.25], [0.125, 1.0]])
    np.testing.assert_allclose(query_attention_map(a, layout, 0, 0, 0), [[0, 0], [0.5, 0]])


def test_threshold_mask_keeps_the_smallest_set_holding_the_share():
    from vitviz.analyses.maps import threshold_mask

    grid = np.array([[0.5, 0.1], [0.3, 0.1]])
    np.testing.assert_array_equal(threshold_mask(grid, 0.5), [[True, False], [False, False]])
    np.testing.assert_array_equal(threshold_mask(grid, 0.6), [[True, False], [True, False]])
    np.testing.assert_array_equal(threshold_mask(grid, 0.8), [[True, False], [True, False]])
    assert threshold_mask(grid, 0.81).sum() == 3


def test_entropy_and_cls_focus_known_answers():
    from vitviz.analyses.maps import cls_focus, head_entropy

    layout = _layout((2, 2))
    uniform = np.full((1, 1, 5, 5), 0.2)
    one_hot = np.zeros((1, 1, 5, 5))
    one_hot[..., 1] = 1.0
    assert head_entropy(uniform, layout)[0, 0] == pytest.approx(np.log(4))
    assert head_entropy(one_hot, layout)[0, 0] == pytest.approx(0)
    assert cls_focus(uniform, layout)[0, 0] == pytest.approx(0)
    assert cls_focus(one_hot, layout)[0, 0] == pytest.approx(1)
