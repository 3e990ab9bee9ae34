"""A latent's nearest classes (vitviz.features.classes): the cosine of its decoder row with each class's readout
direction, against the hand-computed r_c = P (γ ⊙ w_c) (P centres, γ the final LayerNorm's weight, w_c the head's
row; for a cls+mean probe the two halves of the row summed), on a tiny timm ViT with its own head and with probe
heads."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitviz
from vitviz.features import SAE
from vitviz.features.classes import NoReadout, class_cosines, nearest_classes
from test_probe_head import open_backbone, write_probe

NAME, IMG = "vit_tiny_patch16_224", 32


@pytest.fixture(scope="module")
def lens(tmp_path_factory):
    """A random ViT-Ti/16 at 32 px with a 1000-class head, its final norm's weight and bias far from 1 and 0."""
    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=IMG)
    with torch.no_grad():
        model.norm.weight.uniform_(0.3, 3.0)
        model.norm.bias.normal_(0, 1)
        model.head.weight.normal_(0, 1)
    path = tmp_path_factory.mktemp("classes") / "t.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return vitviz.open(NAME, checkpoint=str(path), img_size=IMG, device="cpu")


def _sae(decoder: torch.Tensor, kind="resid_post", layer=2, b_dec=None) -> SAE:
    K, D = decoder.shape
    sae = SAE(D, K, 1)
    with torch.no_grad():
        sae.W_dec.copy_(decoder / decoder.norm(dim=-1, keepdim=True))
        sae.b_dec.copy_(torch.randn(D) if b_dec is None else b_dec)
    sae.info = {"point_kind": kind, "layer": layer, "point": f"blocks.{layer - 1}.{kind}"}
    return sae


def _centre(v: np.ndarray) -> np.ndarray:
    return v - v.mean(-1, keepdims=True)


def _cosines(d: np.ndarray, r: np.ndarray) -> np.ndarray:
    d = d / np.linalg.norm(d, axis=-1, keepdims=True)
    r = r / np.linalg.norm(r, axis=-1, keepdims=True)
    return d @ r.T


def test_cosines_equal_the_hand_computed_readout_directions(lens):
    gamma = lens.model.norm.weight.double().numpy()
    W = lens.model.head.weight.double().numpy()  # (1000, 192)
    r = _centre(gamma * W)  # r_c = P (γ ⊙ w_c), up to the positive 1/σ
    d = torch.randn(12, 192, generator=torch.Generator().manual_seed(3))
    got = class_cosines(lens, _sae(d))
    want = _cosines(d.double().numpy(), r)
    # float32 readout: gradients carry ~1e-7 relative rounding per entry
    np.testing.assert_allclose(got, want, atol=2e-6)
    # the reference token (b_dec) scales r_c by one positive number: another gives the same cosines
    np.testing.assert_allclose(class_cosines(lens, _sae(d, b_dec=5 * torch.randn(192))), want, atol=2e-6)


def test_a_direction_planted_on_a_class_readout_row_gives_that_class_first(lens):
    gamma = lens.model.norm.weight.double()
    W = lens.model.head.weight.double()
    planted = {0: 7, 1: 512, 2: 999}  # latent -> class
    decoder = torch.randn(3, 192, dtype=torch.float64)
    for j, c in planted.items():
        decoder[j] = gamma * W[c] - (gamma * W[c]).mean()
    table = nearest_classes(lens, _sae(decoder.float()), n=3)
    first = table[table["rank"] == 1].set_index("latent")
    for j, c in planted.items():
        assert first.loc[j, "class"] == c
        assert abs(first.loc[j, "cosine"] - 1) < 1e-6
        # the runner-up is far from it: random 192-d rows have cosines ~ 1/sqrt(192) = 0.07
        assert table[(table.latent == j) & (table["rank"] == 2)].cosine.item() < 0.5
    assert list(table.columns) == ["latent", "rank", "class", "label", "cosine"]
    assert len(table) == 9


@pytest.mark.parametrize("pooling", ["cls", "mean", "cls+mean"])
def test_probe_heads_read_the_direction_through_their_pooling(tmp_path, pooling):
    torch.manual_seed(2)
    model = timm.create_model(NAME, pretrained=False, num_classes=0, img_size=IMG)
    with torch.no_grad():
        model.norm.weight.uniform_(0.3, 3.0)
    weights = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    backbone = open_backbone(weights)
    head = write_probe(backbone, tmp_path, layer=3, pooling=pooling, seed=4)
    probed = open_backbone(weights, head=head)
    gamma = probed.model.backbone.norm.weight.double().numpy()
    W = probed.model.head.weight.double().numpy()
    w = W[:, :192] + W[:, 192:] if pooling == "cls+mean" else W  # a shift of every token moves both halves
    r = _centre(gamma * w)
    d = torch.randn(5, 192, generator=torch.Generator().manual_seed(1))
    np.testing.assert_allclose(class_cosines(probed, _sae(d, layer=3)), _cosines(d.double().numpy(), r), atol=2e-6)
    # the SAE past the probe's layer, an SAE on a point outside the residual stream, a headless model: sentences
    with pytest.raises(NoReadout, match="comes after the head"):
        class_cosines(probed, _sae(d, layer=4))
    with pytest.raises(NoReadout, match="not in its basis"):
        class_cosines(probed, _sae(d, kind="ln2", layer=2))
    with pytest.raises(NoReadout, match="has none"):
        class_cosines(backbone, _sae(d, layer=3))
