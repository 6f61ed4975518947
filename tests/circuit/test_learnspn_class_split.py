"""LearnSPN's class split (``class_column``) and ``mixed`` leaves, which the adaptive defaults
(mpifc.federated.defaults) switch on."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import logsumexp

from mpifc.circuit import learnspn as L
from mpifc.circuit.graph import LeafNode, ProductNode, SumNode, topological_order, validate
from mpifc.circuit.learnspn import learn_spn
from mpifc.errors import UserError


def _labelled_binary(n: int, rng: np.random.Generator) -> np.ndarray:
    """Five binary columns that depend on a binary class in column 2."""
    y = rng.integers(0, 2, n)
    cols = [(rng.random(n) < np.where(y == 1, p, 1 - p)) for p in (0.8, 0.7, 0.6, 0.9)]
    return np.column_stack(cols[:2] + [y] + cols[2:]).astype(np.float64)


def test_class_split_is_a_normalised_class_conditional_model() -> None:
    data = _labelled_binary(800, np.random.default_rng(0))
    model = learn_spn(data, ["discrete"] * 5, col_split="gtest", min_instances_slice=60, class_column=2)
    validate(model.root)
    root = model.root
    assert isinstance(root, SumNode) and len(root.children) == 2
    # weights are the class shares, each child pins the class with its own leaf
    assert np.allclose(sorted(root.weights), sorted([np.mean(data[:, 2] == 0), np.mean(data[:, 2] == 1)]))
    for child in root.children:
        assert isinstance(child, ProductNode)
        assert [c.var for c in child.children if isinstance(c, LeafNode) and c.var == 2] == [2]
    grid = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    assert logsumexp(model.log_likelihood(grid)) == pytest.approx(0.0, abs=1e-9)


def test_class_split_predicts_from_every_column() -> None:
    """A column split that finds no dependency significant factorises the class away (p(y | x) =
    p(y): the majority class); after the class split the same split leaves p(x | y) per class,
    so the prediction follows the columns."""
    rng = np.random.default_rng(3)
    data = _labelled_binary(120, rng)
    test = _labelled_binary(400, rng)
    blank = np.repeat(test, 2, axis=0)
    blank[:, 2] = np.tile([0.0, 1.0], len(test))
    majority = max(np.mean(test[:, 2]), 1 - np.mean(test[:, 2]))
    acc = {}
    for column in (None, 2):
        model = learn_spn(data, ["discrete"] * 5, col_split="gtest", gtest_pvalue=1e-20, min_instances_slice=30,
                          class_column=column)
        pred = model.log_likelihood(blank).reshape(-1, 2).argmax(1)
        acc[column] = np.mean(pred == test[:, 2])
    assert acc[None] == majority and acc[2] > 0.85


def test_class_split_edge_cases() -> None:
    rng = np.random.default_rng(1)
    data = _labelled_binary(200, rng)
    one_class = data[data[:, 2] == 1]
    model = learn_spn(one_class, ["discrete"] * 5, col_split="gtest", class_column=2)
    validate(model.root)  # a single value: no split, an ordinary LearnSPN
    with pytest.raises(UserError, match="class_column must be a column index"):
        learn_spn(data, ["discrete"] * 5, class_column=5)
    with pytest.raises(UserError, match="class_column 0 is real"):
        learn_spn(data, ["real"] + ["discrete"] * 4, class_column=0)


def test_mixed_leaves_put_histograms_on_point_masses() -> None:
    rng = np.random.default_rng(2)
    n = 600
    counts = np.where(rng.random(n) < 0.7, 0.0, rng.poisson(3, n))  # a code/count stored as real
    smooth = rng.normal(size=n)
    model = learn_spn(np.column_stack([counts, smooth]), ["real", "real"], leaf="mixed", min_instances_slice=50)
    kinds = {n.var: type(n.dist).__name__ for n in topological_order(model.root) if isinstance(n, LeafNode)}
    assert kinds == {0: "Histogram", 1: "Gaussian"}
    assert L._point_mass(np.array([1.0] * 5 + list(range(95)))) and not L._point_mass(np.arange(100.0))
