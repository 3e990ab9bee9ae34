"""The CKA map's median interval width, which the Compare page's "intervals are wide" warning reads."""
import numpy as np

from vitviz.figures.similarity_figures import median_interval_width


def test_the_cka_maps_median_interval_width_skips_cells_without_an_interval():
    low = np.array([[0.1, 0.2], [np.nan, 0.0]])
    high = np.array([[0.5, 0.3], [0.9, 0.8]])
    assert median_interval_width(low, high) == 0.4  # widths 0.4, 0.1, 0.8: the NaN cell left out
    assert median_interval_width(np.full((2, 2), np.nan), high) is None
