"""An ablation's effects as one picture: the mean over images, 1 − cosine without a classifier, the strongest head."""
import numpy as np

from vitviz.heads.ablation_summary import summarise_ablation
from vitviz.heads.patching import Effects


def _effects(kind: str, table: dict) -> Effects:
    return Effects([(i, l, h, kind, e) for (i, l, h), e in table.items()])


def test_logit_changes_are_averaged_over_images_and_the_largest_magnitude_wins():
    # layer 1 (0-based) of a 2 x 3 model, two images; head 2's mean is −4, the largest in magnitude
    table = {(0, 1, 0): 1.0, (1, 1, 0): 3.0, (0, 1, 1): -1.0, (1, 1, 1): 2.0, (0, 1, 2): -5.0, (1, 1, 2): -3.0}
    pairs = [(1, 0), (1, 1), (1, 2)]
    s = summarise_ablation(_effects("logit_change", table), True, 2, 3, 2, pairs)
    assert s.kind == "logit_change" and s.grids.shape == (2, 2, 3)
    np.testing.assert_array_equal(s.values[1], [2.0, 0.5, -4.0])
    assert np.isnan(s.values[0]).all()  # layer 0 was not ablated
    assert s.strongest == (1, 2)


def test_without_a_classifier_the_effect_is_one_minus_the_mean_cosine():
    table = {(0, 0, 0): 0.5, (0, 0, 1): 0.875, (0, 1, 0): 1.0, (0, 1, 1): 0.75}
    pairs = [(0, 0), (0, 1), (1, 0), (1, 1)]
    s = summarise_ablation(_effects("pooled_cosine", table), False, 2, 2, 1, pairs)
    np.testing.assert_array_equal(s.values, [[0.5, 0.125], [0.0, 0.25]])
    assert s.kind == "pooled_cosine" and s.strongest == (0, 0)

