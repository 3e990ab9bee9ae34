"""Issue 10, "on the GPU, stay on the GPU": capture leaves the attention where the model ran, the
per-image analyses read it there, and only results come to the host.

The placement logic is tested on the CPU by recording every host transfer (``Tensor.cpu``,
``Tensor.numpy``, ``Tensor.to("cpu")``, ``np.asarray(tensor)``) of an attention-sized tensor; the
results are held against plain numpy definitions (the pre-issue code) to 1e-10 / 1e-6.
"""
import numpy as np
import pytest
import torch

from conftest import entropy_float32_atol, tiny_model
from vitviz.runs.analysis import AnalysisSettings, analyze_batch
from vitviz.trace import trace_for_analysis as capture
from vitviz.analyses.distance import patch_distances
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.maps import head_scores
from vitviz.analyses.rollout import (attention_gradients, class_gradient_rollout, gradient_rollout, gradient_rollout_reference,
                            rollout_reference)
from vitviz.analyses.tokens import attention_sinks


class HostTransfers:
    """Records the size of every tensor copied or viewed as a host numpy array (once per tensor memory:
    ``t.cpu().numpy()`` of a CPU tensor is one view, not two)."""

    def __init__(self, monkeypatch):
        self.seen: dict[tuple[int, int], tuple[int, ...]] = {}
        cpu, numpy, to = torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.to

        def record(t):
            self.seen[(t.data_ptr(), t.numel())] = tuple(t.shape)

        def record_cpu(t, *args, **kwargs):
            record(t)
            return cpu(t, *args, **kwargs)

        def record_numpy(t, *args, **kwargs):
            record(t)
            return numpy(t, *args, **kwargs)

        def record_to(t, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu":
                record(t)
            return to(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "cpu", record_cpu)
        monkeypatch.setattr(torch.Tensor, "numpy", record_numpy)  # np.asarray(tensor) comes through here too
        monkeypatch.setattr(torch.Tensor, "to", record_to)

    def attention(self, N: int, numel: int) -> list[tuple[int, ...]]:
        """Shapes of the transfers of attention, (..., N, N), of at least ``numel`` elements."""
        return [s for s in self.seen.values() if s[-2:] == (N, N) and np.prod(s) >= numel]


def _entropy_np(rows):
    p = rows / rows.sum(axis=-1, keepdims=True)
    return -(p * np.log(np.where(p > 0, p, 1))).sum(axis=-1)


def _scores_np(attention, layout):
    """The per-head scores and received shares as numpy computed them before issue 10 (float64 throughout)."""
    patches = attention[..., layout.patch_slice, layout.patch_slice].astype(np.float64)
    entropy = _entropy_np(patches).mean(axis=-1)
    focus = 1 - _entropy_np(attention[..., layout.cls_index, layout.patch_slice].astype(np.float64)) / np.log(
        layout.num_patches)
    received = attention.mean(axis=(1, 2), dtype=np.float64)
    d = patch_distances(layout)
    distance = ((patches * d).sum(-1) / patches.sum(-1)).mean(-1)
    return entropy, focus, received, distance


@pytest.mark.slow
def test_analyze_without_saving_attention_never_copies_it_to_the_host(bundled, sample_images, monkeypatch):
    images = [im.image for im in sample_images[:2]]
    settings = AnalysisSettings(exclude_sinks=True)
    transfers = HostTransfers(monkeypatch)
    streamed = analyze_batch(bundled, images, settings, keep_attention=False)
    L, H, N = 12, 6, bundled.layout.num_tokens
    # Not the batch's (B, L, H, N, N), not one image's (L, H, N, N), not one layer's (H, N, N): only results.
    assert transfers.attention(N, H * N * N) == []
    assert "attention" not in streamed.arrays

    transfers.seen.clear()
    kept = analyze_batch(bundled, images, settings)
    assert transfers.attention(N, H * N * N) == [(2, L, H, N, N)]  # one copy, of the batch, because it is saved
    monkeypatch.undo()

    attention, layout = kept.arrays["attention"], kept.layout
    for name in ("rollout", "rollout_per_layer", "mean_distance_per_image", "token_norms", "features"):
        np.testing.assert_array_equal(streamed.arrays[name], kept.arrays[name])
    for i, a in enumerate(attention):
        entropy, focus, received, distance = _scores_np(a, layout)
        np.testing.assert_allclose(streamed.arrays["mean_distance_per_image"][i], distance, rtol=1e-6)
        scores = head_scores(torch.from_numpy(a), layout)
        # float32 terms summed in float64 against float64 throughout: the bound derived in
        # conftest.entropy_float32_atol for K = 256 patch keys (1.2e-4 nats; 5.5e-7 relative was seen).
        np.testing.assert_allclose(scores["entropy"], entropy, rtol=0, atol=entropy_float32_atol(layout.num_patches))
        np.testing.assert_allclose(scores["cls_focus"], focus, rtol=1e-6, atol=1e-9)
        sinks = attention_sinks(torch.from_numpy(a), layout)
        np.testing.assert_allclose(sinks.received, received, rtol=1e-10)
        assert [s.tolist() for s in sinks.sinks] == streamed.facts["attention_sinks_per_layer"][i]
        excluded = tuple(int(p) + 1 for p in sinks.patch_sinks(layout))
        assert excluded  # this model has sinks: the exclusion is exercised
        reference = rollout_reference(a, layout, exclude_tokens=excluded)
        np.testing.assert_allclose(streamed.arrays["rollout_per_layer"][i], reference.per_layer, rtol=0, atol=1e-10)


def test_capture_keeps_attention_on_the_models_device_and_results_come_back_as_numpy(monkeypatch):
    model = tiny_model("deit_distilled")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    transfers = HostTransfers(monkeypatch)
    out = capture(model, x)
    B, L, H, N = 2, 2, 4, out.layout.num_tokens
    assert out.stack("attn").shape == (B, L, H, N, N) and out.stack("attn").device == x.device
    assert transfers.attention(N, H * N * N) == []  # no layer of attention went through a host copy
    monkeypatch.undo()
    scores = head_scores(out.stack("attn")[0], out.layout)
    assert all(isinstance(v, np.ndarray) and v.shape == (L, H) for v in scores.values())
    entropy, focus, *_ = _scores_np(out.stack("attn")[0].double().numpy(), out.layout)
    np.testing.assert_allclose(scores["entropy"], entropy, rtol=0, atol=entropy_float32_atol(out.layout.num_patches))
    np.testing.assert_allclose(scores["cls_focus"], focus, rtol=1e-6, atol=1e-9)


def test_gradients_are_stored_in_float32_and_rollout_equals_the_float64_version():
    model = tiny_model("vit_augreg")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    attention, grads, _ = attention_gradients(model, x, target=3)
    assert attention.dtype == grads.dtype == np.float32  # half the bytes of the float64 arrays before
    layout = capture(model, x).layout
    ours = gradient_rollout(attention, grads, layout)
    float64 = gradient_rollout_reference(attention.astype(np.float64), grads.astype(np.float64), layout)
    assert np.abs(ours).max() > 0
    np.testing.assert_allclose(ours, float64, rtol=1e-6, atol=1e-12)
    # The app's and analyze's path: the same maths in backward hooks, no gradient retained.
    hooked, target = class_gradient_rollout(model, x, layout, target=3)
    assert target == 3
    np.testing.assert_allclose(hooked, ours, rtol=1e-10, atol=1e-15)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_analysis_on_the_gpu_stays_there_and_equals_the_cpu(bundled, sample_images, monkeypatch):
    import copy
    import dataclasses

    images = [im.image for im in sample_images[:2]]
    on_cpu = analyze_batch(bundled, images, AnalysisSettings())
    gpu = dataclasses.replace(bundled, model=copy.deepcopy(bundled.model).to("cuda"), device=torch.device("cuda"))
    out = capture(gpu.model, preprocess(images, gpu.data_config).tensor)
    assert out.stack("attn").is_cuda
    transfers = HostTransfers(monkeypatch)
    on_gpu = analyze_batch(gpu, images, AnalysisSettings(), keep_attention=False)
    L, H, N = 12, 6, bundled.layout.num_tokens
    assert transfers.attention(N, H * N * N) == []
    monkeypatch.undo()
    for name in ("rollout", "rollout_per_layer", "mean_distance_per_image"):
        np.testing.assert_allclose(on_gpu.arrays[name], on_cpu.arrays[name], rtol=1e-3, atol=1e-5)
