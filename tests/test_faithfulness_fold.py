"""fold_random_seeds: a run's seeded random maps become one "random" row, as the Faithfulness page shows them."""
import numpy as np

from vitviz.perturbation.curves import Faithfulness, fold_random_seeds


def _run(methods, deletion, insertion):
    m = len(methods)
    return Faithfulness(methods=methods, maps=np.arange(m * 4, dtype=float).reshape(m, 2, 2),
                        fractions=np.array([0.0, 0.5, 1.0]), counts=np.array([0, 2, 4]),
                        deletion=np.asarray(deletion, float), insertion=np.asarray(insertion, float), score="p")


def test_seeds_fold_into_one_random_row_after_the_other_methods():
    deletion = [[1, 0.5, 0], [1, 0.8, 0.2], [1, 0.2, 0], [1, 0.6, 0.4]]
    insertion = [[0, 0.5, 1], [0, 0.2, 1], [0, 0.9, 1], [0, 0.4, 1]]
    lerf = np.array([[1, 0.9, 0.1], [1, 0.7, 0.3], [1, 1.0, 0.5], [1, 0.5, 0.1]])
    folded = fold_random_seeds(_run(["a", "random_seed_0", "b", "random_seed_1"], deletion, insertion), lerf)
    r = folded.result
    assert r.methods == ["a", "b", "random"]
    # the seeds' mean, by hand (one addition and one halving: within a rounding of the decimals)
    np.testing.assert_allclose(r.deletion, [[1, 0.5, 0], [1, 0.2, 0], [1, 0.7, 0.3]], atol=1e-15)
    np.testing.assert_allclose(r.insertion, [[0, 0.5, 1], [0, 0.9, 1], [0, 0.3, 1]], atol=1e-15)
    np.testing.assert_allclose(folded.lerf, [[1, 0.9, 0.1], [1, 1.0, 0.5], [1, 0.6, 0.2]], atol=1e-15)
    np.testing.assert_array_equal(r.maps[2], [[4, 5], [6, 7]])  # the first seed's map
    # the band: each seed's own AUC (trapezoid over 0, 0.5, 1): seed 0 deletion (1.8 + 1.0) / 4 = 0.7
    np.testing.assert_allclose(folded.band.deletion, [0.7, 0.65], atol=1e-15)
    np.testing.assert_allclose(folded.band.insertion, [0.35, 0.45], atol=1e-15)


def test_a_run_without_seeds_is_kept_as_it_is_and_has_no_band():
    folded = fold_random_seeds(_run(["a", "b"], [[1, 0.5, 0], [1, 0.2, 0]], [[0, 0.5, 1], [0, 0.9, 1]]),
                               np.array([[1, 0.9, 0.1], [1, 1.0, 0.5]]))
    assert folded.result.methods == ["a", "b"] and folded.band is None
    np.testing.assert_array_equal(folded.result.deletion, [[1, 0.5, 0], [1, 0.2, 0]])
    np.testing.assert_array_equal(folded.lerf, [[1, 0.9, 0.1], [1, 1.0, 0.5]])
