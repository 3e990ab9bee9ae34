"""CLIP's text tower: lens.encode_text, vitviz.TextTarget (every target-taking map method and the direct readout) and
TextSpan, on a tiny random CLIPModel saved with its tokenizer (tests/tiny_clip.py; no download).

References come from transformers' own CLIPModel built from the same folder: ``get_text_features``,
``logits_per_image``; TextSpan's from a head planted to write one text's direction.
"""
import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import vitviz  # noqa: E402
from tiny_clip import plant_text_head, save_tiny_clip, tiny_clip  # noqa: E402
from vitviz.explainers import MethodError, names  # noqa: E402
from vitviz.residual.textspan import descriptions, text_span  # noqa: E402
from vitviz.sources.text import TextNotAvailable, TextTower  # noqa: E402

TEXTS = ["a photo of a dog", "a red cat", "two boats on the sea"]
EPS32 = float(torch.finfo(torch.float32).eps)
EPS64 = float(torch.finfo(torch.float64).eps)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="module")
def lens(clip_folder):
    return vitviz.open(clip_folder)


@pytest.fixture(scope="module")
def reference(clip_folder):
    """transformers' own CLIPModel and tokenizer from the folder: vitviz is not involved."""
    model = transformers.CLIPModel.from_pretrained(clip_folder, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(clip_folder)


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(3)
    return torch.randn(4, 3, 32, 32)


def logits_per_image(reference, x, texts) -> torch.Tensor:
    model, tokenizer = reference
    tokens = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                     pixel_values=x.to(model.dtype)).logits_per_image


def test_encode_text_is_transformers_text_features_normalised(lens, reference):
    model, tokenizer = reference
    with torch.no_grad():
        features = model.get_text_features(**tokenizer(TEXTS, padding=True, return_tensors="pt")).pooler_output
    expected = features / features.norm(dim=-1, keepdim=True)
    got = lens.encode_text(TEXTS)
    assert got.shape == (3, 16)
    # one float32 forward of the same modules in both; padding is masked, so batch size does not matter
    torch.testing.assert_close(got, expected, rtol=0, atol=100 * EPS32)
    assert not torch.allclose(got[0], got[1], atol=1e-3)  # distinct texts, distinct embeddings
    assert lens.text_scale == pytest.approx(float(model.logit_scale.detach().exp()), rel=EPS32)
    assert lens.has_text and "text tower" in lens.label


def test_vision_only_model_says_there_is_no_text(tmp_path, lens):
    model, _ = tiny_clip()
    model.vision_model.save_pretrained(tmp_path)
    vision = vitviz.open(str(tmp_path))
    assert not vision.has_text
    with pytest.raises(TextNotAvailable, match="has no text tower: open a whole CLIP model"):
        vision.encode_text("a dog")
    with pytest.raises(TextNotAvailable, match="no text tower"):
        vitviz.explain(vision, torch.zeros(1, 3, 32, 32), "gradcam", target=vitviz.TextTarget("a dog"))
    with pytest.raises(TextNotAvailable, match="no text tower"):
        vitviz.textspan(vision, torch.zeros(2, 3, 32, 32))


def test_siglip_text_is_refused_with_a_sentence(tmp_path, images):
    """A whole SigLIP folder opens as its vision tower; text, TextSpan and the readout are refused in words."""
    config = transformers.SiglipConfig(
        text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8))
    transformers.SiglipModel(config).save_pretrained(tmp_path)
    siglip = vitviz.open(str(tmp_path))
    with pytest.raises(TextNotAvailable, match="does not read SigLIP's text tower yet"):
        siglip.encode_text("a dog")
    with pytest.raises(TextNotAvailable, match="SigLIP's text tower"):
        vitviz.explain(siglip, images, "attnlrp", target=vitviz.TextTarget("a dog"))
    with pytest.raises(vitviz.ReadoutNotApplicable, match="attention head"):
        vitviz.readout(siglip, images, target=vitviz.TextTarget("a dog"))
    assert vitviz.explain(siglip, images, "attnlrp").patches.shape == (4, 4, 4)  # its vision tower still explains


def test_no_text_is_refused_with_a_sentence(lens):
    with pytest.raises(TextNotAvailable, match="at least one text"):
        vitviz.TextTarget([])
    with pytest.raises(TextNotAvailable, match="none of them empty"):
        lens.encode_text(["a dog", " "])


def test_folder_without_tokenizer_says_so(tmp_path):
    lens = vitviz.open(save_tiny_clip(tmp_path, tokenizer=False))
    with pytest.raises(TextNotAvailable, match="no tokenizer saved with it"):
        lens.encode_text(["a dog"])


def test_readout_of_a_text_adds_up_to_transformers_logits_per_image(lens, reference, images):
    expected = logits_per_image(reference, images, TEXTS[:1])[:, 0].double().numpy()
    r = vitviz.readout(lens, images, target=vitviz.TextTarget(TEXTS[0]))
    scale = (np.abs(r.embed) + np.abs(r.heads).sum((1, 2)) + np.abs(r.attn_bias).sum(1) + np.abs(r.mlp).sum(1)
             + np.abs(r.bias))
    # float32 forwards (vitviz's and transformers') and a float32 gradient summed in float64: rounding of the order
    # of eps32 times the magnitudes that are summed, over a few dozen terms
    np.testing.assert_allclose(r.total, expected, rtol=0, atol=float((100 * EPS32 * scale).max()))
    np.testing.assert_allclose(r.parts_sum, expected, rtol=0, atol=float((100 * EPS32 * scale).max()))
    assert np.abs(r.heads).max() > 100 * EPS32 * scale.max()  # the heads do write something to split
    assert 'score of "a photo of a dog"' in r.target.text()


def test_readout_of_a_text_in_float64_is_exact_to_rounding(lens, reference, clip_folder, images):
    """A float64 copy of the model: the split agrees with transformers' float64 score to float64 rounding, which a
    float32 copy cannot show. transformers' eager attention takes its softmax in float32 even for a float64 model, so
    the image side of the reference runs its SDPA attention (float64 throughout); the text side is the same eager
    text model vitviz's text tower runs. The score is then CLIPModel.forward's own formula on the two embeddings."""
    full = copy.deepcopy(lens.loaded.text.model).double()
    loaded = replace(lens.loaded, model=full.vision_model, text=TextTower(full, lens.loaded.text.tokenizer, "copy"),
                     dtype=torch.float64)
    lens64 = vitviz.Lens(loaded)
    vision64 = transformers.CLIPModel.from_pretrained(clip_folder, attn_implementation="sdpa").eval().double()
    text64 = copy.deepcopy(reference[0]).double()
    x = images.double()
    with torch.no_grad():
        image = vision64.get_image_features(pixel_values=x).pooler_output
        text = text64.get_text_features(**reference[1](TEXTS[1:2], return_tensors="pt")).pooler_output
        cosine = (image / image.norm(dim=-1, keepdim=True)) @ (text / text.norm(dim=-1, keepdim=True)).T
        expected = (text64.logit_scale.exp() * cosine)[:, 0].numpy()
    r = vitviz.readout(lens64, x, target=vitviz.TextTarget(TEXTS[1]))
    scale = (np.abs(r.embed) + np.abs(r.heads).sum((1, 2)) + np.abs(r.attn_bias).sum(1) + np.abs(r.mlp).sum(1)
             + np.abs(r.bias))
    np.testing.assert_allclose(r.parts_sum, expected, rtol=0, atol=float((1000 * EPS64 * scale).max()))
    np.testing.assert_allclose(r.total, expected, rtol=0, atol=float((1000 * EPS64 * scale).max()))


def test_readout_refuses_to_be_live(lens, images):
    """A live norm is not linear in the pooled vector: the readout freezes it (same total, parts still add up)."""
    frozen = vitviz.readout(lens, images, target=vitviz.TextTarget(TEXTS[0]))
    live = vitviz.readout(lens, images, target=vitviz.TextTarget(TEXTS[0], live=True))
    assert live.target.live is False
    np.testing.assert_array_equal(live.heads, frozen.heads)


TARGET_METHODS = ("attnlrp", "cp-lrp", "gradient", "integrated_gradients", "legrad", "gradcam", "occlusion")


def test_every_target_method_explains_a_text_at_transformers_score(lens, reference, images):
    applicable = names(lens, kinds=("relevance", "perturbation"))
    assert set(TARGET_METHODS) <= set(applicable)
    expected = logits_per_image(reference, images, TEXTS).double().numpy()  # (B, T)
    best = expected.argmax(1)
    for method in applicable:
        options = {"steps": 4} if method == "integrated_gradients" else {}
        m = vitviz.explain(lens, images, method, target=vitviz.TextTarget(TEXTS), **options)
        assert m.patches.shape == (4, 4, 4) and np.isfinite(m.patches).all(), method
        assert list(m.target.chosen) == list(best), method
        np.testing.assert_allclose(m.target_value, expected[np.arange(4), best], rtol=0,
                                   atol=100 * EPS32 * np.abs(expected).max(), err_msg=method)
        assert m.settings["target"]["kind"] == "text"


def test_methods_without_a_target_refuse_with_a_sentence(lens, images):
    with pytest.raises(MethodError, match="classifier head"):
        vitviz.explain(lens, images, "gradient_rollout", target=vitviz.TextTarget("a dog"))


def test_relevance_of_a_text_is_conserved_at_the_pooled_vector(lens, images):
    """With the norm frozen the score is linear in the pooled vector, so Gradient x Input there gives back the score
    (a live cosine gives zero: it is scale-invariant)."""
    from vitviz.adapters import run

    for live, expect_zero in ((False, False), (True, True)):
        target = vitviz.TextTarget(TEXTS[0], live=live).for_lens(lens)
        with torch.enable_grad():
            points = run(lens.model, images, keep=("pooled",))
            pooled = points["pooled"].detach().requires_grad_(True)
            bound = target.bind({"pooled": pooled})
            score = bound({"pooled": pooled})
            (grad,) = torch.autograd.grad(score.sum(), pooled)
        gxi = (grad * pooled).sum(-1).detach()
        expected = torch.zeros_like(score) if expect_zero else score.detach()
        torch.testing.assert_close(gxi, expected, rtol=0, atol=100 * EPS32 * float(score.detach().abs().max()))


def test_live_occlusion_drops_are_transformers_scores_of_the_occluded_images(lens, reference, images):
    from vitviz.perturbation.curves import pixel_masks
    from vitviz.perturbation.protocols import replacement_of

    x = images[:1]
    m = vitviz.explain(lens, x, "occlusion", target=vitviz.TextTarget(TEXTS[2], live=True))
    grid = np.zeros((1, 4, 4), dtype=bool)
    grid[0, 1, 2] = True
    mask = torch.from_numpy(pixel_masks(grid, lens.layout_for(x), (32, 32)))[:, None]
    occluded = torch.where(mask, replacement_of(x[0], "mean")[None], x)
    scores = logits_per_image(reference, torch.cat([x, occluded]), TEXTS[2:3])[:, 0].double().numpy()
    assert m.patches[0, 1, 2] == pytest.approx(scores[0] - scores[1], abs=100 * EPS32 * abs(scores).max())


def test_text_span_picks_the_direction_that_explains_most_variance():
    """Writes along e1, e2, e3 with variances 4, 1, 0.5 (uncorrelated over the sample). Texts: e1, 2e1 + e2 and e3.
    e1 first (4 / 5.5 of the variance); what is left of 2e1 + e2 is e2 at a fifth of its length, and read at unit
    length it explains 1 / 5.5, more than e3's 0.5 / 5.5 (its raw projection would lose to e3); then e3. The images'
    common write (the mean) is not variance."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((400, 3)))  # orthonormal columns: uncorrelated, zero mean after centring
    q = q - q.mean(0)
    q, _ = np.linalg.qr(q)
    C = q * np.sqrt(400 * np.array([4.0, 1.0, 0.5])) + np.array([0, 50.0, 0])  # a mean along e2 is no variance
    texts = np.array([[0, 0, 1.0], [2.0, 1.0, 0], [1.0, 0, 0]])
    picks = text_span(C, texts, k=3)
    assert [j for j, _ in picks] == [2, 1, 0]
    np.testing.assert_allclose([share for _, share in picks], np.array([4, 1, 0.5]) / 5.5, rtol=0, atol=1e-9)


def test_text_span_with_rank_reads_texts_inside_the_writes_top_directions():
    """rank=1: every text is projected on the writes' first principal direction (e1 here), so the first pick explains
    e1's share whichever text it is, and nothing is left of the others for a second pick."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((200, 3)))
    q = q - q.mean(0)
    q, _ = np.linalg.qr(q)
    C = q * np.sqrt(200 * np.array([4.0, 1.0, 0.5]))
    texts = np.array([[0, 1.0, 0], [0.1, 0, 1.0], [0, 0, 1.0]])
    picks = text_span(C, texts, k=3, rank=1)
    assert [j for j, _ in picks] == [1] and picks[0][1] == pytest.approx(4 / 5.5, abs=1e-9)
    assert [j for j, _ in text_span(C, texts, k=1)] == [0]  # without rank: e2 (variance 1) beats 0.1 e1 + e3


def test_textspan_names_the_planted_text_first_for_the_planted_head(tmp_path, images):
    model, tokenizer = tiny_clip()
    pool = descriptions()[:40]
    planted_text = pool[17]
    with torch.no_grad():
        features = model.get_text_features(**tokenizer([planted_text], return_tensors="pt")).pooler_output[0]
    plant_text_head(model, layer=2, head=1, direction=features / features.norm())
    lens = vitviz.open(save_tiny_clip(tmp_path / "planted", model=model))
    torch.manual_seed(5)
    x = torch.randn(24, 3, 32, 32)
    table = vitviz.textspan(lens, x, texts=pool, layers=2, k=3)
    assert list(table.columns) == ["layer", "head", "rank", "text", "variance_explained", "head_variance"]
    assert sorted(set(table.layer)) == [1, 2] and len(table) == 2 * 4 * 3
    first = table[(table["rank"] == 1)].set_index(["layer", "head"])
    assert first.loc[(2, 1), "text"] == planted_text
    assert first.loc[(2, 1), "variance_explained"] > 1 - 1e-6  # every write of that head lies along the text
    # the unplanted heads are not explained by one text
    others = first.drop(index=(2, 1))
    assert (others["variance_explained"] < 0.99).all()
    shares = table.groupby(["layer", "head"])["variance_explained"].sum()
    assert (shares <= 1 + 1e-9).all()


def test_textspan_needs_an_image_set_and_known_layers(lens, images):
    with pytest.raises(vitviz.VitvizError, match="at least 2 images"):
        vitviz.textspan(lens, images[:1])
    with pytest.raises(vitviz.VitvizError, match="from 1 to 3"):
        vitviz.textspan(lens, images, layers=5)
    with pytest.raises(vitviz.VitvizError, match="from 0 to 2"):
        vitviz.textspan(lens, images, layers=[7])


def test_description_pool_covers_its_kinds():
    pool = descriptions()
    assert len(pool) == len(set(pool)) >= 150
    for word in ("dog", "red", "wood", "striped", "round", "two", "left", "beach", "painting"):
        assert any(word in text for text in pool), word


# ------------------------------------------------------------------------- the documented lines (docs/guide/clip.md)

HUB_ID = "hf:openai/clip-vit-base-patch32"


def _readme_clip_python() -> str:
    import re

    from conftest import ASSETS

    section = (ASSETS.parent / "docs" / "guide" / "clip.md").read_text()
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_clip_line_offline_says_why(tmp_path, monkeypatch, capsys, network_calls):
    """The hub line typed offline (the hub off, every connection refused): exit 2, one sentence, nothing written."""
    from PIL import Image

    from conftest import ASSETS, readme_command
    from vitviz.cli import main

    monkeypatch.chdir(tmp_path)
    Image.open(ASSETS / "chelsea.jpg").convert("RGB").save("photo.jpg")
    args = readme_command(".venv/bin/python -m vitviz analyze photo.jpg --model hf:openai/clip-vit-base-patch32", None)
    assert main(args[2:]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "could not be loaded" in err and "hub cannot be reached" in err, err
    assert not (tmp_path / "clip" / "analysis.npz").exists()


def test_the_readme_clip_line_runs_on_a_saved_clip_folder(tmp_path, monkeypatch, clip_folder):
    """The same line with the hub id swapped for a saved CLIPModel folder (the only change): the maps are written."""
    from PIL import Image

    from conftest import ASSETS, readme_command
    from vitviz.cli import main

    monkeypatch.chdir(tmp_path)
    Image.open(ASSETS / "chelsea.jpg").convert("RGB").save("photo.jpg")
    line = readme_command(".venv/bin/python -m vitviz analyze photo.jpg --model hf:openai/clip-vit-base-patch32", None)
    args = [clip_folder if a == HUB_ID else a for a in line]
    assert main(args[2:]) == 0
    saved = np.load(tmp_path / "clip" / "analysis.npz")
    assert saved["attribution_attnlrp"].shape == (1, 4, 4) and saved["attribution_legrad"].shape == (1, 4, 4)


def test_the_readme_clip_python_runs_on_a_saved_clip_folder(monkeypatch, clip_folder):
    """The CLIP Python lines of docs/guide/clip.md, run from the repository root with the hub id swapped for a saved CLIPModel
    folder (the only change)."""
    from conftest import ASSETS

    code = _readme_clip_python()
    assert HUB_ID in code
    monkeypatch.chdir(ASSETS.parent)
    scope = {}
    exec(compile(code.replace(HUB_ID, clip_folder), "docs/guide/clip.md", "exec"), scope)
    assert tuple(scope["t"].shape) == (2, 16)
    assert scope["m"].patches.shape == (2, 4, 4)
    assert scope["r"].total.shape == (2,)
    spans = scope["spans"]
    assert len(spans) == 3 * 4 * 3 and spans["variance_explained"].between(0, 1).all()


def test_the_readme_clip_readout_line_splits_transformers_score_on_a_saved_clip_folder(tmp_path, monkeypatch,
                                                                                      clip_folder, reference):
    """`readout --text` with the hub id swapped for a saved CLIPModel folder: per image the parts add up to
    transformers' logits_per_image for that text (float32: 100 eps32 of the summed magnitudes)."""
    import pandas as pd
    from PIL import Image

    from conftest import ASSETS, readme_command
    from vitviz.cli import main

    monkeypatch.chdir(tmp_path)
    Image.open(ASSETS / "chelsea.jpg").convert("RGB").save("photo.jpg")
    line = readme_command(".venv/bin/python -m vitviz readout photo.jpg --model hf:openai/clip-vit-base-patch32",
                          None)
    args = [clip_folder if a == HUB_ID else a for a in line]
    assert main(args[2:]) == 0
    table = pd.read_parquet(tmp_path / "clip-readout" / "readout.parquet")
    assert not (tmp_path / "clip-readout" / "logit_lens.parquet").exists()
    lens = vitviz.open(clip_folder, device="cpu")
    x = lens.preprocess(["photo.jpg"])
    score = logits_per_image(reference, x.tensor, ["a photo of a cat"])[0, 0]
    magnitude = table.value.abs().sum()
    assert abs(table.value.sum() - float(score)) <= 100 * 1.2e-7 * magnitude
    assert main(["readout", "photo.jpg", "--model", clip_folder, "--text", "a cat", "--target", "1", "--out",
                 str(tmp_path / "both")]) == 2


def test_a_latents_nearest_descriptions_read_its_direction_through_clips_own_norm_and_projection(clip_folder):
    """Each description's readout direction equals P (γ ⊙ Wᵀt) / σ_ref computed from transformers' post_layernorm
    (γ, eps) and visual_projection (W) in float64 (P centres; σ_ref the reference token's spread): the CLS token is
    the one the head reads. A latent whose decoder row is one text's direction names that text first."""
    from vitviz.features.classes import nearest_descriptions, text_directions
    from vitviz.features.sae import SAE

    lens64 = vitviz.open(clip_folder, device="cpu")
    lens64 = vitviz.Lens(replace(lens64.loaded, model=copy.deepcopy(lens64.model).double(), dtype=torch.float64))
    texts = ["a red car", "a green tree", "three dogs", "a wooden table"]
    ref = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = text_directions(lens64, ref, texts).numpy()
    model, _ = transformers.CLIPModel.from_pretrained(clip_folder).eval(), None
    ln = model.vision_model.post_layernorm
    gamma, eps = ln.weight.detach().double().numpy(), ln.eps
    W = model.visual_projection.weight.detach().double().numpy()  # (P, D)
    t = lens64.encode_text(texts).double().numpy()
    r = ref.numpy()
    sigma = np.sqrt(((r - r.mean()) ** 2).mean() + eps)
    raw = (t @ W) * gamma / sigma  # (T, D)
    expected = raw - raw.mean(-1, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12 * np.abs(expected).max())
    sae = SAE.fit(torch.randn(64, 32), latents=4, topk=1, seed=0, epochs=1)
    with torch.no_grad():
        sae.W_dec[1] = torch.as_tensor(expected[2], dtype=sae.W_dec.dtype) * sae.W_dec[1].norm() / np.linalg.norm(expected[2])
    sae.info["point_kind"] = "resid_post"
    table = nearest_descriptions(lens64, sae, [1], n=2, texts=texts)
    assert table["text"].iloc[0] == "three dogs"
