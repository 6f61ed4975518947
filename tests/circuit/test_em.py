"""EM on graph circuits: monotonicity, additive statistics, sample weights, online steps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifc.circuit.base import EMStatistics
from mpifc.circuit.compiled import CircuitStats
from mpifc.circuit.em import batch_em, online_em, robbins_monro, sum_statistics
from mpifc.circuit.graph import LeafNode, ProductNode, SumNode, validate
from mpifc.circuit.leaves import Gaussian
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

from .conftest import LEAF_KINDS, LeafKind, ids, random_circuit


def _data(kind: LeafKind, n: int, seed: int) -> np.ndarray:
    """Data from a *different* random circuit, so EM has something to learn."""
    src = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(seed + 100)))
    x = src.sample(n, seed)
    x[np.random.default_rng(seed).random(x.shape) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_batch_em_never_decreases_train_ll(kind: LeafKind) -> None:
    spn = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(1)))
    x = _data(kind, 300, 2)
    w = np.random.default_rng(3).uniform(0.2, 2.0, len(x))
    hist = batch_em(spn, x, n_iter=6, sample_weight=w)
    assert len(hist) == 7
    assert all(b >= a - 1e-9 for a, b in zip(hist, hist[1:])), hist
    assert hist[-1] > hist[0] or not kind.em
    validate(spn.root)  # written-back weights still sum to 1
    assert np.isfinite(hist[-1])


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_statistics_add_up_across_shards(kind: LeafKind) -> None:
    spn = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(4)))
    x = _data(kind, 120, 5)
    w = np.random.default_rng(6).uniform(0, 2, len(x))
    whole = spn.em_statistics(x, w)
    parts = sum_statistics([spn.em_statistics(x[:50], w[:50]), spn.em_statistics(x[50:90], w[50:90]),
                            spn.em_statistics(x[90:], w[90:])])
    assert isinstance(whole, EMStatistics)
    a, b = whole.to_arrays(), parts.to_arrays()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-11, atol=1e-11)
    back = CircuitStats.from_arrays(b)
    for k, v in back.to_arrays().items():
        np.testing.assert_array_equal(v, b[k])


def test_sample_weight_two_equals_duplicated_row() -> None:
    kind = LEAF_KINDS[4]  # gaussian
    spn = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(7)))
    x = _data(kind, 40, 8)
    w = np.ones(len(x))
    w[:10] = 2.0
    a = spn.em_statistics(x, w).to_arrays()
    b = spn.em_statistics(np.concatenate([x, x[:10]])).to_arrays()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-11, atol=1e-11)


def test_root_flow_is_sample_weight_and_edge_counts_partition_it() -> None:
    kind = LEAF_KINDS[1]
    spn = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(9)))
    x = _data(kind, 50, 10)
    w = np.random.default_rng(11).uniform(0, 3, len(x))
    st = spn.em_statistics(x, w)
    c = spn.circuit
    root_edges = [i for i, s in enumerate(c.sum_nodes) if s is c.root]
    assert root_edges
    per_edge_parent = c.edge_sum.numpy()
    assert st.edge_counts[per_edge_parent == root_edges[0]].sum() == pytest.approx(w.sum(), rel=1e-12)
    assert st.n == pytest.approx(w.sum())


def test_empty_component_keeps_parameters_and_no_nan() -> None:
    # The second component only explains values near 1000; data never goes there.
    far = ProductNode([LeafNode(0, Gaussian(1000.0, 1e-4, min_var=1e-4)), LeafNode(1, Gaussian(1000.0, 1e-4, min_var=1e-4))])
    near = ProductNode([LeafNode(0, Gaussian(0.0, 1.0)), LeafNode(1, Gaussian(0.0, 1.0))])
    spn = SPN(SumNode([near, far], [0.5, 0.5]))
    x = np.random.default_rng(0).normal(size=(100, 2))
    hist = batch_em(spn, x, n_iter=3)
    assert all(np.isfinite(hist))
    leaves = [n for n in far.children]
    assert float(leaves[0].dist.params()["mean"]) == 1000.0
    assert spn.root.weights[1] < 1e-100 and np.all(np.isfinite(spn.root.weights))


def test_online_em_with_step_size_improves_and_stays_valid() -> None:
    kind = LEAF_KINDS[4]
    spn = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(12)))
    x = _data(kind, 600, 13)
    before = float(spn.log_likelihood(x).mean())
    hist = online_em(spn, x, batch_size=50, n_epochs=3, step_size=robbins_monro(), rng=0)
    assert len(hist) == 36 and all(np.isfinite(hist))
    assert float(spn.log_likelihood(x).mean()) > before
    validate(spn.root)


def test_step_size_mixes_old_and_new_parameters() -> None:
    kind = LEAF_KINDS[1]
    x = _data(kind, 100, 14)
    full = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(15)))
    half = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(15)))
    w0 = full.circuit.weights.clone()
    st = full.em_statistics(x)
    full.apply_em(st, 1.0)
    half.apply_em(st, 0.5)
    torch.testing.assert_close(half.circuit.weights, 0.5 * w0 + 0.5 * full.circuit.weights, rtol=0, atol=1e-12)
    with pytest.raises(UserError, match="step_size"):
        half.apply_em(st, 1.5)


def test_statistics_of_another_circuit_are_rejected() -> None:
    kind = LEAF_KINDS[1]
    a = SPN(random_circuit((0, 1, 2), kind, np.random.default_rng(1)))
    st = a.em_statistics(_data(kind, 10, 1))
    with pytest.raises(UserError, match="do not match"):
        a.apply_em(CircuitStats(st.edge_counts[:-1], st.leaf))
    with pytest.raises(UserError, match="different circuits"):
        _ = st + CircuitStats(st.edge_counts[:-1], st.leaf)
    with pytest.raises(UserError, match="sample_weight"):
        a.em_statistics(np.zeros((2, 3)), np.array([1.0, -1.0]))


def test_models_implement_the_density_model_contract() -> None:
    from mpifc.circuit.base import DensityModel
    from mpifc.circuit.ratspn import RatSPN

    spn = SPN(random_circuit((0, 1), LEAF_KINDS[0], np.random.default_rng(0)))
    rat = RatSPN(4, depth=1, seed=0)
    for m in (spn, rat):
        assert isinstance(m, DensityModel)
        st = m.em_statistics(np.zeros((3, len(m.scope))))
        assert isinstance(st, EMStatistics)
        assert all(v.dtype == np.float64 for v in st.to_arrays().values())


def test_empty_shard_gives_zero_statistics_and_keeps_the_model() -> None:
    from mpifc.circuit.ratspn import RatSPN

    x = np.random.default_rng(0).normal(size=(20, 4))
    for m in (SPN(random_circuit((0, 1, 2, 3), LEAF_KINDS[4], np.random.default_rng(1))), RatSPN(4, depth=1, seed=0)):
        before = m.log_likelihood(x)
        empty = m.em_statistics(np.zeros((0, 4)))
        assert empty.n == 0.0 and all(np.all(v == 0) for v in empty.to_arrays().values())
        full = m.em_statistics(x)
        for k, v in (full + empty).to_arrays().items():
            np.testing.assert_array_equal(v, full.to_arrays()[k])
        m.apply_em(empty)
        torch.testing.assert_close(m.log_likelihood(x), before, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["histogram", "piecewise_linear"])
def test_em_with_tails_and_points_beyond_the_body(name: str) -> None:
    """Leaves with tail mass, data partly outside their bodies: EM stays monotone and finite."""
    from mpifc.circuit.leaves import fit_leaf

    rng = np.random.default_rng(12)
    x = np.column_stack([rng.normal(size=200), rng.normal(1.0, 2.0, size=200)])
    kids = []
    for part in (x[:80], x[80:]):  # bodies fitted on half the rows; the rest may fall outside
        kids.append(ProductNode([LeafNode(v, fit_leaf("real", part[:40, v], leaf=name, tail=1e-3))
                                 for v in range(2)]))
    spn = SPN(SumNode(kids, np.array([0.4, 0.6])))
    hist = batch_em(spn, x, n_iter=5)
    assert all(np.isfinite(hist))
    assert all(b >= a - 1e-9 for a, b in zip(hist, hist[1:])), hist
    assert hist[-1] > hist[0]
    a = spn.em_statistics(x).to_arrays()
    b = sum_statistics([spn.em_statistics(x[:70]), spn.em_statistics(x[70:])]).to_arrays()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-11, atol=1e-11)
