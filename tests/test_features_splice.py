"""The SAE spliced into the forward (vitviz.features.splice): the output bit for bit unchanged with the error term,
x̂ at the point without it, latent scores against the gradient at the point taken without any splice, and a
latent as the target of the registry's map methods."""
import copy
import dataclasses

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitviz
from vitviz.features import SAE, evaluate
from vitviz.features.splice import LatentTarget, Splice, feature_attribution
from vitviz.lens import Lens

NAME = "vit_tiny_patch16_224"
POINT = "blocks.1.resid_post"


@pytest.fixture(scope="module")
def lenses(tmp_path_factory):
    """A random ViT-Ti/16 with its 1000-class head at 32 px (2x2 patches + CLS): float32 and a float64 copy."""
    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("splice") / "t.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    lens = vitviz.open(NAME, checkpoint=str(path), img_size=32, device="cpu")
    loaded64 = dataclasses.replace(lens.loaded, model=copy.deepcopy(lens.model).double(), dtype=torch.float64)
    return lens, Lens(loaded64)


def _sae(lens, dtype=torch.float32, seed=0):
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    tokens = lens.trace(x, keep=[POINT])[POINT][:, 1:].reshape(-1, 192).float()
    sae = SAE.fit(tokens, latents=64, topk=8, seed=seed, epochs=3, batch_size=16)
    sae.info |= {"point": POINT, "model": {"token_layout": lens.layout.to_dict()}}
    return sae.to(dtype)


def _images(n=2, seed=1):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_splice_with_the_error_term_leaves_logits_and_pooled_bit_identical_in_float64(lenses):
    _, lens64 = lenses
    sae = _sae(lenses[0], torch.float64)
    x = _images().double()
    plain = lens64.trace(x, keep=("pooled", "logits"))
    splice = Splice(sae)
    spliced = lens64.trace(x, keep=("pooled", "logits"), edit=splice.edit, grad=True)
    assert torch.equal(spliced["logits"].detach(), plain["logits"])
    assert torch.equal(spliced["pooled"].detach(), plain["pooled"])
    assert splice.latents.shape == (2, 4, 64) and splice.latents.requires_grad
    # the SAE is no identity: without the error term the output moves
    changed = lens64.trace(x, keep=("logits",), edit=Splice(sae, error=False).edit)
    assert (changed["logits"] - plain["logits"]).abs().max() > 1e-6


def test_without_the_error_term_the_point_holds_the_reconstruction(lenses):
    lens, _ = lenses
    sae = _sae(lens)
    x = _images(3)
    tokens = lens.trace(x, keep=[POINT])[POINT]
    replaced = lens.trace(x, keep=[POINT], edit=Splice(sae, error=False).edit)[POINT]
    assert torch.equal(replaced[:, :1], tokens[:, :1])  # CLS untouched
    x_hat = sae(tokens[:, 1:])[0]
    assert torch.equal(replaced[:, 1:], x_hat)
    # the error at the point is the SAE's reconstruction error: evaluate's NMSE on the same tokens
    flat = tokens[:, 1:].reshape(-1, 192)
    err = (replaced[:, 1:].reshape(-1, 192) - flat).double().pow(2).sum()
    var = (flat.double() - flat.double().mean(0)).pow(2).sum()
    assert abs(float(err / var) - evaluate(sae, flat)["nmse"]) < 1e-6


def test_feature_scores_are_activation_times_the_gradient_at_the_point_read_without_splice(lenses):
    _, lens64 = lenses
    sae = _sae(lenses[0], torch.float64)
    x = _images().double()
    fa = feature_attribution(lens64, x, sae, target=vitviz.ClassLogit(7))
    # reference: the gradient of the logit w.r.t. the plain forward's tokens g; d logit / d z_j = g . W_dec[j] / s
    xg = x.clone().requires_grad_(True)  # frozen weights: the graph starts at the input
    trace = lens64.trace(xg, keep=[POINT, "logits"], grad=True)
    tokens = trace[POINT]
    (g,) = torch.autograd.grad(trace["logits"][:, 7].sum(), tokens)
    z = sae.encode(tokens[:, 1:].detach())
    expected = (z * (g[:, 1:] @ sae.W_dec.T.detach() / sae.scale)).sum(1)
    np.testing.assert_allclose(fa.scores, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fa.target_value, trace["logits"][:, 7].detach().numpy(), rtol=0, atol=0)
    assert (np.abs(fa.scores) > 0).sum() >= 2


def test_a_latent_is_a_target_for_the_registrys_methods(lenses):
    lens, _ = lenses
    sae = _sae(lens)
    x = _images(2)
    tokens = lens.trace(x, keep=[POINT])[POINT]
    z = sae.encode(tokens[:, 1:]).detach()  # (B, 4, K)
    latent = int(z.sum((0, 1)).argmax())
    target = LatentTarget(sae, latent)
    m = vitviz.explain(lens, x, "gradient", target=target)
    np.testing.assert_allclose(m.target_value, z[..., latent].sum(1).double().numpy(), rtol=1e-6)
    # reference: Gradient x Input of the latent's summed activation, by hand
    xr = x.clone().requires_grad_(True)
    with torch.enable_grad():
        t = lens.trace(xr, keep=[POINT], grad=True)[POINT]
        value = sae.encode(t[:, 1:])[..., latent].sum(1)
        (grad,) = torch.autograd.grad(value.sum(), xr)
    np.testing.assert_allclose(m.pixels, (xr * grad).sum(1).detach().double().numpy(), rtol=1e-5, atol=1e-7)
    at_patch = vitviz.explain(lens, x, "occlusion", target=LatentTarget(sae, latent, patch=0))
    np.testing.assert_allclose(at_patch.target_value, z[:, 0, latent].double().numpy(), rtol=1e-6)
    assert vitviz.explain(lens, x, "attnlrp", target=target).patches.shape == (2, 2, 2)
    with pytest.raises(vitviz.VitvizError, match="LeGrad cannot explain latent"):
        vitviz.explain(lens, x, "legrad", target=target)
    with pytest.raises(vitviz.VitvizError, match="latent 64 is out of range"):
        LatentTarget(sae, 64)


def test_ablating_latents_removes_exactly_their_share_of_the_tokens(lenses):
    _, lens64 = lenses
    sae = _sae(lenses[0], torch.float64)
    x = _images().double()
    ablate = [3, 17, 40]

    def by_hand(value, point):
        z = sae.encode(value[:, 1:]).detach()
        share = z[..., ablate] @ sae.W_dec[ablate].detach() / sae.scale
        return torch.cat([value[:, :1], value[:, 1:] - share], 1)

    expected = lens64.trace(x, keep=("logits",), edit={POINT: by_hand})["logits"]
    got = lens64.trace(x, keep=("logits",), edit=Splice(sae, ablate=ablate).edit)["logits"]
    # float64: the share computed as x_hat - decode(z without them) vs directly, ~1e-15 relative
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert (got - lens64.trace(x, keep=("logits",))["logits"]).abs().max() > 1e-6  # they did carry something


def test_concept_deletion_curves_follow_the_ranking_and_say_what_they_show(lenses):
    from vitviz.features.deletion import concept_deletion

    lens, _ = lenses
    sae = _sae(lens)
    x = _images(3)
    target = vitviz.ClassLogit(7)
    d = concept_deletion(lens, x, sae, target=target, steps=3, random_seeds=2, names=["a", "b", "c"])
    plain = lens.trace(x, keep=("logits",))["logits"][:, 7]
    base = d.curves[d.curves.step == 0].groupby("image").value.first()
    np.testing.assert_allclose(base.loc[["a", "b", "c"]].to_numpy(), plain.numpy(), rtol=0, atol=0)
    fa = feature_attribution(lens, x, sae, target=target)
    top = np.argsort(-fa.scores[1], kind="stable")[:2].tolist()
    mask = torch.zeros(3, 64, dtype=torch.bool)
    mask[1, top] = True  # the other images' rows do not change image b's forward
    by_hand = lens.trace(x, keep=("logits",), edit=Splice(sae, ablate=mask).edit)["logits"][1, 7]
    got = d.curves.query("image == 'b' and order == 'top' and step == 2").value.item()
    assert got == float(by_hand)
    single = lens.trace(x[1:2], keep=("logits",), edit=Splice(sae, ablate=top).edit)["logits"][0, 7]
    assert abs(got - float(single)) <= 1e-5 * abs(float(single))  # float32, another batch size: rounding only
    assert set(d.curves.order) == {"top", "random_seed_0", "random_seed_1"} and d.curves.step.max() == 3
    assert d.difference.n == 3
    assert ("cannot be told from chance" in d.sentence) == (d.difference.low <= 0 <= d.difference.high)


def test_attnlrp_rules_act_through_the_spliced_forward(lenses):
    """rules=AttnLRP(): the model's norms, softmax and products take lxt's rules downstream of the splice (the
    scores move away from the plain gradient's) while the target's value stays the plain forward's."""
    from vitviz.explainers.rules import AttnLRP

    _, lens64 = lenses
    sae = _sae(lenses[0], torch.float64)
    x = _images().double()
    plain = feature_attribution(lens64, x, sae, target=vitviz.ClassLogit(7))
    rules = AttnLRP()
    lrp = feature_attribution(lens64, x, sae, target=vitviz.ClassLogit(7), rules=rules)
    assert rules.calls > 0
    np.testing.assert_array_equal(lrp.target_value, plain.target_value)
    np.testing.assert_array_equal(lrp.activations, plain.activations)
    assert np.abs(lrp.scores - plain.scores).max() > 1e-6 * np.abs(plain.scores).max()
