"""The direct readout and the logit lens, against the libraries' own forwards.

References come from outside vitviz's readout: timm's ``model(x)`` / ``forward_head``, transformers'
``ViTForImageClassification(...).logits``, a probe applied by hand to the bundled model's own timm blocks, and a
head's contribution recomputed in numpy from timm's qkv and output-projection weights (float64 copies of the models,
so the tolerances below are float64 rounding: ~1e-16 per operation times the few hundred terms summed, scaled by the
largest term; float32 runs get eps32 ~1.2e-7 on the same count).
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import timm
import torch

import vitviz
from vitviz.explainers.targets import ClassLogit
from vitviz.lens import Lens
from vitviz.residual import ReadoutNotApplicable, direct_vectors
from vitviz.sources.models import ModelSpec, _finish

from conftest import FAMILIES, tiny_model

ARCH = "vit_tiny_patch16_224"


def tiny_timm(seed: int = 0, img: int = 64, **kw) -> torch.nn.Module:
    """A random ViT-Ti/16 with LayerScale and a 10-class head; weights shaken so no part is near zero."""
    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, num_classes=10, img_size=img, depth=4, init_values=0.1,
                              **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval().requires_grad_(False)


def lens_of(model: torch.nn.Module, dtype=torch.float32) -> Lens:
    loaded = _finish(copy.deepcopy(model).float(), ModelSpec(name=ARCH, device="cpu"), "random", "tiny ViT", [])
    return Lens(dataclasses.replace(loaded, model=loaded.model.to(dtype), dtype=dtype))


def images(n: int = 3, img: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, img, img, generator=torch.Generator().manual_seed(seed))


def float64_tolerance(r) -> np.ndarray:
    """1e-13 of the summed magnitudes: a few hundred float64 operations each within 2^-53 relative."""
    scale = (np.abs(r.embed) + np.abs(r.heads).sum((1, 2)) + np.abs(r.attn_bias).sum(1) + np.abs(r.mlp).sum(1)
             + np.abs(r.bias))
    return 1e-13 * scale


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_parts_add_up_to_timms_own_logit_in_float64_and_float32(pool):
    model = tiny_timm(global_pool=pool, fc_norm=pool == "avg")
    x = images()
    cls = 7
    r64 = vitviz.readout(lens_of(model, torch.float64), x.double(), target=ClassLogit(cls))
    own64 = model.double()(x.double())[:, cls].numpy()
    assert np.all(np.abs(r64.parts_sum - own64) <= float64_tolerance(r64))
    r32 = vitviz.readout(lens_of(model.float()), x, target=ClassLogit(cls))
    own32 = model.float()(x)[:, cls].numpy()
    # float32: the model's own forward and the parts each carry ~eps32 x (sum of magnitudes) x sqrt(terms) of rounding
    scale = np.abs(r32.heads).sum((1, 2)) + np.abs(r32.mlp).sum(1) + np.abs(r32.embed) + np.abs(r32.bias)
    assert np.all(np.abs(r32.parts_sum - own32) <= 1.2e-7 * scale * 30)
    assert np.allclose(r32.heads, r64.heads, rtol=1e-4, atol=1e-5 * np.abs(r64.heads).max())


def test_a_heads_row_equals_its_write_recomputed_from_timms_qkv_and_projection_weights():
    """Block l's input from timm's own blocks; head h's write = softmax(q kᵀ·scale) v_h W_O[:, h]ᵀ · γ; through the
    final LayerNorm with σ frozen at the CLS token's own and the head's class row: W_k · (γ_n ⊙ (c − mean c) / σ)."""
    model = tiny_timm().double()
    x = images(2).double()
    cls = 3
    r = vitviz.readout(lens_of(model, torch.float64), x, target=ClassLogit(cls))
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        inputs = []
        for blk in model.blocks:
            inputs.append(tokens)
            tokens = blk(tokens)
        final = tokens[:, 0].numpy()  # CLS, before the final norm
    sigma = np.sqrt(final.var(-1) + model.norm.eps)  # (B,)
    gamma_n = model.norm.weight.numpy()
    w_k = model.head.weight[cls].numpy()
    for layer in (0, 2, 3):
        blk = model.blocks[layer]
        H, d = blk.attn.num_heads, blk.attn.head_dim
        with torch.no_grad():
            h = blk.norm1(inputs[layer]).numpy()
        qkv = h @ blk.attn.qkv.weight.numpy().T + blk.attn.qkv.bias.numpy()
        q, k, v = (qkv[..., i * H * d:(i + 1) * H * d].reshape(*h.shape[:2], H, d).transpose(0, 2, 1, 3)
                   for i in range(3))
        scores = q @ k.transpose(0, 1, 3, 2) * d ** -0.5
        attn = np.exp(scores - scores.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        for head in range(H):
            z = attn[:, head] @ v[:, head]  # (B, N, d)
            write = z @ blk.attn.proj.weight.numpy()[:, head * d:(head + 1) * d].T * blk.ls1.gamma.numpy()
            c = write[:, 0]
            expected = ((gamma_n * (c - c.mean(-1, keepdims=True)) / sigma[:, None]) * w_k).sum(-1)
            np.testing.assert_allclose(r.heads[:, layer, head], expected, rtol=1e-10, atol=1e-12)


def test_a_transformers_vit_readout_adds_up_to_its_own_logits(tmp_path):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128, image_size=32,
                    patch_size=8, num_labels=5)
    hf = ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    lens = vitviz.open(str(tmp_path), device="cpu")
    x = images(2, 32)
    r = vitviz.readout(lens, x)  # each image's top-1 class
    with torch.no_grad():
        own = hf(pixel_values=x).logits
    expected = own.gather(1, torch.tensor(r.target.classes)[:, None])[:, 0].numpy()
    assert list(r.target.classes) == own.argmax(-1).tolist()
    scale = np.abs(r.heads).sum((1, 2)) + np.abs(r.mlp).sum(1) + np.abs(r.embed) + np.abs(r.bias)
    assert np.all(np.abs(r.parts_sum - expected) <= 1.2e-7 * scale * 30)


@pytest.mark.slow
def test_a_probe_head_on_the_bundled_model_adds_up_to_the_probe_applied_to_timms_own_blocks(tmp_path):
    from test_probe_head import write_probe

    bundled = vitviz.open("bundled", device="cpu")
    head = write_probe(bundled, tmp_path, layer=9, pooling="cls+mean", seed=3)
    lens = vitviz.open("bundled", device="cpu", head=head)
    x = lens.preprocess(["assets/chelsea.jpg", "assets/coffee.jpg"])
    r = vitviz.readout(lens, x, target=ClassLogit(1))
    timm_model = bundled.model
    with torch.no_grad():
        tokens = timm_model.norm_pre(timm_model._pos_embed(timm_model.patch_embed(x.tensor)))
        for blk in timm_model.blocks[:9]:
            tokens = blk(tokens)
        normed = timm_model.norm(tokens)
        npt = timm_model.num_prefix_tokens
        pooled = torch.cat([normed[:, 0], normed[:, npt:].mean(1)], -1)
        probe = lens.model.head
        expected = (pooled @ probe.weight.T + probe.bias)[:, 1].numpy()
    scale = np.abs(r.heads).sum((1, 2)) + np.abs(r.mlp).sum(1) + np.abs(r.embed) + np.abs(r.bias)
    assert np.all(np.abs(r.parts_sum - expected) <= 1.2e-7 * scale * 30)
    table = r.table()
    assert len(table) == 2 * (1 + 9 * 6 + 9 + 9 + 1)
    assert set(table.component) == {"embed", "attn_head", "attn_bias", "mlp", "bias"}
    # the same ~80 float64 terms summed in another order: each sum within 80 eps64 of the summed magnitudes
    np.testing.assert_allclose(table.groupby("image").value.sum().to_numpy(), r.parts_sum, rtol=0,
                               atol=80 * 2.3e-16 * float(table.value.abs().groupby(table.image).sum().max()))


def test_each_heads_source_shares_add_up_to_its_contribution():
    model = tiny_timm(3)
    r = vitviz.readout(lens_of(model, torch.float64), images(2).double())
    np.testing.assert_allclose(r.head_sources.sum(-1), r.heads, rtol=1e-10, atol=1e-13)
    assert r.patches(1, 2).shape == (2, 4, 4)
    np.testing.assert_array_equal(r.patches(1, 2).reshape(2, -1), r.head_sources[:, 1, 2, 1:])
    # the Readout page's split of one head (image 1): patches + prefix tokens = the head's contribution
    from_patches, from_prefix = r.source_split(1, 2, image=1)
    assert from_patches == pytest.approx(r.patches(1, 2)[1].sum(), rel=1e-12)
    assert from_patches + from_prefix == pytest.approx(r.heads[1, 1, 2], rel=1e-10, abs=1e-13)
    # its bars: each block's heads together, with the other parts, add up to the model's own value
    per_layer = r.heads_per_layer(1)
    assert per_layer.shape == (r.heads.shape[1],)
    assert (per_layer.sum() + r.attn_bias[1].sum() + r.mlp[1].sum() + r.embed[1] + r.bias[1]
            == pytest.approx(r.total[1], rel=1e-10))


def planted_model(layer: int = 0, head: int = 1, cls: int = 4, patches=(5, 10)):
    """A ViT whose head (layer, head) attends uniformly and whose values are zero except on the planted patches'
    tokens, which it writes along class ``cls``'s direction of the classifier: that head moves only those patches,
    and toward ``cls``. Returns the model and an image lit only on the planted patches."""
    model = tiny_timm(seed=2, img=64).double()
    D = model.embed_dim
    attn = model.blocks[layer].attn
    d = attn.head_dim
    with torch.no_grad():
        model.pos_embed.zero_()
        model.patch_embed.proj.bias.zero_()
        model.blocks[layer].norm1.bias.zero_()
        sl = slice(head * d, (head + 1) * d)
        attn.qkv.weight[sl].zero_()
        attn.qkv.bias[sl].zero_()  # q = 0: uniform attention
        attn.qkv.bias[2 * D + head * d:2 * D + (head + 1) * d].zero_()  # v = W_v · LN(token): 0 on dark patches
        direction = model.head.weight[cls] / model.head.weight[cls].norm()
        proj = torch.zeros(D, d, dtype=torch.float64)
        proj[:, 0] = direction * 40.0
        attn.proj.weight[:, sl] = proj
        attn.qkv.weight[2 * D + head * d] = attn.qkv.weight[2 * D + head * d].abs()
    x = torch.zeros(1, 3, 64, 64, dtype=torch.float64)
    for p in patches:
        r, c = divmod(p, 4)
        x[:, :, r * 16:(r + 1) * 16, c * 16:(c + 1) * 16] = 1.0
    return model, x


def test_a_planted_head_writing_a_class_direction_tops_the_table_and_lights_its_patches():
    model, x = planted_model(layer=0, head=1, cls=4, patches=(5, 10))
    r = vitviz.readout(lens_of(model, torch.float64), x, target=ClassLogit(4))
    assert r.top_heads(1)[0][:2] == (0, 1)
    sources = r.patches(0, 1)[0].ravel()
    lit = np.argsort(-np.abs(sources))[:2]
    assert set(lit.tolist()) == {5, 10}
    assert np.abs(np.delete(sources, [5, 10])).max() < 1e-9 * np.abs(sources).max()


def test_the_last_blocks_head_ablated_without_final_norm_moves_the_logit_by_exactly_its_direct_share():
    """With no norm after the blocks the readout is linear, so zeroing a last-block head's z changes the logit by its
    direct contribution and nothing else: total effect = direct effect (vitviz.head_effects)."""
    model = tiny_timm(4).double()
    model.norm = torch.nn.Identity()
    lens = lens_of(model, torch.float64)
    x = images(2).double()
    effects = vitviz.head_effects(lens, x, heads=[(3, 0), (1, 2)], target=ClassLogit(2))
    last = effects[(effects.layer == 3) & (effects.head == 0)]
    np.testing.assert_allclose(last.total.to_numpy(), last.direct.to_numpy(), rtol=1e-10, atol=1e-13)
    earlier = effects[(effects.layer == 1)]
    assert not np.allclose(earlier.total.to_numpy(), earlier.direct.to_numpy(), rtol=1e-3)


def test_the_logit_lens_last_layer_is_the_logits_bit_for_bit_and_each_layer_is_timms_head_on_that_block():
    model = tiny_timm(5)
    lens = lens_of(model)
    x = images(3)
    ll = vitviz.logit_lens(lens, x, per_patch=True)
    trace = lens.trace(x, keep=["logits"])
    np.testing.assert_array_equal(ll.logits[:, -1], trace["logits"].numpy())
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        for l, blk in enumerate(model.blocks):
            tokens = blk(tokens)
            expected = model.forward_head(model.norm(tokens)).numpy()
            np.testing.assert_allclose(ll.logits[:, l], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
            # per patch: the head on each token's own final norm
            per_token = model.head(model.fc_norm(model.norm(tokens))).numpy()
            np.testing.assert_allclose(ll.patches[:, l], per_token, rtol=1e-5, atol=1e-5 * np.abs(per_token).max())
    # the Readout page's rows: one image's, or the set's mean
    probs, logits = ll.of(1)
    np.testing.assert_array_equal(logits, ll.logits[1])
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-12)
    assert probs.argmax(-1).tolist() == logits.argmax(-1).tolist()
    mean_probs, mean_logits = ll.of(None)
    # float32 logits summed in another order: a few ulps of the largest |logit| (6e-8 relative each)
    np.testing.assert_allclose(mean_logits, (ll.logits[0] + ll.logits[1] + ll.logits[2]) / 3, rtol=0,
                               atol=1e-6 * np.abs(ll.logits).max())
    np.testing.assert_allclose(mean_probs, sum(ll.of(i)[0] for i in range(3)) / 3, rtol=1e-12)
    table = ll.table(top=3)
    assert set(table.columns) == {"image", "name", "layer", "class", "label", "logit", "prob", "rank"}
    top = table[(table.layer == 3) & (table["rank"] == 1)]
    assert top["class"].tolist() == trace["logits"].argmax(-1).tolist()


def test_a_tuned_lens_fits_the_last_block_better_than_the_plain_lens_on_held_out_images():
    model = tiny_timm(6)
    lens = lens_of(model)
    tuned = vitviz.TunedLens.fit_images(lens, images(24, seed=3), held_out=0.25)
    fit = tuned.fit
    assert list(fit.images_held_out.unique()) == [6] and list(fit.images_fit.unique()) == [18]
    early = fit[fit.layer < 3]
    assert (early.kl_tuned < early.kl_plain).all()
    assert fit[fit.layer == 3].kl_plain.iloc[0] == pytest.approx(0, abs=1e-6)


def test_direct_vectors_give_every_class_and_agree_with_the_scalar_readout():
    model = tiny_timm(7)
    lens = lens_of(model, torch.float64)
    x = images(2).double()
    dv = direct_vectors(lens, x, point="logits")
    assert np.abs(dv.residual).max() <= 1e-12 * np.abs(dv.values).sum(1).max()
    r = vitviz.readout(lens, x, target=ClassLogit(6), sources=False)
    np.testing.assert_allclose(dv.heads()[..., 6], r.heads, rtol=1e-9, atol=1e-12)


def test_window_models_and_headless_lenses_are_refused_with_a_sentence():
    from test_swin import TINY_SWIN

    swin = Lens(_finish(timm.create_model(TINY_SWIN, pretrained=False).eval(), ModelSpec(name=TINY_SWIN, device="cpu"),
                        "random", "tiny Swin", []))
    with pytest.raises(ReadoutNotApplicable, match="window attention"):
        vitviz.readout(swin, torch.randn(1, 3, *swin.loaded.data_config["input_size"][-2:]))
    headless = Lens(_finish(timm.create_model(ARCH, pretrained=False, num_classes=0, img_size=32).eval(),
                            ModelSpec(name=ARCH, device="cpu"), "random", "tiny", []))
    with pytest.raises(ReadoutNotApplicable, match="no classifier head"):
        vitviz.logit_lens(headless, torch.randn(1, 3, 32, 32))
    # a headless model's readout explains its pooled vector's projection, and still adds up
    r = vitviz.readout(headless, torch.randn(2, 3, 32, 32))
    assert "projection" in r.target.text()
    assert np.all(np.abs(r.residual) <= 1e-4 * np.abs(r.total))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_timm_family_adds_up_to_its_own_forward_or_is_refused_with_a_sentence(family):
    """The tests' tiny random model of each timm family (conftest.FAMILIES): its readout's parts add up to timm's own
    ``model(x)`` (the logit of class 1, or for a headless model the pooled vector's projection), or — attention
    pooling (SigLIP) — it is refused with a sentence."""
    model = tiny_model(family).double()
    lens = lens_of(model, torch.float64)
    x = torch.randn(2, 3, *lens.loaded.data_config["input_size"][-2:], generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    if getattr(model, "attn_pool", None) is not None:
        with pytest.raises(ReadoutNotApplicable, match="attention"):
            vitviz.readout(lens, x)
        return
    with torch.no_grad():
        if lens.has_head:
            r = vitviz.readout(lens, x, target=ClassLogit(1))
            own = model(x)[:, 1].numpy()
        else:
            r = vitviz.readout(lens, x)
            pooled = model.forward_head(model.forward_features(x), pre_logits=True)
            own = (pooled * pooled).sum(-1).sqrt().numpy()  # the projection on its own direction: its norm
    assert np.all(np.abs(r.parts_sum - own) <= float64_tolerance(r) * 10)


def test_a_shared_trace_gives_both_readouts_of_their_own_forwards_and_the_cli_runs_one_forward_per_batch(
        monkeypatch):
    from types import SimpleNamespace

    from vitviz.runs.readout_run import ReadoutWork
    from vitviz.trace import PointNotKept

    lens = lens_of(tiny_timm(7))
    x = images(3)
    own_r, own_ll = vitviz.readout(lens, x), vitviz.logit_lens(lens, x)
    trace = lens.trace(x, keep=vitviz.residual.readout_points(lens) + ["resid_post"])
    shared_r, shared_ll = vitviz.readout(lens, x, trace=trace), vitviz.logit_lens(lens, x, trace=trace)
    # the same forward arithmetic either way: equality is the point
    for name in ("total", "embed", "heads", "attn_bias", "mlp", "head_sources"):
        np.testing.assert_array_equal(getattr(shared_r, name), getattr(own_r, name))
    np.testing.assert_array_equal(shared_ll.logits, own_ll.logits)
    with pytest.raises(vitviz.errors.OptionError, match="trace= holds 3 images and x 2"):
        vitviz.readout(lens, x[:2], trace=trace)
    with pytest.raises(vitviz.errors.OptionError, match="trace= holds 3 images and x 2"):
        vitviz.logit_lens(lens, x[:2], trace=trace)
    with pytest.raises(PointNotKept):
        vitviz.readout(lens, x, trace=lens.trace(x, keep=["resid_post"]))

    calls = []
    real = Lens.trace
    monkeypatch.setattr(Lens, "trace", lambda self, *a, **k: calls.append(k) or real(self, *a, **k))
    batch = ReadoutWork()(lens, SimpleNamespace(x=x, names=["a", "b", "c"]))
    assert len(calls) == 1
    assert batch.lens is not None and len(batch.table) > 0


def test_head_names_rank_each_heads_classes_relative_to_its_mean_and_the_first_fill_a_grid():
    """Two layers x two heads, three classes: a head adding the same to every class names nothing in particular (its
    relative values are 0: the first by index), one adding most to class 2 in absolute terms but less than its mean to
    class 0 is named by class 2."""
    from vitviz.residual import first_names, names_table

    heads = np.array([[[1.0, 1.0, 1.0], [-3.0, 0.0, 6.0]],
                      [[2.0, 5.0, 2.0], [0.5, 0.25, 0.0]]])
    table = names_table(heads, ("cat", "dog", "cup"), k=2)
    first = table[table["rank"] == 1].set_index(["layer", "head"])
    assert first.loc[(0, 1), "label"] == "cup" and first.loc[(0, 1), "value"] == pytest.approx(6.0 - 1.0)
    assert first.loc[(1, 0), "label"] == "dog" and first.loc[(1, 0), "value"] == pytest.approx(5.0 - 3.0)
    assert first.loc[(1, 1), "label"] == "cat" and first.loc[(1, 1), "value"] == pytest.approx(0.5 - 0.25)
    assert first.loc[(0, 0), "label"] == "cat" and first.loc[(0, 0), "value"] == 0.0  # a tie: the lower class
    second = table[table["rank"] == 2].set_index(["layer", "head"])
    assert second.loc[(0, 1), "label"] == "dog"
    np.testing.assert_array_equal(first_names(table, 2, 2), np.array([["cat", "cup"], ["dog", "cat"]], dtype=object))
    np.testing.assert_array_equal(first_names(table[table["layer"] == 0], 2, 2),
                                  np.array([["cat", "cup"], ["", ""]], dtype=object))
