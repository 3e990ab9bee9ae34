"""MoRF, LeRF, insertion, the LXT summary, blur replacement and Chefer's positive/negative perturbation:
known answers on planted models, and each protocol recomputed by hand."""
import numpy as np
import pytest
import torch

from conftest import tiny_model
from vitviz.adapters import adapter_for
from test_faithfulness import GRID, KNOWN, KnownPatchModel, _independent_curve
from vitviz.perturbation.protocols import (BLUR_KERNEL, BLUR_SIGMA, SUMMARY, blurred, chefer_fractions,
                                           protocol_curves)


def _true_map():
    right = np.zeros(16)
    right[KNOWN] = [4, 3, 2, 1]
    return right.reshape(4, 4) + np.arange(16).reshape(4, 4) * -1e-3  # no ties: the orders are unambiguous


@pytest.mark.parametrize("head", [True, False], ids=["class probability", "pre-logits cosine"])
@pytest.mark.parametrize("replacement", ["mean", "blur"])
def test_morf_is_below_lerf_for_the_true_map_and_above_for_its_negation(head, replacement):
    model = KnownPatchModel(head).eval()
    torch.manual_seed(0)
    # The read patches bright on a dark background, so that their blurred copy reads much less than they do.
    image = 0.1 * torch.rand(3, 8, 8) + model.pixels
    true = _true_map()
    result = protocol_curves(model, image, {"true": true, "negated": -true}, GRID, replacement=replacement)
    aucs = result.aucs()
    assert aucs["morf"][0] < aucs["lerf"][0] and aucs["morf"][1] > aucs["lerf"][1]
    assert aucs[SUMMARY][0] > 0 > aucs[SUMMARY][1]
    np.testing.assert_allclose(aucs[SUMMARY], aucs["lerf"] - aucs["morf"])
    assert aucs["insertion"][0] > aucs["insertion"][1]
    assert result.replacement == replacement


def test_blur_is_rise_gaussian_with_replicated_edges():
    # A delta far from the edges becomes the outer product of the normalised 11-tap Gaussian, sigma 5.
    image = torch.zeros(3, 31, 31, dtype=torch.float64)
    image[:, 15, 15] = 1
    t = np.arange(BLUR_KERNEL) - BLUR_KERNEL // 2
    g = np.exp(-t ** 2 / (2 * BLUR_SIGMA ** 2))
    g /= g.sum()
    out = blurred(image).numpy()
    np.testing.assert_allclose(out[1, 10:21, 10:21], np.outer(g, g), atol=1e-15)
    assert abs(out[0].sum() - 1) < 1e-12  # nothing reaches the edges: mass kept
    constant = torch.full((3, 9, 7), 0.3, dtype=torch.float64)
    np.testing.assert_allclose(blurred(constant).numpy(), 0.3, atol=1e-15)  # replicated edges, not zeros


def test_protocols_equal_the_deletion_and_insertion_protocol_spelled_out():
    model = tiny_model("dino")
    torch.manual_seed(2)
    image = torch.randn(3, 64, 64)
    grid = np.random.default_rng(0).random((4, 4))  # no ties: LeRF of a map is MoRF of its negation
    fractions = np.array([0, 0.25, 0.5, 0.75, 1.0])
    layout = adapter_for(model).layout(model, (64, 64))
    result = protocol_curves(model, image, {"m": grid}, layout, fractions=fractions, batch_size=3)
    # The spelled-out protocol's cosine against a float32 model: a few ulps of 1 per forward (< 1e-5).
    np.testing.assert_allclose(result.curves["morf"][0],
                               _independent_curve(model, image, grid, layout, fractions, "deletion", None), atol=1e-5)
    np.testing.assert_allclose(result.curves["lerf"][0],
                               _independent_curve(model, image, -grid, layout, fractions, "deletion", None), atol=1e-5)
    np.testing.assert_allclose(result.curves["insertion"][0],
                               _independent_curve(model, image, grid, layout, fractions, "insertion", None), atol=1e-5)


class ThresholdModel(KnownPatchModel):
    """Two classes: logit 0 = (sum of the read pixels) - threshold, logit 1 = 0."""

    def __init__(self, threshold: float):
        super().__init__(head=True)
        self.threshold = threshold

    def forward_head(self, feats, pre_logits=False):
        if pre_logits:
            return super().forward_head(feats, pre_logits=True)
        return torch.cat([feats - self.threshold, torch.zeros_like(feats)], dim=1)


def _chefer_by_hand(values: np.ndarray, grid_map: np.ndarray, threshold: float, negative: bool) -> np.ndarray:
    """Top-1 agreement at 0, 0.1, ..., 0.9 for the threshold model in numpy: values (16,) per-patch pixel value."""
    order = list(np.argsort(-grid_map.ravel(), kind="stable"))
    order = order[::-1] if negative else order
    out = []
    for f in np.arange(10) / 10:
        removed = set(order[:int(np.floor(f * 16 + 0.5))])
        read = sum(12 * values[p] for p in KNOWN if p not in removed)  # 2x2 pixels x 3 channels per patch
        out.append(1.0 if read - threshold > 0 else 0.0)  # class 0 is the unperturbed top-1
    return np.array(out)


def test_chefer_positive_and_negative_perturbation_equal_numpy_by_hand():
    rng = np.random.default_rng(4)
    grid = _true_map()
    threshold = 14.0  # about 3 of the 4 read patches' 48 must stay for class 0
    accuracies = {"positive": [], "negative": []}
    aucs = {"positive": [], "negative": []}
    for _ in range(5):  # a set of five images
        values = rng.uniform(0.5, 1.5, 16)
        image = torch.from_numpy(np.repeat(np.repeat(values.reshape(4, 4), 2, 0), 2, 1)).float()[None].repeat(3, 1, 1)
        model = ThresholdModel(threshold).eval()
        result = protocol_curves(model, image, {"m": grid}, GRID, protocols=("positive", "negative"))
        for p in accuracies:
            expected = _chefer_by_hand(values, grid, threshold, p == "negative")
            np.testing.assert_array_equal(result.curves[p][0], expected)
            accuracies[p].append(expected)
            aucs[p].append(result.auc(p)[0])
        np.testing.assert_array_equal(result.fractions["positive"], chefer_fractions())
        assert result.target == 0
    for p in accuracies:
        accuracy = np.mean(accuracies[p], axis=0)  # top-1 accuracy over the set, per fraction
        set_auc = float(((accuracy[1:] + accuracy[:-1]) / 2 * 0.1).sum() * 100)  # trapezoid x 100 by hand
        assert abs(np.mean(aucs[p]) - set_auc) < 1e-9
    assert np.mean(aucs["positive"]) < np.mean(aucs["negative"])


def test_chefer_conventions_give_the_hand_derived_aucs():
    """Chefer's conventions on a tiny classifier, by hand. Input all ones; class 0 holds while at least 3 of the 4
    read patches remain (12 pixels each: 36 > 30 > 24); the map ranks the read patches first. k = round(16 f) halves
    up: 0, 2, 3, 5, 6, 8, 10, 11, 13, 14 patches at f = 0, 0.1, ..., 0.9.
    Positive (most relevant removed first): 2 read patches gone at f = 0.1 -> agreement 1, 0, 0, ... ->
    AUC = (1 + 0) / 2 x 0.1 x 100 = 5. Negative (least relevant first): the read patches are removed last, the first
    of them at k = 13 (3 remain, f = 0.8), the second at k = 14 (f = 0.9) -> 1 up to 0.8, then 0 ->
    AUC = (0.8 + 0.05) x 100 = 85. Leaving out the 0 % point would give 0 and 80, flooring k would give 15 and 85,
    positive = least relevant first would swap them."""
    model = ThresholdModel(30.0).eval()
    result = protocol_curves(model, torch.ones(3, 8, 8), {"m": _true_map()}, GRID, protocols=("positive", "negative"))
    np.testing.assert_array_equal(result.curves["positive"][0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(result.curves["negative"][0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
    assert result.auc("positive")[0] == pytest.approx(5.0, abs=1e-12)
    assert result.auc("negative")[0] == pytest.approx(85.0, abs=1e-12)


def test_chefer_perturbation_needs_a_head():
    with pytest.raises(ValueError, match="classifier head"):
        protocol_curves(KnownPatchModel(head=False).eval(), torch.ones(3, 8, 8), {"m": _true_map()}, GRID,
                        protocols=("positive",))


def test_blur_replacement_curves_equal_the_cosine_by_hand():
    model = KnownPatchModel(head=False).eval()
    torch.manual_seed(1)
    image = 0.1 * torch.rand(3, 8, 8) + model.pixels
    mask = model.pixels.bool()
    blur = blurred(image)

    def cosine(read):  # the planted model's pre-logits are (sum of the read pixels, 1)
        s0 = float(image[:, mask].sum())
        return (read * s0 + 1) / (np.hypot(read, 1) * np.hypot(s0, 1))

    result = protocol_curves(model, image, {"true": _true_map()}, GRID, replacement="blur",
                             fractions=np.array([0, 0.25, 1]))
    # At 0.25 the 4 read patches are exactly the first four: MoRF reads only their blurred copy, insertion only them.
    np.testing.assert_allclose(result.curves["morf"][0], [1, cosine(float(blur[:, mask].sum())),
                                                          cosine(float(blur[:, mask].sum()))], atol=1e-6)
    np.testing.assert_allclose(result.curves["insertion"][0], [cosine(float(blur[:, mask].sum())), 1, 1], atol=1e-6)


def test_perturbed_inputs_take_each_patch_from_the_image_or_the_replacement():
    from vitviz.perturbation.protocols import protocol_inputs, protocol_order

    image, base = torch.rand(3, 8, 8), torch.rand(3, 8, 8)
    grid = _true_map()
    first = np.zeros((8, 8), bool)
    for p in protocol_order(grid, "morf")[:3]:
        r, c = divmod(int(p), 4)
        first[2 * r:2 * r + 2, 2 * c:2 * c + 2] = True
    last = np.zeros((8, 8), bool)
    for p in protocol_order(grid, "morf")[-3:]:
        r, c = divmod(int(p), 4)
        last[2 * r:2 * r + 2, 2 * c:2 * c + 2] = True
    counts = np.array([3])
    for protocol, taken, from_image in (("morf", first, False), ("lerf", last, False), ("insertion", first, True)):
        x = protocol_inputs(image, base, protocol_order(grid, protocol), counts, GRID, protocol)[0]
        inside, outside = (image, base) if from_image else (base, image)
        assert torch.equal(x[:, torch.from_numpy(taken)], inside[:, torch.from_numpy(taken)]), protocol
        assert torch.equal(x[:, ~torch.from_numpy(taken)], outside[:, ~torch.from_numpy(taken)]), protocol


def test_what_the_model_saw_at_a_step_is_the_top_patches_removed_and_kept_alone():
    from vitviz.layout import TokenLayout
    from vitviz.perturbation.protocols import step_inputs

    # a 2 x 3 grid of 2 x 3-pixel patches; every pixel its own value, none zero
    layout = TokenLayout(prefix_tokens=("cls",), grid_size=(2, 3), patch_size=(2, 3), global_pool="token",
                         pos_embed_prefix_rows=1)
    image = torch.arange(1, 3 * 4 * 9 + 1, dtype=torch.float32).reshape(3, 4, 9)
    grid_map = np.array([[0.1, 0.9, 0.2], [0.3, 0.05, 0.8]])  # most relevant first: patches 1, 5, 3, ...
    deletion, insertion = step_inputs(image, grid_map, 2, layout, "mean").numpy()
    top = np.zeros((4, 9), bool)
    top[0:2, 3:6] = True  # patch 1: row 0, column 1
    top[2:4, 6:9] = True  # patch 5: row 1, column 2
    np.testing.assert_array_equal(deletion, np.where(top, 0.0, image.numpy()))  # "mean" of a normalised input is 0
    np.testing.assert_array_equal(insertion, np.where(top, image.numpy(), 0.0))
