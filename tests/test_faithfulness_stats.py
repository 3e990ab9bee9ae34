"""Bootstrap intervals over images and paired differences: known answers and numpy recomputations."""
import numpy as np
import pandas as pd
import pytest

from tolerance import EPS64, summed
from vitviz.perturbation.stats import bootstrap_mean, paired_difference, summarise, verdict


def test_bootstrap_interval_is_numpys_percentiles_of_resampled_means():
    values = np.random.default_rng(1).normal(0.8, 0.05, 25)
    got = bootstrap_mean(values, resamples=2000, seed=7)
    draws = np.random.default_rng(7).integers(0, 25, size=(2000, 25))
    means = np.array([values[d].mean() for d in draws])  # one resample at a time, by hand
    # float64 means of 25 values below 1, a resample at a time here and vectorised (another summation order, another
    # SIMD split) in the code: summed(25, EPS64) = 5.6e-15 absolute bounds them; a wrong resample moves them by ~1e-3
    assert got.mean == pytest.approx(np.mean(values), abs=summed(25, EPS64))
    assert got.low == pytest.approx(np.percentile(means, 2.5), abs=summed(25, EPS64))
    assert got.high == pytest.approx(np.percentile(means, 97.5), abs=summed(25, EPS64))
    # The interval of a mean of 25 values with s.d. 0.05 is about ± 1.96 * 0.05 / 5 = ± 0.0196 wide.
    assert 0.012 < (got.high - got.low) / 2 < 0.026


def test_a_constant_paired_difference_has_a_zero_width_interval_at_that_value():
    images = [f"im{i}" for i in range(12)]
    base = pd.Series(np.random.default_rng(2).uniform(0.3, 0.9, 12), index=images)  # images differ a lot
    d = paired_difference(base + 0.01, base)
    assert d.mean == pytest.approx(0.01, abs=1e-12)
    assert d.low == pytest.approx(0.01, abs=1e-12) and d.high == pytest.approx(0.01, abs=1e-12)
    assert d.excludes_zero and d.n == 12


def test_differences_pair_images_by_name_not_by_position():
    a = pd.Series([0.5, 0.7, 0.9], index=["x", "y", "z"])
    b = pd.Series([0.85, 0.45, 0.65, 0.1], index=["z", "x", "y", "only in b"])
    d = paired_difference(a, b)
    assert d.n == 3 and d.low == pytest.approx(0.05) and d.high == pytest.approx(0.05)


def _table(rows):
    return pd.DataFrame(rows, columns=["image", "method", "protocol", "auc"])


def test_summary_says_which_methods_beat_chance_with_the_direction_of_each_protocol():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(20):
        level = rng.uniform(0.6, 0.9)  # image difficulty, shared by every method
        seeds = level + rng.normal(0, 0.01, 10)
        rows += [(f"im{i}", f"random_seed_{s}", "morf", v) for s, v in enumerate(seeds)]
        rows += [(f"im{i}", "random", "morf", seeds.mean()), (f"im{i}", "good", "morf", level - 0.05),
                 (f"im{i}", "bad", "morf", level + 0.05), (f"im{i}", "same", "morf", seeds.mean() + rng.normal(0, 0.002))]
        rows += [(f"im{i}", "random", "lerf", level), (f"im{i}", "good", "lerf", level + 0.05)]
    summary = summarise(_table(rows), resamples=2000)
    morf = {r["method"]: r for r in summary["protocols"]["morf"]["methods"]}
    assert [morf[m]["vs_random"] for m in ("good", "bad", "same")] == ["better", "worse", "chance"]
    assert "cannot be told from chance" in morf["same"]["sentence"]
    assert [r["method"] for r in summary["protocols"]["lerf"]["methods"]] == ["good", "random"]  # the floor last
    assert summary["protocols"]["lerf"]["methods"][0]["vs_random"] == "better"  # higher LeRF is better
    spread = summary["protocols"]["morf"]["random_seeds"]
    assert spread["seeds"] == 10 and 0 < spread["sd_over_seeds"] < 0.01
    pair = next(d for d in summary["protocols"]["morf"]["differences"] if (d["a"], d["b"]) == ("good", "bad"))
    assert pair["mean"] == pytest.approx(-0.1) and pair["significant"] and pair["more_faithful"] == "good"
    lerf = summary["protocols"]["lerf"]["differences"][0]
    assert (lerf["a"], lerf["b"], lerf["more_faithful"]) == ("good", "random", "good")  # higher LeRF is better
    assert verdict(paired_difference(pd.Series([0.1, -0.1]), pd.Series([0.0, 0.0])), "morf") == "chance"
