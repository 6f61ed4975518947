"""LearnSPN / MSPN structure learning: validity, normalisation, determinism, robustness."""
from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
import torch

from mpifc.circuit import learnspn as L
from mpifc.circuit.graph import LeafNode, ProductNode, SumNode, count_nodes, topological_order, validate
from mpifc.circuit.learnspn import learn_spn
from mpifc.circuit.privacy import MIN_LEAF_ROWS
from mpifc.errors import UserError


def _mixture_binary(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Samples of a 3-component mixture of product-of-Bernoullis: every pair is dependent."""
    protos = np.array([[0.9] * d, [0.1] * d, [0.9 if j % 2 else 0.1 for j in range(d)]])
    z = rng.integers(0, 3, size=n)
    return (rng.random((n, d)) < protos[z]).astype(np.float64)


def _mixed(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """Real, discrete (0..4), categorical (0..2) and binary columns with dependencies."""
    z = rng.integers(0, 2, size=n)
    real = rng.normal(loc=3.0 * z, scale=1.0)
    real2 = real * 0.5 + rng.normal(size=n)
    disc = np.clip(rng.poisson(1 + 2 * z), 0, 4)
    cat = np.where(rng.random(n) < 0.8, z * 2, 1)
    binary = (rng.random(n) < 0.2 + 0.6 * z).astype(float)
    data = np.column_stack([real, disc, cat, binary, real2]).astype(np.float64)
    return data, ["real", "discrete", "categorical", "discrete", "real"]


def _fingerprint(root) -> list[tuple]:
    """Structure and every parameter, in deterministic topological order."""
    out = []
    for n in topological_order(root):
        if isinstance(n, LeafNode):
            out.append(("leaf", n.var, type(n.dist).__name__,
                        tuple((k, v.tobytes()) for k, v in sorted(n.dist.params().items()))))
        elif isinstance(n, SumNode):
            out.append(("sum", n.scope, len(n.children), n.weights.tobytes()))
        else:
            out.append(("product", n.scope, len(n.children)))
    return out


def test_binary_spn_sums_to_one_by_enumeration() -> None:
    rng = np.random.default_rng(0)
    data = _mixture_binary(1500, 5, rng)
    model = learn_spn(data, ["discrete"] * 5, min_instances_slice=100, threshold=0.1)
    counts = count_nodes(model.root)
    assert counts["sum"] >= 1 and counts["product"] >= 1  # a real structure, not one leaf product
    grid = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    ll = model.log_likelihood(grid)
    assert float(np.logaddexp.reduce(ll)) == pytest.approx(0.0, abs=1e-9)


def test_gtest_spn_sums_to_one_and_marginalises() -> None:
    data = _mixture_binary(1200, 4, np.random.default_rng(1))
    model = learn_spn(data, ["categorical"] * 4, col_split="gtest", min_instances_slice=80)
    grid = np.array(list(itertools.product([0.0, 1.0], repeat=4)))
    ll = model.log_likelihood(grid)
    assert float(np.logaddexp.reduce(ll)) == pytest.approx(0.0, abs=1e-9)
    # Marginal of x0 through NaN equals the sum over the enumerated other variables.
    x0 = np.array([[1.0, np.nan, np.nan, np.nan]])
    ref = np.logaddexp.reduce(ll[grid[:, 0] == 1])
    assert float(model.log_likelihood(x0)[0]) == pytest.approx(ref, abs=1e-9)


@pytest.mark.parametrize("leaf,row_split", [("auto", "kmeans"), ("histogram", "kmeans"),
                                            ("piecewise", "kmeans"), ("auto", "gmm")])
def test_mixed_data_spn_is_valid_and_finite(leaf: str, row_split: str) -> None:
    rng = np.random.default_rng(2)
    data, meta = _mixed(900, rng)
    model = learn_spn(data[:700], meta, min_instances_slice=60, leaf=leaf, row_split=row_split)
    validate(model.root)  # smooth, decomposable, normalised
    assert model.scope == tuple(range(5))
    ll = model.log_likelihood(data[700:])
    assert ll.shape == (200,) and np.all(np.isfinite(ll))
    assert ll.mean().item() > -30.0  # no leaf puts (near-)zero mass on in-range test values
    kinds = {type(n.dist).__name__ for n in topological_order(model.root) if isinstance(n, LeafNode)}
    expected_real = {"auto": "Gaussian", "histogram": "Histogram", "piecewise": "PiecewiseLinear"}[leaf]
    assert expected_real in kinds and "Bernoulli" in kinds


def test_mixed_leaf_types_follow_meta_types() -> None:
    data, meta = _mixed(400, np.random.default_rng(3))
    model = learn_spn(data, meta, min_instances_slice=1000)  # fully factorised: one leaf per var
    by_var = {n.var: type(n.dist).__name__ for n in topological_order(model.root) if isinstance(n, LeafNode)}
    assert by_var == {0: "Gaussian", 1: "Categorical", 2: "Categorical", 3: "Bernoulli", 4: "Gaussian"}


def test_same_seed_same_model_different_seed_differs() -> None:
    rng = np.random.default_rng(4)
    data = rng.uniform(size=(600, 3))  # no clear clusters: k-means restarts depend on the seed
    data[:, 1] += data[:, 0]
    fit = lambda s: _fingerprint(learn_spn(data, ["real"] * 3, min_instances_slice=50, seed=s, n_init=1).root)
    a = fit(0)
    assert a == fit(0)
    assert any(fit(s) != a for s in (1, 2, 3))


def test_constant_columns_are_split_off_without_nan() -> None:
    rng = np.random.default_rng(5)
    n = 500
    x = _mixture_binary(n, 4, rng)
    data = np.column_stack([x[:, :2], np.zeros(n), x[:, 2:], np.ones(n), np.full(n, 7.25),
                            rng.normal(size=n)])
    meta = ["discrete"] * 6 + ["real", "real"]
    model = learn_spn(data, meta, min_instances_slice=50)
    root = model.root
    assert isinstance(root, ProductNode)
    direct = {c.var for c in root.children if isinstance(c, LeafNode)}
    assert {2, 5, 6} <= direct  # constants become leaves right under the root
    test = data[:50].copy()
    ll = model.log_likelihood(test)
    assert np.all(np.isfinite(ll))
    # Smoothed, not deterministic: the unseen value of a constant binary column keeps some mass.
    flipped = test.copy()
    flipped[:, 2] = 1.0
    ll_flip = model.log_likelihood(flipped)
    assert np.all(np.isfinite(ll_flip)) and np.all(ll_flip < ll)
    const_leaf = next(c for c in root.children if isinstance(c, LeafNode) and c.var == 6)
    assert const_leaf.dist.params()["var"] >= 1e-4  # variance floor


def test_all_columns_constant() -> None:
    data = np.tile([1.0, 0.0, 3.0], (30, 1))
    model = learn_spn(data, ["discrete", "discrete", "real"])
    assert np.all(np.isfinite(model.log_likelihood(data)))


def test_learned_model_beats_full_factorisation() -> None:
    rng = np.random.default_rng(6)
    data = _mixture_binary(3000, 8, rng)
    train, test = data[:2000], data[2000:]
    learned = learn_spn(train, ["discrete"] * 8, min_instances_slice=100, threshold=0.1)
    factorised = learn_spn(train, ["discrete"] * 8, min_instances_slice=10**6)
    assert count_nodes(factorised.root)["sum"] == 0
    gain = (learned.log_likelihood(test).mean() - factorised.log_likelihood(test).mean()).item()
    assert gain > 0.5  # nats per sample


def test_deep_structure_uses_queue_not_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row splitter that peels off MIN_LEAF_ROWS rows at a time (the least a cluster may hold)
    makes the learner ~300 levels deep."""

    def peel(features, method, n_clusters, seed, n_init=3):
        labels = np.zeros(len(features), dtype=np.int64)
        labels[-MIN_LEAF_ROWS:] = 1
        return labels

    monkeypatch.setattr(L, "split_rows", peel)
    z = (np.arange(300 * MIN_LEAF_ROWS) % 2).astype(np.float64)
    data = np.column_stack([z, z])  # one dependent pair: every level is a row split
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # below the tree depth (~300 levels)
    try:
        root = L.learn_structure(data, ["discrete", "discrete"], L.LearnSPNParams(min_instances_slice=2))
    finally:
        sys.setrecursionlimit(old)
    validate(root)
    assert isinstance(root, SumNode) and len(root.children) >= 250  # collapsed chain of sums


def test_min_instances_slice_controls_size() -> None:
    data = _mixture_binary(2000, 6, np.random.default_rng(8))
    small = count_nodes(learn_spn(data, ["discrete"] * 6, min_instances_slice=50, threshold=0.1).root)
    large = count_nodes(learn_spn(data, ["discrete"] * 6, min_instances_slice=800, threshold=0.1).root)
    assert small["sum"] > large["sum"]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(meta_types=["real"]), "meta_types"),
        (dict(meta_types=["real", "bogus"]), "meta_types[1]"),
        (dict(threshold=1.5), "threshold"),
        (dict(min_instances_slice=0), "min_instances_slice"),
        (dict(col_split="chi2"), "col_split"),
        (dict(row_split="dbscan"), "row_split"),
        (dict(n_clusters=1), "n_clusters"),
        (dict(leaf="spline"), "leaf"),
        (dict(col_split="gtest"), "gtest"),
        (dict(alpha=0.0), "alpha"),
        (dict(rdc_ties="dense"), "rdc_ties"),
        (dict(rdc_k=0), "rdc_k"),
    ],
)
def test_bad_arguments_raise_user_error(kwargs: dict, field: str) -> None:
    data = np.column_stack([np.arange(10.0), np.arange(10.0) % 2])
    args = dict(meta_types=["real", "discrete"])
    args.update(kwargs)
    meta = args.pop("meta_types")
    with pytest.raises(UserError, match=field.replace("[", r"\[").replace("]", r"\]")):
        learn_spn(data, meta, **args)


def test_bad_data_raises_user_error() -> None:
    with pytest.raises(UserError, match="NaN"):
        learn_spn(np.array([[0.0, np.nan], [1.0, 1.0]]), ["discrete", "discrete"])
    with pytest.raises(UserError, match="column 1"):
        learn_spn(np.array([[0.0, 0.5], [1.0, 1.0]]), ["discrete", "discrete"])
    with pytest.raises(UserError, match="2-D"):
        learn_spn(np.zeros(5), ["real"])


def test_resmooth_equals_learning_with_that_alpha() -> None:
    data = np.column_stack([_mixture_binary(800, 4, np.random.default_rng(9)),
                            np.random.default_rng(10).integers(0, 3, size=800)])
    meta = ["discrete"] * 4 + ["categorical"]
    coarse = learn_spn(data, meta, min_instances_slice=60, threshold=0.1, alpha=1.0)
    fine = learn_spn(data, meta, min_instances_slice=60, threshold=0.1, alpha=0.1)
    root = coarse.root
    assert L.resmooth(root, 0.1) == len([n for n in topological_order(root) if isinstance(n, LeafNode)])
    got = [n.dist.params() for n in topological_order(root) if isinstance(n, LeafNode)]
    want = [n.dist.params() for n in topological_order(fine.root) if isinstance(n, LeafNode)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert np.allclose(g[k], w[k], rtol=0, atol=1e-12)


def test_cluster_first_starts_with_a_row_split() -> None:
    rng = np.random.default_rng(11)
    a, b = _mixture_binary(1000, 3, rng), _mixture_binary(1000, 3, rng)  # independent blocks
    data = np.column_stack([a, b])
    col_first = learn_spn(data, ["discrete"] * 6, min_instances_slice=100, col_split="gtest")
    row_first = learn_spn(data, ["discrete"] * 6, min_instances_slice=100, col_split="gtest", cluster_first=True)
    assert isinstance(col_first.root, ProductNode)
    assert sorted(c.scope for c in col_first.root.children) == [(0, 1, 2), (3, 4, 5)]
    assert isinstance(row_first.root, SumNode)
