"""Faithfulness batched (vitviz.perturbation.protocols.protocol_curves_batch): every perturbed input of a batch of
images, maps and protocols through the model together gives the curves of protocol_curves image by image.

Not bit for bit: a row's operations are the same in any batch, but the CPU's float32 matrix products block their
sums by the batch's size (image by image: batches of 2 and 9 rows; batched: up to batch_size), so a score can move by
an ulp or two of float32 (measured over 5,160 values of these tests: 93 % bit for bit, the rest at most 3.0e-8
apart). The tolerance, 1e-6 absolute on scores in [0, 1], is ~8 ulps of float32 at 1 (eps 1.2e-7); Chefer's 0/1 top-1 agreement must be
equal (a flip would need two logits within an ulp)."""
import numpy as np
import pytest
import torch

from conftest import tiny_model
from vitviz.adapters import adapter_for
from vitviz.perturbation.curves import random_seed_maps
from vitviz.perturbation.protocols import CHEFER, PROTOCOLS, protocol_curves, protocol_curves_batch


def _case(family: str, images: int = 3, seed: int = 0):
    model = tiny_model(family, seed)
    layout = adapter_for(model).layout(model, (64, 64) if family != "dinov2" else (70, 70))
    size = 64 if family != "dinov2" else 70
    x = torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(seed))
    rng = np.random.default_rng(seed)
    maps = [{"a": rng.random(layout.grid_size), "b": rng.normal(size=layout.grid_size)}
            | random_seed_maps(layout.grid_size, 0, 3) for _ in range(images)]
    return model, x, maps, layout


def _assert_same(batched, single):
    assert batched.methods == single.methods and batched.protocols == single.protocols
    assert batched.score == single.score and batched.target == single.target
    for p in single.protocols:
        np.testing.assert_array_equal(batched.fractions[p], single.fractions[p])
        if p in CHEFER:
            np.testing.assert_array_equal(batched.curves[p], single.curves[p], err_msg=p)
        else:
            np.testing.assert_allclose(batched.curves[p], single.curves[p], rtol=0, atol=1e-6, err_msg=p)


@pytest.mark.parametrize("batch_size", [7, 64], ids=["rows split between forwards", "one forward per score"])
@pytest.mark.parametrize("replacement", ["mean", "blur"])
def test_batched_curves_equal_the_image_by_image_ones(batch_size, replacement):
    """A classifier (class probability, Chefer's top-1 agreement): 3 images x 5 maps x 5 protocols."""
    model, x, maps, layout = _case("siglip")
    protocols = PROTOCOLS + CHEFER
    batched = protocol_curves_batch(model, x, maps, layout, protocols=protocols, replacement=replacement,
                                    batch_size=batch_size)
    assert len(batched) == len(x)
    for i in range(len(x)):
        _assert_same(batched[i], protocol_curves(model, x[i], maps[i], layout, protocols=protocols,
                                                 replacement=replacement))
    spread = np.concatenate([b.curves["morf"].ravel() for b in batched])
    assert spread.std() > 1e-3  # the curves move: equal numbers are not equal constants


def test_batched_curves_of_a_headless_model_and_a_fixed_target_equal_the_image_by_image_ones():
    """The pre-logits cosine reads the pooled vector (each image against its own original); a classifier with one
    target for every image."""
    model, x, maps, layout = _case("dino", images=2)
    for single, batched in zip([protocol_curves(model, x[i], maps[i], layout) for i in range(2)],
                               protocol_curves_batch(model, x, maps, layout, batch_size=10)):
        _assert_same(batched, single)
        assert single.score["morf"].startswith("cosine similarity")
    model, x, maps, layout = _case("siglip", images=2, seed=1)
    for i, batched in enumerate(protocol_curves_batch(model, x, maps, layout, target=3, batch_size=16)):
        _assert_same(batched, protocol_curves(model, x[i], maps[i], layout, target=3))
        assert batched.target == 3


def test_forwards_hold_at_most_batch_size_inputs_and_are_fewer_than_image_by_image(monkeypatch):
    from vitviz.perturbation import protocols as module

    model, x, maps, layout = _case("siglip")
    sizes = []
    real = module.trace_model  # the one forward the protocols call

    def counted(model, inputs, *args, **kwargs):
        sizes.append(len(inputs))
        return real(model, inputs, *args, **kwargs)

    monkeypatch.setattr(module, "trace_model", counted)
    protocol_curves_batch(model, x, maps, layout, batch_size=32)
    # 3 images x (2 ends + 5 maps x 3 protocols x 9 inner steps) = 411 inputs: 12 forwards of 32, one of 27
    assert max(sizes) <= 32 and sum(sizes) == 3 * (2 + 5 * 3 * 9) and len(sizes) == 13


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_curves_on_cuda_equal_the_image_by_image_ones():
    """On CUDA cuBLAS and cuDNN choose kernels by batch size, so a row's sums may be ordered differently between
    a batch of 9 and one of 64: float32 rounding, ~1e-6 relative per product, through two blocks and a softmax of
    probabilities at most 1; 1e-5 absolute holds that with room (Chefer's 0/1 agreement is left out: a near tie of
    two logits may flip)."""
    model, x, maps, layout = _case("siglip")
    model, x = model.to("cuda"), x.to("cuda")
    batched = protocol_curves_batch(model, x, maps, layout, batch_size=64)
    for i in range(len(x)):
        single = protocol_curves(model, x[i], maps[i], layout)
        for p in PROTOCOLS:
            np.testing.assert_allclose(batched[i].curves[p], single.curves[p], rtol=0, atol=1e-5, err_msg=p)
