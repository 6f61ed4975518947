"""Root-only queries on a ``RootPlan`` (finite-domain leaves folded into one-hot matrix products)
against the generic upward pass.

``CompiledCircuit.log_likelihood`` and ``max_log_value`` fold the Bernoulli and Categorical
leaves of wide products into ``onehot(x) @ table``; the values must equal the generic pass's to
rounding (the same leaf log-values, summed in another order), with missing values marginalised
(sum-product) or maximised (max-product), and values outside a leaf's domain must take the
generic pass unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifc.circuit import compiled
from mpifc.circuit.graph import LeafNode, Node, ProductNode, SumNode
from mpifc.circuit.leaves import Bernoulli, Categorical, Gaussian
from mpifc.circuit.learnspn import learn_spn
from mpifc.circuit.semiring import MAX_PRODUCT, SUM_PRODUCT
from mpifc.circuit.spn import SPN


def _leaf(var: int, kind: tuple[str, int], rng: np.random.Generator, hard: bool) -> LeafNode:
    name, k = kind
    if name == "bernoulli":
        p = float(rng.choice([0.0, 1.0])) if hard and rng.random() < 0.3 else rng.uniform(0.02, 0.98)
        return LeafNode(var, Bernoulli(p))
    if name == "categorical":
        kk = int(rng.integers(2, k + 1))  # leaves of one variable may have fewer categories
        probs = rng.dirichlet(np.ones(kk))
        if hard and rng.random() < 0.3:
            probs[rng.integers(kk)] = 0.0
            probs /= probs.sum()
        return LeafNode(var, Categorical(probs))
    return LeafNode(var, Gaussian(rng.uniform(-1, 1), rng.uniform(0.3, 1.0)))


def _circuit(kinds: list[tuple[str, int]], rng: np.random.Generator, hard: bool = False, depth: int = 3) -> Node:
    """A random valid circuit with wide products of leaves: each product splits its scope into
    single variables (leaves, now and then a sum of two leaves) and a few larger parts (sums of
    such products, recursively); one subcircuit is shared by two parents."""
    shared: dict[tuple[int, ...], Node] = {}

    def part(scope: tuple[int, ...], level: int) -> Node:
        if len(scope) == 1:
            v = scope[0]
            if rng.random() < 0.1:
                return SumNode([_leaf(v, kinds[v], rng, hard), _leaf(v, kinds[v], rng, hard)], rng.dirichlet([1, 1]))
            return _leaf(v, kinds[v], rng, hard)
        if level == 0:
            return ProductNode([part((v,), 0) for v in scope])
        if scope in shared and rng.random() < 0.5:
            return shared[scope]
        kids = []
        for _ in range(int(rng.integers(2, 4))):
            perm = [int(v) for v in rng.permutation(scope)]
            cut = int(rng.integers(1, len(scope)))
            big = tuple(sorted(perm[:cut]))
            kids.append(ProductNode([part(big, level - 1)] + [part((v,), 0) for v in sorted(perm[cut:])]))
        node = SumNode(kids, rng.dirichlet(np.ones(len(kids))))
        shared[scope] = node
        return node

    return part(tuple(range(len(kinds))), depth)


def _data(kinds: list[tuple[str, int]], n: int, rng: np.random.Generator, missing: float) -> np.ndarray:
    cols = []
    for name, k in kinds:
        if name == "gaussian":
            cols.append(rng.normal(size=n))
        else:
            cols.append(rng.integers(0, 2 if name == "bernoulli" else k, n).astype(float))
    x = np.stack(cols, 1)
    x[rng.random(x.shape) < missing] = np.nan
    return x


def _kinds(rng: np.random.Generator, d: int, mix: str) -> list[tuple[str, int]]:
    if mix == "bernoulli":
        return [("bernoulli", 2)] * d
    names = ["bernoulli", "categorical", "gaussian"] if mix == "mixed" else ["bernoulli", "categorical"]
    return [(str(rng.choice(names)), int(rng.integers(3, 6))) for _ in range(d)]


def _generic(spn: SPN, query: str, x: np.ndarray) -> torch.Tensor:
    spn.circuit.fold_leaves = False
    try:
        return getattr(spn.circuit, query)(x)
    finally:
        spn.circuit.fold_leaves = True


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert bool(torch.isfinite(got).all())
    err = (got - want).abs() / want.abs().clamp_min(1.0)
    assert float(err.max()) <= 1e-12, float(err.max())


@pytest.fixture
def fold_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans for small circuits too (the defaults keep them for circuits with many leaves)."""
    monkeypatch.setattr(compiled, "FOLD_MIN_EDGES", 1)


@pytest.mark.parametrize("share", [compiled.FOLD_SHARE, 4])  # 4: narrow products keep their leaves
@pytest.mark.parametrize("mix", ["bernoulli", "discrete", "mixed"])
@pytest.mark.parametrize("query", ["log_likelihood", "max_log_value"])
def test_plan_equals_generic_pass(fold_everything: None, monkeypatch: pytest.MonkeyPatch, share: int, mix: str,
                                  query: str) -> None:
    monkeypatch.setattr(compiled, "FOLD_SHARE", share)
    rng = np.random.default_rng(len(mix) + 10 * len(query) + share)
    for t in range(6):
        d = int(rng.integers(2, 14))
        kinds = _kinds(rng, d, mix)
        spn = SPN(_circuit(kinds, rng, hard=t % 2 == 1, depth=int(rng.integers(1, 4))))
        plan = spn.circuit.root_plan()
        if all(k[0] == "gaussian" for k in kinds):
            continue
        if plan is None:  # share 4: no product as wide as a quarter of the one-hot features
            assert share == 4
            continue
        assert plan.fold.stop > plan.fold.start
        for missing in (0.0, 0.3, 1.0):  # complete rows (compact one-hot), NaN marginals, all NaN
            x = _data(kinds, 300, rng, missing)
            _close(getattr(spn.circuit, query)(x), _generic(spn, query, x))


def test_plan_of_a_learnspn_model_on_a_wide_binary_table() -> None:
    """Default thresholds: a LearnSPN model with many leaves under wide products gets a plan."""
    rng = np.random.default_rng(0)
    n, d = 1000, 64
    z = rng.integers(0, 4, n)
    x = (rng.random((n, d)) < rng.beta(0.5, 1.5, size=(4, d))[z]).astype(float)
    spn = learn_spn(x, ["discrete"] * d, threshold=0.05, min_instances_slice=20, seed=0)
    plan = spn.circuit.root_plan()
    assert plan is not None and plan.n_nodes < spn.circuit.n_nodes // 4
    test = x[rng.integers(0, n, 500)]
    test[rng.random(test.shape) < 0.1] = np.nan
    for query in ("log_likelihood", "max_log_value"):
        _close(getattr(spn.circuit, query)(test), _generic(spn, query, test))
        _close(getattr(spn.circuit, query)(x), _generic(spn, query, x))


def test_fully_missing_rows_equal_the_generic_pass_exactly(fold_everything: None) -> None:
    """Marginalised leaves add exact zeros in either order: only the weights remain."""
    rng = np.random.default_rng(4)
    for _ in range(5):
        kinds = _kinds(rng, 9, "discrete")
        spn = SPN(_circuit(kinds, rng))
        x = np.full((3, 9), np.nan)
        got = spn.circuit.log_likelihood(x)
        assert torch.equal(got, _generic(spn, "log_likelihood", x))
        assert float(got.abs().max()) < 1e-14


def test_values_outside_a_domain_take_the_generic_pass(fold_everything: None) -> None:
    rng = np.random.default_rng(5)
    kinds = [("bernoulli", 2)] * 4 + [("categorical", 4)] * 4
    spn = SPN(_circuit(kinds, rng))
    assert spn.circuit.root_plan() is not None
    good = _data(kinds, 50, rng, 0.2)
    for bad in (0.5, -1.0, 2.0, 4.0, np.inf, -np.inf, 1e300):
        x = good.copy()
        x[7, int(rng.integers(0, 8))] = bad
        for query in ("log_likelihood", "max_log_value"):
            got, want = getattr(spn.circuit, query)(x), _generic(spn, query, x)
            assert torch.equal(got, want)
            assert not bool(torch.isnan(got).any())


def test_plan_follows_em_updates(fold_everything: None) -> None:
    rng = np.random.default_rng(6)
    kinds = _kinds(rng, 10, "discrete")
    spn = SPN(_circuit(kinds, rng))
    x = _data(kinds, 200, rng, 0.1)
    before = spn.circuit.root_plan()
    for _ in range(2):
        spn.apply_em(spn.em_statistics(x))
        assert spn.circuit.root_plan() is not before
        _close(spn.circuit.log_likelihood(x), _generic(spn, "log_likelihood", x))
    assert spn.circuit.root_plan() is spn.circuit.root_plan()  # kept while the parameters stand


def test_conditionals_and_predictions_through_the_plan(fold_everything: None) -> None:
    rng = np.random.default_rng(7)
    kinds = _kinds(rng, 8, "discrete")
    spn = SPN(_circuit(kinds, rng))
    x = _data(kinds, 100, rng, 0.2)
    x[:, 2] = np.nan_to_num(x[:, 2])
    got_c = spn.circuit.conditional(x, [2, 5])
    _, got_p = spn.circuit.predict_proba(x, 2)
    spn.circuit.fold_leaves = False
    want_c = spn.circuit.conditional(x, [2, 5])
    _, want_p = spn.circuit.predict_proba(x, 2)
    spn.circuit.fold_leaves = True
    finite = torch.isfinite(want_c)
    assert torch.equal(finite, torch.isfinite(got_c))
    _close(got_c[finite], want_c[finite])
    np.testing.assert_allclose(got_p, want_p, rtol=1e-10, atol=1e-12)


def test_float32_circuits(fold_everything: None) -> None:
    rng = np.random.default_rng(8)
    kinds = _kinds(rng, 10, "discrete")
    root = _circuit(kinds, rng)
    spn = SPN(root, dtype=torch.float32)
    x = _data(kinds, 200, rng, 0.2)
    got, want = spn.circuit.log_likelihood(x), _generic(spn, "log_likelihood", x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_node_major_segment_reductions_equal_the_row_major_ones_exactly() -> None:
    """The plan's sums reduce along rows; the values must be the generic pass's, bit for bit."""
    rng = np.random.default_rng(9)
    for _ in range(20):
        n_seg, batch = int(rng.integers(1, 30)), int(rng.integers(1, 50))
        seg = torch.as_tensor(np.sort(rng.integers(0, n_seg, int(rng.integers(n_seg, 4 * n_seg + 1)))))
        seg[:n_seg] = torch.arange(n_seg)  # every segment non-empty
        seg = seg.sort().values
        vals = torch.as_tensor(rng.normal(size=(batch, len(seg))) * 50)
        vals[torch.as_tensor(rng.random(vals.shape) < 0.1)] = -torch.inf
        vals[:, seg == 0] = -torch.inf  # a segment without mass in every row
        pairs = torch.arange(n_seg).repeat_interleave(2)  # sums of two children
        both = torch.as_tensor(rng.normal(size=(batch, 2 * n_seg)) * 50)
        both[torch.as_tensor(rng.random(both.shape) < 0.2)] = -torch.inf
        for semiring in (SUM_PRODUCT, MAX_PRODUCT):
            rows = semiring.plus_rows(vals.T.contiguous(), seg, n_seg)
            assert torch.equal(rows.T, semiring.plus(vals, seg, n_seg))
            rows = semiring.plus_rows(both.T.contiguous(), pairs, n_seg, pairs=True)
            assert torch.equal(rows.T, semiring.plus(both, pairs, n_seg))
