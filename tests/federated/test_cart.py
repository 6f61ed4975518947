"""``mpifc.federated.cart.fit_tree`` builds scikit-learn's ``DecisionTreeClassifier`` trees exactly.

FC[DT] models are compared by fingerprint, so the numpy CART must give the estimator's tree node
for node: same ids, children, features (scikit-learn's random feature order decides ties between
equally good splits), thresholds to the bit, and class fractions. scikit-learn is the reference
here (test-only import).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.tree import DecisionTreeClassifier

from mpifc.federated import cart
from mpifc.federated.fcdt import TreeClassifier, off_value_thresholds


def _problem(rng: np.random.Generator, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels with class-dependent features; rounded (ties), constant, nearly constant (within
    float32's 1e-7), binary, duplicated (equal splits on two features) and rescaled columns;
    repeated rows; non-contiguous inputs; labels that are not 0..k-1."""
    n = int(rng.choice([2, 5, 9, 10, 11, 20, 57, 100, 190, 400])) if t % 3 else int(rng.integers(2, 600))
    d = int(rng.integers(1, 31))
    k = int(rng.choice([1, 2, 2, 2, 3, 5]))
    y = rng.integers(0, k, n)
    x = rng.normal(size=(n, d)) + y[:, None] * rng.normal(size=d) * rng.choice([0.2, 1.0, 3.0])
    for j in range(d):
        r = rng.random()
        if r < 0.15:
            x[:, j] = np.round(x[:, j])
        elif r < 0.25:
            x[:, j] = 3.0
        elif r < 0.3:
            x[:, j] *= 1e-8
        elif r < 0.4:
            x[:, j] = rng.integers(0, 2, n)
        elif r < 0.45 and j:
            x[:, j] = x[:, 0]
        elif r < 0.5:
            x[:, j] *= rng.choice([1e-4, 1e4, 1e30])
    if t % 5 == 0:
        x = x[:, ::-1]
    if t % 7 == 0:
        y = y * 3 + 7
    if t % 11 == 0:
        idx = rng.integers(0, max(2, n // 4), n)
        x, y = x[idx], y[idx]
    return x, y


def test_trees_equal_the_estimators_on_random_data() -> None:
    rng = np.random.default_rng(20261127)
    for t in range(600):
        x, y = _problem(rng, t)
        seed = int(rng.integers(0, 2**31 - 1))
        max_depth = [None, 8, 3, 1][t % 4]
        min_leaf = int(rng.choice([1, 2, 5, 10]))
        want = DecisionTreeClassifier(max_depth=max_depth, min_samples_leaf=min_leaf, random_state=seed).fit(x, y)
        got = cart.fit_tree(x, y, max_depth, min_leaf, seed)
        tree = want.tree_
        where = (t, x.shape, max_depth, min_leaf, seed)
        assert np.array_equal(got.children_left, tree.children_left), where
        assert np.array_equal(got.children_right, tree.children_right), where
        assert np.array_equal(got.feature, tree.feature), where
        assert got.threshold.tobytes() == tree.threshold.tobytes(), where
        assert got.value.tobytes() == np.ascontiguousarray(tree.value[:, 0, :]).tobytes(), where
        assert np.array_equal(got.classes, want.classes_), where


def _tree_classifier_by_estimator(x: np.ndarray, target: int, k: int, seed: int) -> TreeClassifier:
    """``TreeClassifier.fit`` as it was with the estimator (the reference)."""
    feats = [j for j in range(x.shape[1]) if j != target]
    y = x[:, target].astype(np.int64)
    clf = DecisionTreeClassifier(max_depth=8, min_samples_leaf=5, random_state=seed).fit(x[:, feats], y)
    t = clf.tree_
    value = t.value[:, 0, :]
    probs = np.zeros((t.node_count, k))
    probs[:, clf.classes_.astype(np.int64)] = value / np.maximum(value.sum(1, keepdims=True), 1e-300)
    probs = np.maximum(probs, 1e-6)
    probs /= probs.sum(1, keepdims=True)
    return TreeClassifier(x.shape[1], target, t.children_left, t.children_right, t.feature, t.threshold, probs)


@pytest.mark.parametrize("seed", [0, 1, 17])
def test_tree_classifier_fits_the_estimators_model(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = 300, 3
    y = rng.integers(0, k, n)
    x = np.column_stack([rng.normal(size=(n, 5)) + y[:, None], np.round(rng.normal(size=n)), y])
    got = TreeClassifier.fit(x, 6, k, seed)
    want = _tree_classifier_by_estimator(x, 6, k, seed)
    _same_tree_off_the_values(got, want, x)
    # missing values: the estimator's own handling (it routes them), same model as before
    x[::7, 2] = np.nan
    got = TreeClassifier.fit(x, 6, k, seed)
    want = _tree_classifier_by_estimator(x, 6, k, seed)
    _same_tree_off_the_values(got, want, x)


def _same_tree_off_the_values(got: TreeClassifier, want: TreeClassifier, x: np.ndarray) -> None:
    """The estimator's tree, its thresholds moved into the gaps between the rows' values
    (off_value_thresholds): the same routes for every training row, no threshold on a value."""
    for name in ("left", "right", "feature", "probs"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name
    xs = np.delete(x, 6, axis=1)
    assert got.threshold.tobytes() == off_value_thresholds(xs, want.left, want.feature, want.threshold).tobytes()
    assert np.array_equal(got.class_probs(x), want.class_probs(x))
    inner = want.left >= 0
    assert not np.isin(got.threshold[inner], xs).any()
    assert np.any(got.threshold[inner] != want.threshold[inner])


def test_fitting_a_tree_does_not_import_scikit_learn() -> None:
    code = ("import sys, numpy as np; from mpifc.federated.fcdt import TreeClassifier, off_value_thresholds; "
            "x = np.random.default_rng(0).normal(size=(200, 5)); x[:, 4] = x[:, 0] > 0; "
            "TreeClassifier.fit(x, 4, 2, 0); "
            "print(sorted(m for m in ('sklearn', 'scipy', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
