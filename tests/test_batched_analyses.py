"""The batch's analyses in torch (vitviz.analyses.batched) against numpy float64 computed from the definitions.

The references below are written from the papers' definitions in numpy, float64 throughout, on the same float32
attention; the batched code sums in float32 and combines in float64, so each tolerance is the float32 rounding of
its sums (tests/tolerance.py, docs/STANDARDS.md).
"""
import numpy as np
import pytest
import torch

from conftest import entropy_float32_atol, tiny_model
from tolerance import EPS32, EPS64, summed
from vitviz.analyses.batched import (batch_artifacts, batch_rollout, batch_sinks, reduce_attention, rollouts)
from vitviz.analyses.rollout import rollout
from vitviz.analyses.tokens import artifact_tokens, attention_sinks
from vitviz.trace import trace_for_analysis


def layout_of(family: str):
    model = tiny_model(family)
    size = 70 if "dinov2" in family else 64
    return trace_for_analysis(model, torch.zeros(1, 3, size, size)).layout


def peaked_attention(layout, B=3, L=4, H=4, seed=0, sink=None) -> torch.Tensor:
    """(B, L, H, N, N) float32 softmax rows, far from uniform, with one patch every query attends to when ``sink``."""
    g = torch.Generator().manual_seed(seed)
    N = layout.num_tokens
    logits = 3 * torch.randn(B, L, H, N, N, generator=g, dtype=torch.float64)
    if sink is not None:
        logits[..., layout.num_prefix_tokens + sink] += 12
    return torch.softmax(logits, dim=-1).float()


# --- numpy float64 references, from the definitions ------------------------------------------------------------

def centres(layout) -> np.ndarray:
    gh, gw = layout.grid_size
    ph, pw = layout.patch_size
    return np.array([((r + 0.5) * ph, (c + 0.5) * pw) for r in range(gh) for c in range(gw)], dtype=np.float64)


def distance_np(a: np.ndarray, layout) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention distance, (B, L, H): prefix keys dropped and rows renormalised; and not renormalised."""
    c = centres(layout)
    d = np.linalg.norm(c[:, None] - c[None], axis=-1)
    patches = a[..., layout.patch_slice, layout.patch_slice].astype(np.float64)
    weighted = (patches * d).sum(-1)
    return (weighted / patches.sum(-1)).mean(-1), weighted.mean(-1)


def received_np(a: np.ndarray) -> np.ndarray:
    """(B, L, N): each token's mean share of a query's attention, over heads and all queries."""
    return a.astype(np.float64).mean(axis=(2, 3))


def entropy_np(rows: np.ndarray) -> np.ndarray:
    p = rows / rows.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0).sum(-1)


def rollout_np(a: np.ndarray, layout, exclude=(), start=0, end=None) -> np.ndarray:
    """Abnar & Zuidema's rollout by its definition, one image (L, H, N, N): (end - start, N) readout rows."""
    N, end = a.shape[-1], end or a.shape[0]
    R, rows = np.eye(N), []
    e = np.zeros(N)
    if layout.cls_index is not None:
        e[layout.cls_index] = 1
    else:
        e[layout.patch_slice] = 1 / layout.num_patches
    for layer in range(start, end):
        fused = a[layer].astype(np.float64).mean(0)
        fused[:, list(exclude)] = 0
        step = 0.5 * fused + 0.5 * np.eye(N)
        step /= step.sum(-1, keepdims=True)
        R = step @ R
        rows.append(e @ R)
    return np.stack(rows)


# --- the tests ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["deit_distilled", "dinov2_reg", "gap"])
@pytest.mark.parametrize("per_block", [None, 3])  # one image at a time (the CPU's way) and the whole batch (a GPU's)
def test_reductions_equal_the_float64_definitions(family, per_block):
    layout = layout_of(family)
    a = peaked_attention(layout, sink=2)
    B, L, H, N, _ = a.shape
    P = layout.num_patches
    r = reduce_attention(a, layout, fusion="mean", scores=True, images_per_block=per_block)
    renormalised, with_prefix = distance_np(a.numpy(), layout)
    # The distance-weighted mass and the mass of each query: float32 sums of P terms of one sign (summed(P) each);
    # their ratio adds both and one rounding; the float64 mean over queries keeps the relative bound.
    np.testing.assert_allclose(r.distance.numpy(), renormalised, rtol=2 * summed(P) + 2 * EPS32, atol=0)
    np.testing.assert_allclose(r.distance_with_prefix.numpy(), with_prefix, rtol=summed(P) + EPS32, atol=0)
    # Received: the head mean (H terms) then the sum over N queries, both in float32, one sign.
    np.testing.assert_allclose(r.received.numpy(), received_np(a.numpy()), rtol=summed(H) + summed(N) + 2 * EPS32)
    np.testing.assert_allclose(r.fused.numpy(), a.numpy().astype(np.float64).mean(2), rtol=summed(H) + EPS32)
    a64 = a.numpy().astype(np.float64)
    entropy = entropy_np(a64[..., layout.patch_slice, layout.patch_slice]).mean(-1)
    np.testing.assert_allclose(r.entropy.numpy(), entropy, rtol=0, atol=entropy_float32_atol(P))
    if layout.has_class_token:
        # The CLS row is read in float64: the only float32 rounding is the attention itself, exact in both.
        focus = 1 - entropy_np(a64[..., layout.cls_index, layout.patch_slice]) / np.log(P)
        np.testing.assert_allclose(r.cls_focus.numpy(), focus, rtol=0, atol=P * EPS64 * 4)
    else:
        assert np.isnan(r.cls_focus.numpy()).all()
    prefix = a64[..., layout.patch_slice, :layout.num_prefix_tokens].sum(-1).mean(-1)
    np.testing.assert_allclose(r.prefix_received.numpy(), prefix, rtol=P * EPS64, atol=0)
    assert all(t.device == a.device for t in (r.distance, r.received, r.fused, r.entropy))


def test_a_planted_bug_fails_the_distance_and_received_checks(monkeypatch):
    """The tolerances above are tight enough: the distance without renormalising, or the received share with the
    prefix queries left out, fails them."""
    layout = layout_of("deit_distilled")
    a = peaked_attention(layout)
    r = reduce_attention(a, layout)
    renormalised, with_prefix = distance_np(a.numpy(), layout)
    P = layout.num_patches
    assert not np.allclose(r.distance_with_prefix.numpy(), renormalised, rtol=2 * summed(P) + 2 * EPS32, atol=0)
    wrong = a[..., layout.patch_slice, :].double().mean(dim=(2, 3)).numpy()
    assert not np.allclose(r.received.numpy(), wrong, rtol=summed(4) + summed(layout.num_tokens) + 2 * EPS32)


@pytest.mark.parametrize("family", ["deit_distilled", "gap"])
def test_batch_rollout_equals_the_definition_with_each_images_exclusions(family):
    layout = layout_of(family)
    a = peaked_attention(layout, B=3, L=5)
    B, L, H, N, _ = a.shape
    p0 = layout.num_prefix_tokens
    excluded = [(), (p0 + 1, p0 + 5), (p0 + 2,)]
    r = reduce_attention(a, layout, fusion="mean")
    rows = batch_rollout(r.fused, layout, start=1, end=5, exclude_tokens=excluded)
    assert rows.shape == (B, 4, N) and rows.dtype == torch.float64
    # The fused heads carry the float32 rounding of a mean of H terms (relative summed(H)); each layer's step is
    # row-stochastic, so an entry's error reaches the readout row at most twice (the weight and its row's
    # renormalisation) per layer: absolute 2 L summed(H) on rows that sum to at most 1.
    atol = 2 * L * summed(H)
    for i in range(B):
        np.testing.assert_allclose(rows[i].numpy(), rollout_np(a[i].numpy(), layout, excluded[i], 1, 5),
                                   rtol=0, atol=atol)
    # Planted: the exclusions of image 1 applied to image 2 fail it.
    assert not np.allclose(rows[2].numpy(), rollout_np(a[2].numpy(), layout, excluded[1], 1, 5), rtol=0, atol=atol)
    # As the per-image function returns it (grid maps, the cumulative steps, the prefix shares).
    for mine, i in zip(rollouts(rows, layout, start=1), range(B)):
        theirs = rollout(a[i], layout, start=1, end=5, exclude_tokens=excluded[i])
        np.testing.assert_allclose(mine.per_layer, theirs.per_layer, rtol=0, atol=L * N * EPS64)
        assert mine.layers == theirs.layers and mine.readout == theirs.readout
        assert mine.prefix_share.keys() == theirs.prefix_share.keys()


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_batch_rollout_with_discard_and_fusion_equals_the_per_image_rollout(fusion):
    """Discard picks the lowest weights of the fused matrix: the same float32 matrix as the per-image function,
    so the comparison is with it (the float64 chains, another product order: L N EPS64)."""
    layout = layout_of("deit_distilled")
    a = peaked_attention(layout, B=2, L=3, seed=4)
    N = layout.num_tokens
    r = reduce_attention(a, layout, fusion=fusion)
    rows = batch_rollout(r.fused, layout, discard=0.3)
    for mine, i in zip(rollouts(rows, layout), range(2)):
        theirs = rollout(a[i], layout, fusion=fusion, discard=0.3)
        np.testing.assert_allclose(mine.per_layer, theirs.per_layer, rtol=0, atol=3 * N * EPS64)
        assert not np.allclose(mine.per_layer, rollout(a[i], layout, fusion=fusion).per_layer, rtol=0,
                               atol=3 * N * EPS64)  # the discard did something


def test_sinks_and_artifacts_of_the_batch_equal_the_per_image_ones():
    layout = layout_of("deit_distilled")
    a = peaked_attention(layout, B=3, L=3, sink=3)
    sinks = batch_sinks(reduce_attention(a, layout, fusion="mean").received, layout)
    for mine, image in zip(sinks, a):
        theirs = attention_sinks(image, layout)
        assert [s.tolist() for s in mine.sinks] == [s.tolist() for s in theirs.sinks]
        assert any(layout.num_prefix_tokens + 3 in s for s in mine.sinks)  # the planted sink is found
    norms = torch.rand(3, 3, layout.num_tokens, generator=torch.Generator().manual_seed(0)) + 0.5
    norms[1, -1, layout.num_prefix_tokens + 4] = 100
    found = batch_artifacts(norms, layout)
    assert [f.tolist() for f in found] == [artifact_tokens(n[-1].numpy(), layout).tolist() for n in norms]
    assert found[1].tolist() == [layout.num_prefix_tokens + 4]


def test_bfloat16_attention_is_summed_in_float32():
    layout = layout_of("deit_distilled")
    a = peaked_attention(layout).bfloat16()
    r = reduce_attention(a, layout, fusion="mean")
    renormalised, _ = distance_np(a.float().numpy(), layout)
    P = layout.num_patches
    np.testing.assert_allclose(r.distance.numpy(), renormalised, rtol=2 * summed(P) + 2 * EPS32, atol=0)
    assert r.fused.dtype == torch.bfloat16


@pytest.mark.slow
def test_the_bundled_models_batch_equals_the_definitions(bundled, sample_images):
    from vitviz.sources.preprocess import preprocess

    layout = bundled.layout
    trace = trace_for_analysis(bundled.model, preprocess([im.image for im in sample_images[:2]], bundled.data_config))
    a = trace.stack("attn")
    B, L, H, N, _ = a.shape
    r = reduce_attention(a, layout, fusion="mean")
    renormalised, with_prefix = distance_np(a.numpy(), layout)
    P = layout.num_patches
    np.testing.assert_allclose(r.distance.numpy(), renormalised, rtol=2 * summed(P) + 2 * EPS32, atol=0)
    np.testing.assert_allclose(r.distance_with_prefix.numpy(), with_prefix, rtol=summed(P) + EPS32, atol=0)
    sinks = batch_sinks(r.received, layout)
    p0 = layout.num_prefix_tokens
    rows = batch_rollout(r.fused, layout, exclude_tokens=[tuple(s.patch_sinks(layout) + p0) for s in sinks])
    for i in range(B):
        assert [s.tolist() for s in sinks[i].sinks] == [s.tolist() for s in attention_sinks(a[i], layout).sinks]
        excluded = tuple(sinks[i].patch_sinks(layout) + p0)
        assert excluded  # this model has sinks: the exclusion is exercised
        np.testing.assert_allclose(rows[i].numpy(), rollout_np(a[i].numpy(), layout, excluded),
                                   rtol=0, atol=2 * L * summed(H))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_batch_stays_there_and_equals_the_cpu(dtype):
    layout = layout_of("deit_distilled")
    a = peaked_attention(layout, B=8, L=4, sink=2).to(dtype)
    B, L, H, N, _ = a.shape
    P = layout.num_patches
    on_cpu = reduce_attention(a, layout, fusion="mean", scores=True)
    on_gpu = reduce_attention(a.cuda(), layout, fusion="mean", scores=True)
    assert all(t.is_cuda for t in (on_gpu.distance, on_gpu.received, on_gpu.fused, on_gpu.entropy))
    # Both sides float32 sums in another order (GPU kernels): twice each side's bound.
    np.testing.assert_allclose(on_gpu.distance.cpu().numpy(), on_cpu.distance.numpy(), rtol=4 * summed(P), atol=0)
    np.testing.assert_allclose(on_gpu.received.cpu().numpy(), on_cpu.received.numpy(), rtol=2 * summed(H * N))
    np.testing.assert_allclose(on_gpu.entropy.cpu().numpy(), on_cpu.entropy.numpy(), rtol=0,
                               atol=2 * entropy_float32_atol(P))
    rows_gpu = batch_rollout(on_gpu.fused, layout, exclude_tokens=[(3,)] * B)
    rows_cpu = batch_rollout(on_cpu.fused, layout, exclude_tokens=[(3,)] * B)
    assert rows_gpu.is_cuda
    np.testing.assert_allclose(rows_gpu.cpu().numpy(), rows_cpu.numpy(), rtol=0,
                               atol=4 * L * summed(H) if dtype == torch.float32 else 2 * L * 2 ** -7)


@pytest.mark.parametrize("per_pass", [None, 2])
def test_gradient_rollout_of_the_batch_equals_each_images_own(per_pass):
    """One forward and backward for the batch against the per-image hooks (each image's own forward), in float64:
    the two forwards differ by the model's rounding, depth x widest dot product x EPS64 of the largest value."""
    from vitviz.analyses.batched import batch_gradient_rollout
    from vitviz.analyses.rollout import class_gradient_rollout

    model = tiny_model("vit_augreg").double()
    x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    layout = layout_of("vit_augreg")
    for target in (None, 3):
        maps, targets = batch_gradient_rollout(model, x, layout, target, images_per_pass=per_pass)
        assert maps.shape == (3, *layout.grid_size)
        for i in range(3):
            theirs, t = class_gradient_rollout(model, x[i:i + 1], layout, target)
            assert targets[i] == t
            bound = 2 * 4 * 64 * EPS64 * np.abs(theirs).max()  # depth 2 (two products each), width 4 x 64 (MLP)
            np.testing.assert_allclose(maps[i], theirs, rtol=0, atol=bound)
            assert not np.allclose(maps[(i + 1) % 3], theirs, rtol=0, atol=bound)  # another image's map fails
    assert len(set(targets)) == 1 and targets[0] == 3
