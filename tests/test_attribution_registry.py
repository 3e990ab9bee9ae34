"""attribution.py's own lists (kept for its callers and tests) say what the registry (vitviz.explainers) says:
the app and the figures name and sort methods by the registry, so a drift would show one name in one place and
another elsewhere."""
from vitviz.explainers import registered
import attribution_names as A
from vitviz.explainers.base import AttributionMethod


def test_attribution_lists_agree_with_the_registry():
    methods = registered()
    assert {n for n, m in methods.items() if isinstance(m, AttributionMethod)} == set(A.METHODS)
    assert A.LABELS == {m: methods[m].label for m in A.METHODS}
    assert set(A.PIXEL_METHODS) == {m for m in A.METHODS if methods[m].pixels}
