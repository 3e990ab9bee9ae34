"""Concepts painted on patches (vitviz.probes.concepts): the labelling rule, the hold-out groups, a planted concept
found from its block on and mapped on the planted patches, the maps against scikit-learn's own probabilities, and
ConceptTarget against a hand-written probe through AttnLRP and every map method of the registry."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz
from vitviz.explainers.rules import AttnLRP
from vitviz.lens import Lens
from vitviz.probes.concepts import (ConceptError, ConceptTarget, PaintedImages, _probe, fit_concept, folds_of,
                                    patch_labels, read_concept)

from test_probes import noise_images, tiny_lens

GRID = 8  # 64 px, 8 px patches
BLOCK = 2  # the plant's block, 0-based: layers 1-2 (1-based) know nothing of it, layers 3-5 carry it


# --- the rule and the groups ---------------------------------------------------------------------------------

def test_patch_labels_follow_the_stated_rule():
    c = np.array([1, 1, 0, 0, 0, 0], bool)
    n = np.array([0, 0, 1, 0, 0, 0], bool)
    assert patch_labels(c, None, 6).tolist() == [1, 1, 0, 0, 0, 0]  # concept only: the rest is not concept
    assert patch_labels(c, n, 6).tolist() == [1, 1, 0, -1, -1, -1]  # not-concept painted: the rest left out
    assert patch_labels(None, n, 6).tolist() == [-1, -1, 0, -1, -1, -1]
    assert patch_labels(None, None, 6).tolist() == [-1] * 6  # nothing painted: maps only
    painted = PaintedImages.of(["a", "b"], [c.reshape(2, 3), None], [c.reshape(2, 3), None])
    with pytest.raises(ConceptError, match="a: a patch is painted both concept and not concept"):
        painted.labels((2, 3))
    with pytest.raises(ConceptError, match="no patch is painted as concept"):
        PaintedImages.of(["a"], [None], [n]).labels((2, 3))
    with pytest.raises(ConceptError, match="b: its concept mask has 4 patches; the model's grid has 2x3 = 6"):
        PaintedImages.of(["a", "b"], [c, np.ones(4, bool)]).labels((2, 3))


def test_one_painted_image_is_held_out_in_2x2_blocks_and_several_by_image():
    labels = np.zeros((2, 16), np.int8)
    labels[1] = -1  # the second image is not painted
    holdout, groups, folds = folds_of(labels, (4, 4))
    assert holdout == "blocks" and folds == 4
    assert groups.tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    labels[1, :3] = 0
    holdout, groups, folds = folds_of(labels, (4, 4))
    assert holdout == "images" and folds == 2 and groups.tolist() == [0] * 16 + [1] * 3


# --- the planted concept ---------------------------------------------------------------------------------------

class PlantedPatchLens(Lens):
    """Test only: ``direction`` is added at block ``block`` (0-based, its ``resid_post``) to the tokens of each image's
    planted patches, through ``edit=``. Images are recognised by their pixels, planted patches are drawn at random
    per image: nothing before the block tells them from the others (not the content, not the position)."""

    def __init__(self, loaded, block: int, direction: torch.Tensor, planted: dict):
        super().__init__(loaded)
        object.__setattr__(self, "plant", (block, direction, planted))

    def trace(self, x, keep=("attn",), edit=None, **kw):
        block, direction, planted = self.plant
        tensor = x.tensor if hasattr(x, "tensor") else x
        masks = torch.stack([torch.as_tensor(planted[t.numpy().tobytes()]).reshape(-1) for t in tensor]).float()
        npt = self.layout.num_prefix_tokens

        def add(value, point):
            return torch.cat([value[:, :npt], value[:, npt:] + masks[:, :, None] * direction], dim=1)

        return super().trace(x, keep=keep, edit={f"blocks.{block}.resid_post": add, **(edit or {})}, **kw)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    base = tiny_lens(3, depth=5, img_size=64, patch_size=8)
    paths = noise_images(tmp_path_factory.mktemp("concepts"), 7, 4, size=64)
    rng = np.random.default_rng(0)
    masks = []
    for _ in paths:
        m = np.zeros(GRID * GRID, bool)
        m[rng.choice(GRID * GRID, 16, replace=False)] = True
        masks.append(m.reshape(GRID, GRID))
    keys = [t.numpy().tobytes() for t in base.preprocess(paths).tensor]
    direction = torch.randn(base.model.embed_dim, generator=torch.Generator().manual_seed(1))
    direction = 4 * direction / direction.norm() * np.sqrt(base.model.embed_dim)
    lens = PlantedPatchLens(base.loaded, BLOCK, direction, dict(zip(keys, masks)))
    # the last two images are not painted: the maps must find their planted patches
    painted = PaintedImages.of(paths, masks[:5] + [None, None])
    return lens, base, paths, masks, fit_concept(lens, painted)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


@pytest.mark.slow
def test_a_planted_concept_is_at_chance_before_its_block_readable_from_it_and_mapped_on_its_patches(planted):
    lens, _, _, masks, concept = planted
    balanced = [s.balanced_accuracy for s in concept.layers]
    assert concept.holdout == "images" and [s.layer for s in concept.layers] == [1, 2, 3, 4, 5]
    # chance is 0.5: 80 concept and 240 not-concept patches give a standard deviation of 0.032; 0.15 is 4.7 of them
    assert all(abs(b - 0.5) <= 0.15 for b in balanced[:BLOCK]), balanced
    assert all(b >= 0.95 for b in balanced[BLOCK:]), balanced
    assert concept.readable_from(0.95) == BLOCK + 1
    assert concept.probability.shape == (7, 5, GRID, GRID) and concept.chance == 0.75
    for i in (5, 6):  # never painted: the probe's map on them is a prediction
        for layer in range(BLOCK, 5):
            assert iou(concept.probability[i, layer] > 0.5, masks[i]) >= 0.9, (i, layer)
        assert iou(concept.probability[i, 0] > 0.5, masks[i]) < 0.5


@pytest.mark.slow
def test_the_maps_are_sklearns_probabilities_of_a_probe_fitted_on_the_painted_patches(planted):
    lens, _, paths, masks, concept = planted
    tokens = lens.trace(lens.preprocess(paths), keep=[("resid_post", 3)])["resid_post", 3][:, 1:].double().numpy()
    labels = concept.labels
    X, y = tokens[labels >= 0], labels[labels >= 0]
    reference = _probe(concept.C, 0).fit(X, y).predict_proba(tokens.reshape(-1, tokens.shape[-1]))[:, 1]
    np.testing.assert_allclose(concept.probability[:, 3].reshape(-1), reference, rtol=1e-4, atol=1e-5)
    assert concept.images[0]["concept"] == 16 and concept.images[5] == {**concept.images[5], "concept": 0,
                                                                        "left_out": 64}


# --- the concept as an attribution target ---------------------------------------------------------------------

def _hand_written(pipeline, tokens: torch.Tensor) -> torch.Tensor:
    """The probe written out from scikit-learn's fitted pipeline: (B, N, D) -> (B, P) logits."""
    scaler, logistic = pipeline[0], pipeline[-1]
    mean, scale = (torch.as_tensor(v, dtype=tokens.dtype) for v in (scaler.mean_, scaler.scale_))
    coef, intercept = (torch.as_tensor(v, dtype=tokens.dtype) for v in (logistic.coef_[0], logistic.intercept_[0]))
    return ((tokens[:, 1:] - mean) / scale) @ coef + intercept


@pytest.mark.slow
def test_concept_target_through_attnlrp_equals_attnlrp_of_the_hand_written_probe(planted):
    lens, base, paths, masks, concept = planted
    layer = 4  # 1-based: blocks.3.resid_post
    tokens = lens.trace(lens.preprocess(paths), keep=[("resid_post", layer - 1)])["resid_post", layer - 1]
    labels = concept.labels
    pipeline = _probe(concept.C, 0).fit(tokens[:, 1:].double().numpy()[labels >= 0], labels[labels >= 0])
    x = base.preprocess(paths[:2]).tensor  # the plain model: the target is the probe, not the plant
    for patch in (None, 10):
        target = ConceptTarget(concept, layer, patch=patch)
        m = vitviz.explain(base, x, "attnlrp", target=target)
        xr = x.clone().requires_grad_(True)
        with torch.enable_grad():
            t = base.trace(xr, keep=[f"blocks.{layer - 1}.resid_post"], grad=True,
                           rules=AttnLRP())[f"blocks.{layer - 1}.resid_post"]
            logits = _hand_written(pipeline, t.double())
            value = logits.sum(1) if patch is None else logits[:, patch]
            (grad,) = torch.autograd.grad(value.sum(), xr)
        np.testing.assert_allclose(m.target_value, value.detach().numpy(), rtol=1e-4)
        expected = (xr * grad).sum(1).detach().double().numpy()
        np.testing.assert_allclose(m.pixels, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
    assert target.describe()["layer"] == 4 and target.point == "blocks.3.resid_post"


@pytest.mark.slow
def test_every_registry_method_explains_a_concept_or_says_why_not(planted):
    _, base, paths, _, concept = planted
    x = base.preprocess(paths[:1]).tensor
    target = ConceptTarget(concept, 3)
    value = float(target(base.trace(x, keep=[target.point])))
    explained, refused = [], []
    for row in vitviz.methods(base):
        name = row["name"]
        if row["kind"] not in ("relevance", "perturbation"):
            continue  # attention maps and the random floor explain no target
        options = {"steps": 8} if name == "integrated_gradients" else {}
        try:
            m = vitviz.explain(base, x, name, target=target, **options)
        except vitviz.VitvizError as exc:
            refused.append((name, str(exc)))
            continue
        explained.append(name)
        assert m.patches.shape == (1, GRID, GRID)
        if m.target_value is not None:
            np.testing.assert_allclose(m.target_value, [value], rtol=1e-4)
    assert set(explained) >= {"attnlrp", "cp-lrp", "gradient", "integrated_gradients", "occlusion"}
    assert {n for n, _ in refused} == {"legrad", "gradcam", "gradient_rollout"}
    said = dict(refused)
    assert said["legrad"].startswith("LeGrad cannot explain painted concept's logit at layer 3")
    assert said["gradcam"].startswith("Grad-CAM cannot explain painted concept's logit at layer 3")
    # at the last layer Grad-CAM's block is the concept's: it explains it
    assert vitviz.explain(base, x, "gradcam", target=ConceptTarget(concept, 5)).patches.shape == (1, GRID, GRID)
    with pytest.raises(ConceptError, match="layer 6 is not a layer of this concept probe: its layers are 1 to 5"):
        ConceptTarget(concept, 6)


def test_a_saved_concept_is_read_back_and_refused_as_a_head(tmp_path):
    from vitviz.errors import ModelError
    from vitviz.probes import read_probe
    from vitviz.probes.concepts import ConceptProbe

    rng = np.random.default_rng(0)
    probe = ConceptProbe({"name": "m"}, 1, (2, 2), [], rng.normal(size=(3, 4)), rng.normal(size=3), "blocks",
                         [{"name": "a"}], np.zeros((1, 4), np.int8), rng.random((1, 3, 2, 2)).astype(np.float32))
    path = probe.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["concept_maps.npz", "probe.json", "probe.safetensors"]
    back = read_concept(path)
    np.testing.assert_allclose(back.weight, probe.weight, rtol=1e-6) and np.testing.assert_allclose(back.bias, probe.bias, rtol=1e-6)
    assert back.num_prefix_tokens == 1 and back.grid_size == (2, 2)
    tokens = torch.as_tensor(rng.normal(size=(2, 5, 4)))
    target = ConceptTarget(str(path), 2)
    expected = (tokens[:, 1:] @ torch.as_tensor(probe.weight[1]) + probe.bias[1]).sum(1)
    np.testing.assert_allclose(target({"blocks.1.resid_post": tokens}).numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(np.load(tmp_path / "concept_maps.npz")["probability"], probe.probability)
    with pytest.raises(ModelError, match="is a patch probe of a painted concept"):
        read_probe(path)


@pytest.mark.slow
def test_the_readme_concept_example_runs_on_the_bundled_model(bundled, monkeypatch):
    root = Path(__file__).resolve().parent.parent
    section = (root / "docs" / "guide" / "probes.md").read_text().split("## Concepts painted on the image")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    monkeypatch.chdir(root)  # the example's paths are the repository's assets/
    exec(compile(code, "docs/guide/probes.md", "exec"), scope)
    concept, m = scope["concept"], scope["m"]
    assert [r["layer"] for r in concept.table] == list(range(1, 13)) and concept.holdout == "blocks"
    assert concept.probability.shape == (2, 12, 16, 16) and m.patches.shape == (1, 16, 16)
    assert m.settings["target"]["kind"] == "concept" and m.settings["target"]["layer"] == 8
