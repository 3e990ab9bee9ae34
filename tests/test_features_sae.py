"""The TopK SAE (vitviz.features.sae): the paper's formulas, a planted dictionary recovered, the training step's
sphere projection and auxiliary-k loss against hand-written references, determinism, resuming, files."""
import json
import warnings

import numpy as np
import pytest
import torch

from vitviz.features import SAE, Trainer, evaluate
from vitviz.features.sae import AUX_COEF, Convergence, NotConvergedWarning, SAEError

# most runs here are a few steps on purpose (formulas, files, resuming): their budget warnings are expected
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.features.sae.NotConvergedWarning")


def planted(n=30000, D=48, K=96, k=3, noise=0.01, seed=0):
    """Tokens that are sparse non-negative combinations of ``k`` of ``K`` known unit-norm atoms, plus noise."""
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((K, D))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    idx = np.argsort(rng.random((n, K)), axis=1)[:, :k]
    coef = rng.uniform(0.5, 2.0, (n, k))
    X = np.einsum("nk,nkd->nd", coef, atoms[idx]) + noise * rng.standard_normal((n, D))
    return X.astype(np.float32), atoms


def small_sae(D=8, K=16, k=3, seed=0):
    rng = np.random.default_rng(seed)
    sae = SAE(D, K, k, scale=1.7)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))
        sae.W_dec /= sae.W_dec.norm(dim=-1, keepdim=True)
    return sae


def test_encode_decode_follow_the_paper_formulas_in_numpy():
    sae = small_sae()
    with torch.no_grad():
        sae.b_enc -= 6.0  # some of the top k are negative: the ReLU must zero them
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    W_enc, b_enc, W_dec, b_dec = (p.detach().numpy().astype(np.float64) for p in
                                  (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    s = 1.7
    pre = (s * x - b_dec) @ W_enc.T + b_enc
    z = np.zeros_like(pre)
    for i, row in enumerate(pre):
        top = np.argsort(row)[-3:]
        z[i, top] = np.maximum(row[top], 0)
    x_hat = (z @ W_dec + b_dec) / s
    got_hat, got_z = sae(torch.from_numpy(x))
    # float32 products of 8 and 16 terms of O(1) values: a few 1e-6 absolute
    np.testing.assert_allclose(got_z.detach().numpy(), z, atol=1e-5)
    np.testing.assert_allclose(got_hat.detach().numpy(), x_hat, atol=1e-5)
    assert ((got_z > 0).sum(-1) <= 3).all() and ((got_z > 0).sum(-1) < 3).any()


@pytest.mark.slow
def test_planted_dictionary_is_recovered_with_the_planted_l0():
    X, atoms = planted()
    sae = SAE.fit(X, latents=96, topk=3, seed=0, epochs=5, batch_size=128, dead_after=2000)
    cos = atoms @ sae.decoder.numpy().T  # (planted atoms, latents)
    recovered = (cos.max(1) >= 0.9).mean()
    assert recovered >= 0.9, recovered
    m = evaluate(sae, X)
    assert 2.7 <= m["l0"] <= 3.0  # planted: exactly 3 atoms per token
    assert m["explained_variance"] > 0.9
    np.testing.assert_allclose(np.linalg.norm(sae.decoder.numpy(), axis=1), 1, atol=1e-6)


def recovered(sae, atoms):
    """Share of the planted atoms some decoder row points along (cosine >= 0.9)."""
    return float(((atoms @ sae.decoder.numpy().T).max(1) >= 0.9).mean())


def test_the_defaults_alone_recover_the_planted_dictionary_and_say_they_converged():
    """latents and topk only: 30,000 tokens of 96 planted atoms (48 dims, 3 per token) are one pass of 118 steps;
    the defaults repeat over them until the explained variance plateaus (~6 s on one core)."""
    X, atoms = planted()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotConvergedWarning)
        sae = SAE.fit(X, latents=192, topk=3, seed=0)
    assert recovered(sae, atoms) >= 0.9
    training = sae.info["training"]
    assert training["stop_reason"] == "plateau" and not training["still_rising"] and training["warning"] is None
    assert training["steps"] >= Convergence().min_steps and training["epochs"] > 1
    assert abs(training["explained_variance_gain"]) < Convergence().tol
    np.testing.assert_allclose(training["explained_variance"], evaluate(sae, X)["explained_variance"], atol=0.01)


def test_one_epoch_stops_on_its_budget_still_rising_and_says_so_in_a_warning_and_sae_json(tmp_path):
    """The old default (one pass, 118 steps) recovers a few atoms; the run says it had not converged."""
    X, atoms = planted()
    with pytest.warns(NotConvergedWarning, match=r"budget \(epochs=1\) at explained variance 0\.\d+ \(the mean "
                                                 r"of its last 118 steps\) with the explained variance still rising"):
        sae = SAE.fit(X, latents=192, topk=3, seed=0, epochs=1)
    assert recovered(sae, atoms) < 0.5
    training = sae.info["training"]
    assert (training["stop_reason"], training["steps"], training["still_rising"]) == ("budget", 118, True)
    assert training["explained_variance_gain"] >= Convergence().tol and training["explained_variance"] < 0.9
    written = json.loads((sae.save(tmp_path) / "sae.json").read_text())["training"]
    assert written["warning"].startswith("SAE training stopped on its budget (epochs=1)")


def test_the_step_budget_ends_a_run_that_has_not_plateaued_and_a_first_pass_is_always_completed():
    X, _ = planted(n=3000, D=16, K=24, k=2)  # 12 steps a pass
    with pytest.warns(NotConvergedWarning, match=r"budget \(max_steps=30\)"):  # tol 0: a plateau only if it fell
        sae = SAE.fit(X, latents=24, topk=2, until=Convergence(min_steps=20, max_steps=30, window=5, tol=0.0))
    assert (sae.info["training"]["stop_reason"], sae.info["training"]["steps"]) == ("budget", 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotConvergedWarning)
        sae = SAE.fit(X, latents=24, topk=2, until=Convergence(min_steps=2, max_steps=5, window=1))
    assert sae.info["training"]["steps"] == 12 and sae.info["training"]["epochs"] == 1
    assert sae.info["training"]["stop_reason"] == "budget"


def test_a_random_dictionary_is_not_recovered():
    """The recovery measure can fail: an untrained SAE's random directions match almost no planted atom."""
    X, atoms = planted(n=2000)
    sae = SAE(48, 96, 3).init_from(torch.from_numpy(X), seed=0)
    assert (np.abs(atoms @ sae.decoder.numpy().T).max(1) >= 0.9).mean() < 0.05


def test_init_puts_b_dec_at_the_mean_and_scales_tokens_to_mean_squared_norm_D():
    X = np.random.default_rng(0).standard_normal((500, 6)) * 3 + 10
    sae = SAE(6, 12, 2).init_from(torch.from_numpy(X), seed=0)
    s = float(sae.scale)
    centred = X - X.mean(0)
    assert abs((s ** 2) * (centred ** 2).sum(1).mean() - 6) < 1e-5
    np.testing.assert_allclose(sae.b_dec.detach().numpy(), s * X.mean(0), rtol=1e-6)
    np.testing.assert_allclose(sae.W_enc.detach().numpy(), sae.W_dec.detach().numpy())


def test_one_step_projects_the_decoder_gradient_on_the_sphere_then_renormalises():
    """Adam's first step is p - lr * g / (|g| + eps) per element; the decoder's g must be the gradient with its
    component along each row removed, and the row then put back at unit norm (a hand-written reference)."""
    sae = small_sae()
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((32, 8)).astype(np.float32))
    trainer = Trainer(sae, lr=1e-2, dead_after=10 ** 9)
    ref = small_sae()
    xs = x * ref.scale
    z = torch.zeros(32, 16).scatter(-1, *(lambda v, i: (i, v.relu()))(*ref.pre_activations(x).topk(3, dim=-1)))
    loss = (xs - (z @ ref.W_dec + ref.b_dec)).pow(2).sum() / (xs - xs.mean(0)).pow(2).sum()
    loss.backward()
    W, g = ref.W_dec.detach(), ref.W_dec.grad
    g_tangent = g - (g * W).sum(-1, keepdim=True) * W
    expected = W - 1e-2 * g_tangent / (g_tangent.abs() + 6.25e-10)
    expected = expected / expected.norm(dim=-1, keepdim=True)
    trainer.step(x)
    # float32: one step of size 1e-2 per element then a norm over 8: within a few ulps of 1
    torch.testing.assert_close(sae.W_dec.detach(), expected, atol=1e-6, rtol=0)


def test_dead_latents_get_the_auxiliary_k_loss():
    """Latents marked dead reconstruct the residual with their top k_aux pre-activations: the reported aux loss is
    the reference ||e - W_dec^T z_aux||^2 / ||e||^2, and those latents' encoder rows move (they had no gradient)."""
    sae = small_sae(D=8, K=16, k=2)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((64, 8)).astype(np.float32))
    trainer = Trainer(sae, lr=1e-3, dead_after=10)
    trainer.tokens = 100
    dead = torch.arange(16) >= 8
    trainer.last_fired[~dead] = 100  # latents 8..15 last fired 100 tokens ago
    with torch.no_grad():
        pre = sae.pre_activations(x)
        z = torch.zeros_like(pre).scatter(-1, pre.topk(2, -1).indices, pre.topk(2, -1).values.relu())
        e = x * sae.scale - (z @ sae.W_dec + sae.b_dec)
        k_aux = min(4, 8)  # D / 2 = 4 of the 8 dead
        pre_dead = pre[:, 8:]
        top = pre_dead.topk(k_aux, -1)
        z_aux = torch.zeros_like(pre_dead).scatter(-1, top.indices, top.values.relu())
        aux = float((e - z_aux @ sae.W_dec[8:]).pow(2).sum() / e.pow(2).sum())
        chosen = torch.zeros(16, dtype=torch.bool)
        chosen[8 + torch.unique(top.indices[top.values > 0])] = True
        never = ~chosen & dead & ~(z > 0).any(0)
    before = sae.W_enc.detach().clone()
    metrics = trainer.step(x)
    assert metrics["dead_fraction"] == 0.5
    assert abs(metrics["aux_loss"] - aux) < 1e-5 * max(1, aux)
    moved = (sae.W_enc.detach() - before).abs().sum(-1) > 0
    assert moved[chosen & ~(z > 0).any(0)].all() and chosen.any()
    assert not moved[never].any()  # dead latents that neither fired nor were chosen get no gradient
    assert AUX_COEF == 1 / 32


def test_same_seed_same_weights_other_seed_other_weights():
    X, _ = planted(n=1500, D=16, K=24, k=2)
    a = SAE.fit(X, latents=24, topk=2, seed=5, epochs=2)
    b = SAE.fit(X, latents=24, topk=2, seed=5, epochs=2)
    c = SAE.fit(X, latents=24, topk=2, seed=6, epochs=2)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.W_dec, c.W_dec)


class Killed(Exception):
    pass


def _kill_at(step):
    def callback(s, metrics):
        if s == step:
            raise Killed
    return callback


@pytest.mark.parametrize("stream", [False, True], ids=["array", "batches"])
def test_killed_and_resumed_training_equals_the_uninterrupted_run(tmp_path, stream):
    X, _ = planted(n=1200, D=16, K=24, k=2)
    data = (lambda: [X[i:i + 100] for i in range(0, len(X), 100)]) if stream else (lambda: X)
    whole = SAE.fit(data(), latents=24, topk=2, seed=3, epochs=2, batch_size=100, dead_after=300)
    ckpt = tmp_path / "train.pt"
    with pytest.raises(Killed):
        SAE.fit(data(), latents=24, topk=2, seed=3, epochs=2, batch_size=100, dead_after=300, checkpoint=ckpt,
                checkpoint_every=1, callback=_kill_at(17))  # in the second epoch (12 batches each)
    steps = []
    resumed = SAE.fit(data(), latents=24, topk=2, seed=3, epochs=2, batch_size=100, dead_after=300, checkpoint=ckpt,
                      checkpoint_every=1, callback=lambda s, m: steps.append(s))
    assert steps == list(range(18, 25))
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    assert resumed.info["training"]["tokens"] == whole.info["training"]["tokens"] == 2400


def test_a_run_until_converged_killed_and_resumed_stops_where_the_uninterrupted_run_stops(tmp_path):
    """The plateau test reads the last steps' explained variances: they are in the checkpoint."""
    X, _ = planted(n=1200, D=16, K=24, k=2)
    until = Convergence(min_steps=40, max_steps=400, window=10, tol=2e-3)
    whole = SAE.fit(X, latents=24, topk=2, seed=3, batch_size=100, until=until)
    assert whole.info["training"]["stop_reason"] == "plateau" and whole.info["training"]["steps"] > 40
    ckpt = tmp_path / "train.pt"
    with pytest.raises(Killed):
        SAE.fit(X, latents=24, topk=2, seed=3, batch_size=100, until=until, checkpoint=ckpt, checkpoint_every=1,
                callback=_kill_at(whole.info["training"]["steps"] - 3))
    resumed = SAE.fit(X, latents=24, topk=2, seed=3, batch_size=100, until=until, checkpoint=ckpt)
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    assert resumed.info["training"] == whole.info["training"]
    steps = []
    again = SAE.fit(X, latents=24, topk=2, seed=3, batch_size=100, until=until, checkpoint=ckpt,
                    callback=lambda s, m: steps.append(s))  # a finished run's checkpoint trains no further
    assert steps == [] and torch.equal(again.W_dec, whole.W_dec)


def test_a_checkpoint_of_other_settings_is_refused(tmp_path):
    X, _ = planted(n=400, D=16, K=24, k=2)
    SAE.fit(X, latents=24, topk=2, seed=0, epochs=1, checkpoint=tmp_path / "t.pt")
    with pytest.raises(SAEError, match="trained with"):
        SAE.fit(X, latents=24, topk=2, seed=0, epochs=1, lr=0.5, checkpoint=tmp_path / "t.pt")


def test_save_and_load_round_trip(tmp_path):
    X, _ = planted(n=600, D=16, K=24, k=2)
    sae = SAE.fit(X, latents=24, topk=2, seed=0, epochs=1, info={"model": "toy"})
    sae.save(tmp_path / "s")
    info = json.loads((tmp_path / "s" / "sae.json").read_text())
    assert (info["latents"], info["topk"], info["d_model"], info["model"]) == (24, 2, 16, "toy")
    back = SAE.load(tmp_path / "s")
    x = torch.from_numpy(X[:50])
    assert torch.equal(back.encode(x), sae.encode(x)) and torch.equal(back.decode(sae.encode(x)), sae.decode(sae.encode(x)))
    assert back.info["training"] == sae.info["training"]


def test_evaluate_against_numpy():
    sae = small_sae()
    x = np.random.default_rng(4).standard_normal((300, 8)).astype(np.float32)
    x_hat, z = (t.detach().numpy().astype(np.float64) for t in sae(torch.from_numpy(x)))
    m = evaluate(sae, [x[:100], x[100:]])
    nmse = ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert abs(m["nmse"] - nmse) < 1e-9 * nmse + 1e-6
    assert m["l0"] == (z > 0).sum(1).mean()
    assert m["dead_fraction"] == ((z > 0).sum(0) == 0).mean()


def test_topk_out_of_range_is_a_sentence():
    with pytest.raises(SAEError, match="topk must be between 1 and the number of latents"):
        SAE(8, 4, 5)


def test_a_one_shot_iterator_is_one_epoch_of_its_batches_in_order():
    X, _ = planted(n=900, D=16, K=24, k=2)
    batches = [X[i:i + 100] for i in range(0, 900, 100)]
    listed = SAE.fit(batches, latents=24, topk=2, seed=1, epochs=1, progress=True)
    streamed = SAE.fit((b for b in batches), latents=24, topk=2, seed=1)
    assert torch.equal(listed.W_dec, streamed.W_dec) and streamed.info["training"]["tokens"] == 900
    with pytest.raises(SAEError, match="one-shot iterator of batches is one epoch"):
        SAE.fit((b for b in batches), latents=24, topk=2, epochs=2)
