"""Every map method of the registry with an SAE latent as its target (vitviz.features.LatentTarget): it explains the
latent (its target value is the latent's activation) or refuses with a sentence naming the method, the target and
why — never torch's own error. Grad-CAM differentiates at the last block's ln1: a latent read there or later works,
one read earlier is refused."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitviz
from vitviz.explainers import registered
from vitviz.features import SAE
from vitviz.features.splice import LatentTarget

NAME = "vit_tiny_patch16_224"
POINTS = ("blocks.1.resid_post", "blocks.11.resid_pre", "blocks.11.ln1", "blocks.11.resid_post")
# (method, point) pairs refused; every other pair explains the latent
REFUSED = {("legrad", p) for p in POINTS} | {("gradient_rollout", p) for p in POINTS} | {
    ("gradcam", "blocks.1.resid_post"), ("gradcam", "blocks.11.resid_pre")}


@pytest.fixture(scope="module")
def lens(tmp_path_factory):
    """A random ViT-Ti/16 (12 blocks) with its 1000-class head at 32 px: 2x2 patches + CLS."""
    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=32)
    path = tmp_path_factory.mktemp("targets") / "t.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return vitviz.open(NAME, checkpoint=str(path), img_size=32, device="cpu")


@pytest.fixture(scope="module")
def saes(lens):
    """One SAE per point, initialised on the tokens of 8 noise images (K = 16, k = 4), and the two explained images."""
    x = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    trace = lens.trace(x, keep=list(POINTS))
    out = {}
    for p in POINTS:
        sae = SAE(192, 16, 4).init_from(trace[p][:8, 1:].reshape(-1, 192), seed=0)
        sae.info |= {"point": p, "point_kind": p.split(".")[2], "layer": int(p.split(".")[1]) + 1,
                     "model": {"token_layout": lens.layout.to_dict()}}
        z = sae.encode(trace[p][8:, 1:]).sum((0, 1))
        out[p] = sae, int(z.argmax())  # a latent that fires on the explained images
    return out, x[8:]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("method", list(registered()))
def test_every_method_explains_a_latent_or_says_why_not(lens, saes, method, point):
    by_point, x = saes
    sae, latent = by_point[point]
    target = LatentTarget(sae, latent)
    found = registered()[method]
    if (method, point) in REFUSED:
        with pytest.raises(vitviz.VitvizError) as refused:
            vitviz.explain(lens, x, method, target=target)
        sentence = str(refused.value)
        assert found.label.lower() in sentence.lower() and target.text() in sentence, sentence
        return
    m = vitviz.explain(lens, x, method, target=target)
    assert m.patches.shape == (2, 2, 2) and np.isfinite(m.patches).all()
    if found.kind in ("relevance", "perturbation"):
        with torch.no_grad():
            tokens = lens.trace(x, keep=[point])[point][:, 1:]
            value = sae.encode(tokens)[..., latent].sum(1).double().numpy()
        np.testing.assert_allclose(m.target_value, value, rtol=1e-5, atol=1e-6)
        assert value.max() > 0
    else:  # attention maps and the random floor explain no target
        assert m.target is None


def test_grad_cam_refusal_names_its_layer_and_the_latents_layer(lens, saes):
    by_point, x = saes
    sae, latent = by_point["blocks.1.resid_post"]
    with pytest.raises(vitviz.VitvizError, match=r"last block's ln1 activations \(layer 12\).*blocks\.1\.resid_post "
                                                 r"\(layer 2\), earlier in the forward"):
        vitviz.explain(lens, x, "gradcam", target=LatentTarget(sae, latent))
