"""Fit and score linear probes: scikit-learn's ``LogisticRegression`` (L2) on standardised features, C chosen by
stratified cross-validation on the training images only, every layer scored by nested cross-validation, and the
standardisation folded into the exported weights so that the head is one linear layer on the pooled vector.

Accuracy per layer is the out-of-fold accuracy of an outer stratified K-fold (K = min(5, the smallest class's
images)): every image is predicted once by a probe that never saw it, with C chosen inside that probe's training
images (an inner stratified K-fold, K = min(3, the smallest training class)). Its interval is the 95 % Wilson score
interval of that accuracy over the n images; chance is the share of the largest class (what always answering it
scores).

A C chosen at an end of the grid is reported (:class:`CSearch`, ``C_at_edge`` in the table and probe.json): when it
scored above its neighbour the best C may lie outside the grid; when it tied (ties go to the smaller C), the
accuracy was flat there and the end says nothing about what lies beyond.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

CS = (1e-3, 1e-2, 1e-1, 1.0, 10.0)  # the C grid (inverse L2 strength), on standardised features
OUTER_FOLDS, INNER_FOLDS = 5, 3
MAX_ITER = 1000
Z95 = 1.959963984540054


@dataclass(frozen=True)
class CSearch:
    """What one cross-validated C search saw.

    Attributes:
        grid: the C values tried, ascending.
        accuracy: (len(grid),) mean held-out accuracy of each C over the folds (0..1).
        C: the chosen one (the most accurate; ties to the smaller C).
        folds: the stratified folds (0: a class with one image, nothing cross-validated, C = 1).
    """

    grid: tuple[float, ...]
    accuracy: tuple[float, ...]
    C: float
    folds: int

    @property
    def edge(self) -> str | None:
        """``"smallest"`` or ``"largest"`` when the chosen C is an end of the grid (and was searched), else None."""
        if not self.folds or len(self.grid) < 2:
            return None
        return "smallest" if self.C == self.grid[0] else "largest" if self.C == self.grid[-1] else None

    @property
    def beyond(self) -> bool:
        """The chosen end scored above its neighbour: the best C may lie outside the grid."""
        if self.edge is None:
            return False
        end, next_ = (0, 1) if self.edge == "smallest" else (-1, -2)
        return self.accuracy[end] > self.accuracy[next_]

    def note(self) -> str | None:
        """One sentence when the chosen C is an end of the grid; None otherwise."""
        if self.edge is None:
            return None
        i, j = (0, 1) if self.edge == "smallest" else (-1, -2)
        told = (f"it scored {self.accuracy[i]:.3f} against {self.accuracy[j]:.3f} for C = {self.grid[j]:g}: the best C "
                f"may lie {'below' if i == 0 else 'above'} the range" if self.beyond else
                f"it tied with C = {self.grid[j]:g} ({self.accuracy[i]:.3f}; ties go to the smaller C): the accuracy "
                "is flat there")
        return (f"C = {self.C:g} is the {self.edge} of the search's range ({self.grid[0]:g} to {self.grid[-1]:g}); "
                f"{told}.")

    def to_dict(self) -> dict:
        return {"grid": list(self.grid), "accuracy": list(self.accuracy), "C": self.C, "folds": self.folds,
                "C_at_edge": self.edge, "beyond_range": self.beyond, "note": self.note()}


@dataclass(frozen=True)
class LayerScore:
    """One layer's cross-validated accuracy.

    Attributes:
        layer: 1-based, as on screen and on the command line.
        accuracy: out-of-fold accuracy over the n images (0..1).
        low, high: its 95 % Wilson score interval.
        folds: the outer folds.
        C: the C most often chosen by the inner cross-validation over the outer folds.
        C_at_edge: the outer folds whose inner search chose an end of the grid (:attr:`CSearch.edge`).
    """

    layer: int
    accuracy: float
    low: float
    high: float
    folds: int
    C: float
    C_at_edge: int = 0

    def to_dict(self) -> dict:
        return {"layer": self.layer, "accuracy": self.accuracy, "low": self.low, "high": self.high,
                "folds": self.folds, "C": self.C, "C_at_edge": self.C_at_edge}


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``correct / n`` (95 % at the default z)."""
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def chance(y: np.ndarray) -> float:
    """The majority class's share of ``y`` (n,)."""
    return float(np.bincount(y).max() / len(y))


def _pipeline(C: float, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=MAX_ITER, random_state=seed))


def fit_probe(X: np.ndarray, y: np.ndarray, seed: int = 0, Cs=CS):
    """A probe on ``X`` (n, F) with classes ``y`` (n,), C chosen by stratified cross-validation on these images.

    The search is scikit-learn's ``GridSearchCV`` over ``Cs`` (the mean accuracy over stratified folds; ties to the
    smaller C), with each fold's fits warm-started along the C path (ascending): the same choice in a third to a half
    of the time on small sets (``benchmarks/probe_cost.py``).

    Returns:
        the fitted pipeline (``StandardScaler`` then ``LogisticRegression``) on all of ``X`` and the search
        (:class:`CSearch`: ``.C`` the chosen C, ``.edge`` whether it is an end of the grid). A class with a single
        image leaves nothing to cross-validate: C is then 1 (``folds`` 0).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    Cs = sorted(Cs)
    smallest = int(np.bincount(y)[np.unique(y)].min())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if smallest < 2:
            return _pipeline(1.0, seed).fit(X, y), CSearch(tuple(Cs), (), 1.0, 0)
        folds = min(INNER_FOLDS, smallest)
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        accuracy = np.zeros(len(Cs))
        for train, test in cv.split(X, y):
            scaler = StandardScaler().fit(X[train])
            fitted, held_out = scaler.transform(X[train]), scaler.transform(X[test])
            logistic = LogisticRegression(max_iter=MAX_ITER, warm_start=True, random_state=seed)
            for k, C in enumerate(Cs):
                accuracy[k] += logistic.set_params(C=C).fit(fitted, y[train]).score(held_out, y[test])
        C = float(Cs[int(np.argmax(accuracy))])
        search = CSearch(tuple(float(c) for c in Cs), tuple(float(a) for a in accuracy / folds), C, folds)
        return _pipeline(C, seed).fit(X, y), search


def score_layer(X: np.ndarray, y: np.ndarray, layer: int, seed: int = 0, Cs=CS) -> LayerScore:
    """Nested cross-validation of one layer's features ``X`` (n, F): out-of-fold accuracy and its interval.

    ``layer`` is 1-based (it only labels the result)."""
    from sklearn.model_selection import StratifiedKFold

    folds = min(OUTER_FOLDS, int(np.bincount(y)[np.unique(y)].min()))
    outer = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    predicted = np.empty_like(y)
    searches = []
    for train, test in outer.split(X, y):
        probe, search = fit_probe(X[train], y[train], seed, Cs)
        predicted[test] = probe.predict(X[test])
        searches.append(search)
    correct = int((predicted == y).sum())
    low, high = wilson(correct, len(y))
    values, counts = np.unique([s.C for s in searches], return_counts=True)
    return LayerScore(layer, correct / len(y), low, high, folds, float(values[counts.argmax()]),
                      sum(s.edge is not None for s in searches))


def export_head(pipeline, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The fitted pipeline as one linear layer on the raw features: (weight (K, F), bias (K,)) float64.

    Standardisation folded in: w' = w / σ, b' = b − Σ w μ / σ. Two classes: scikit-learn keeps one score
    s = w·x + b (positive: the second class); the head gives the classes −s/2 and +s/2, whose difference is s
    and whose softmax is scikit-learn's ``predict_proba``.
    """
    scaler, logistic = pipeline[0], pipeline[-1]
    weight = logistic.coef_ / scaler.scale_
    bias = logistic.intercept_ - (logistic.coef_ * scaler.mean_ / scaler.scale_).sum(axis=1)
    if num_classes == 2:
        weight, bias = np.concatenate([-weight / 2, weight / 2]), np.concatenate([-bias / 2, bias / 2])
    return weight, bias
