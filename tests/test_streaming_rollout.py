"""Rollout as a row-vector chain equals the matrix products; `analyze` streams, is interruptible and atomic."""
import itertools

import numpy as np
import pytest
import torch

from vitviz.capture import capture
from vitviz.images import preprocess
from vitviz.layout import TokenLayout
from vitviz.rollout import gradient_rollout, gradient_rollout_reference, rollout, rollout_reference
from vitviz.tokens import artifact_tokens, attention_sinks


def random_attention(rng, L, H, N, sharp=3.0):
    logits = rng.normal(scale=sharp, size=(L, H, N, N))
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def layout_for(prefix, grid):
    return TokenLayout(prefix_tokens=prefix, grid_size=grid, patch_size=(16, 16), global_pool="token",
                       pos_embed_prefix_rows=len(prefix))


def assert_same_rollout(chain, matrix):
    np.testing.assert_allclose(chain.per_layer, matrix.per_layer, rtol=0, atol=1e-10)
    np.testing.assert_allclose(chain.map, matrix.map, rtol=0, atol=1e-10)
    assert chain.prefix_share.keys() == matrix.prefix_share.keys()
    for name in chain.prefix_share:
        assert abs(chain.prefix_share[name] - matrix.prefix_share[name]) < 1e-10
    assert chain.layers == matrix.layers and chain.readout == matrix.readout


@pytest.mark.parametrize("prefix, grid, L", [(("cls",), (3, 4), 5), ((), (4, 4), 3), (("cls", "dist"), (5, 3), 4),
                                             (("cls", "reg0", "reg1", "reg2", "reg3"), (6, 6), 6)])
def test_rollout_chain_equals_matrix_products_on_random_attention(prefix, grid, L):
    rng = np.random.default_rng(len(prefix) * 10 + L)
    layout = layout_for(prefix, grid)
    attention = random_attention(rng, L, 3, layout.num_tokens)
    excluded = [(), (layout.num_prefix_tokens + 2,), tuple(range(layout.num_prefix_tokens, layout.num_prefix_tokens + 3))]
    for fusion, discard, (start, end), exclude in itertools.product(
            ("mean", "max", "min"), (0.0, 0.3, 0.9), [(0, None), (1, L), (0, 1), (L - 2, L - 1)], excluded):
        kwargs = dict(fusion=fusion, discard=discard, start=start, end=end, exclude_tokens=exclude)
        assert_same_rollout(rollout(attention, layout, **kwargs), rollout_reference(attention, layout, **kwargs))


def test_rollout_chain_equals_matrix_products_on_the_bundled_model(bundled, sample_images):
    batch = preprocess([sample_images[0].image], bundled.data_config)
    out = capture(bundled.model, batch.tensor)
    attention, layout = out.attention[0].numpy(), out.layout
    sinks = attention_sinks(attention, layout).patch_sinks(layout) + layout.num_prefix_tokens
    artifacts = artifact_tokens(out.token_norms[0, -1].numpy(), layout)
    assert len(sinks)  # this model has sinks, so the exclusion below changes the result
    for fusion, discard, (start, end), exclude in itertools.product(
            ("mean", "max", "min"), (0.0, 0.5, 0.9), [(0, None), (2, 12), (5, 6), (0, 11)],
            [(), tuple(sinks), tuple(artifacts)]):
        kwargs = dict(fusion=fusion, discard=discard, start=start, end=end, exclude_tokens=exclude)
        assert_same_rollout(rollout(attention, layout, **kwargs), rollout_reference(attention, layout, **kwargs))


@pytest.mark.parametrize("prefix", [("cls",), (), ("cls", "reg0")])
def test_gradient_rollout_chain_equals_matrix_products(prefix):
    rng = np.random.default_rng(7)
    layout = layout_for(prefix, (4, 5))
    attention = random_attention(rng, 4, 3, layout.num_tokens)
    gradients = rng.normal(size=attention.shape).astype(np.float32)
    chain = gradient_rollout(attention, gradients, layout)
    np.testing.assert_allclose(chain, gradient_rollout_reference(attention, gradients, layout), rtol=0, atol=1e-10)
    assert chain.shape == (4, 5) and chain.max() > 0.01  # a real signal, not zeros on both sides


def test_rollout_chain_hand_example_cumulative_maps():
    # Two layers, one patch grid of 2 tokens + CLS; A1 sends CLS to patch 0, A2 sends CLS to patch 1.
    layout = layout_for(("cls",), (1, 2))
    a1 = np.array([[0, 1, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    a2 = np.array([[0, 0, 1], [0, 1, 0], [0, 0, 1]], np.float32)
    attention = np.stack([a1, a2])[:, None]
    r = rollout(attention, layout)
    # After layer 1: CLS row of 0.5 A1 + 0.5 I = [0.5, 0.5, 0].
    np.testing.assert_allclose(r.per_layer[0], [[0.5, 0.0]])
    # After layer 2: [0.5, 0, 0.5] @ A1' = 0.25 CLS + 0.25 patch 0 + 0.5 patch 1.
    np.testing.assert_allclose(r.per_layer[1], [[0.25, 0.5]])
    assert r.prefix_share == {"cls": pytest.approx(0.25)}
