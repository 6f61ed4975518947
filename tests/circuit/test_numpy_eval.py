"""The numpy evaluator (:mod:`mpifc.circuit.numpy_eval`) equals the torch evaluator to 1e-9.

LearnSPN fits with every leaf family it offers, random circuits of every leaf type (the
conftest battery, DiscretizedGaussian included), values outside the leaves' support, NaN
(marginalised) entries, and circuits whose wide discrete products take the torch evaluator's
:class:`~mpifc.circuit.compiled.RootPlan`.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit.graph import LeafNode, ProductNode, SumNode
from mpifc.circuit.leaves import Bernoulli, Categorical
from mpifc.circuit.learnspn import learn_spn
from mpifc.circuit.numpy_eval import NumpyCircuit
from mpifc.circuit.spn import SPN
from tests.circuit.conftest import LEAF_KINDS, ids, random_circuit

TOL = 1e-9


def _table(n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    r = np.random.default_rng(seed)
    z = r.normal(size=n)
    x = np.column_stack([
        z + 0.3 * r.normal(size=n),                          # real
        np.where(r.random(n) < 0.3, 0.0, np.exp(z)),         # real with a point mass at 0
        (z + r.normal(size=n) > 0).astype(float),            # binary
        np.clip(np.round(z + 1 + r.normal(size=n)), 0, 3),   # discrete 0..3
        r.integers(0, 3, n).astype(float),                   # categorical
        2.0 * z + r.normal(size=n),                          # real
    ])
    return x, ["real", "real", "discrete", "discrete", "categorical", "real"]


def _queries(x: np.ndarray, seed: int) -> np.ndarray:
    """Training-like rows, rows beyond the training range, and rows with NaN entries."""
    r = np.random.default_rng(seed)
    q = np.concatenate([x[:50], x[:20] * 3.0 + 1.0, x[:40]])
    q[-40:][r.random((40, x.shape[1])) < 0.4] = np.nan
    q[-1] = np.nan  # every variable marginalised: log 1 = 0
    return q


def _close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


@pytest.mark.parametrize("leaf", ["auto", "gaussian", "histogram", "piecewise", "mixed"])
def test_learnspn_numpy_equals_torch(leaf):
    x, meta = _table(400, 0)
    spn = learn_spn(x, meta, seed=0, leaf=leaf, min_instances_slice=40, threshold=0.3)
    q = _queries(x, 1)
    got = spn.log_likelihood_numpy(q)
    _close(got, spn.log_likelihood(q))
    assert abs(got[-1]) < 1e-9


def test_learnspn_class_split_numpy_equals_torch():
    x, meta = _table(300, 2)
    spn = learn_spn(x, meta, seed=3, class_column=4, min_instances_slice=30)
    q = _queries(x, 4)
    _close(spn.log_likelihood_numpy(q), spn.log_likelihood(q))
    disc = [2, 3, 4]  # the G-test column split: discrete columns only
    spn = learn_spn(x[:, disc], [meta[j] for j in disc], seed=3, class_column=2, min_instances_slice=30,
                    col_split="gtest")
    q = _queries(x[:, disc], 5)
    _close(spn.log_likelihood_numpy(q), spn.log_likelihood(q))


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_random_circuits_numpy_equals_torch(kind):
    r = np.random.default_rng(5)
    root = random_circuit((0, 1, 2, 3), kind, r)
    spn = SPN(root)
    if kind.domain is not None:
        q = r.choice(np.asarray(kind.domain + (-1.0, 0.5, 99.0)), size=(64, 4))
    else:
        q = r.uniform(kind.box[0] - 2.0, kind.box[1] + 2.0, size=(64, 4))
    q[r.random(q.shape) < 0.3] = np.nan
    _close(NumpyCircuit(root).log_likelihood(q), spn.log_likelihood(q))


def test_root_plan_circuit_numpy_equals_torch():
    """Wide products of Bernoulli and Categorical leaves: the torch root-only queries run on the
    RootPlan (another summation order), the numpy evaluator on the generic layout."""
    r = np.random.default_rng(7)
    d = 300

    def product() -> ProductNode:
        kids = [LeafNode(v, Bernoulli(float(r.uniform(0.05, 0.95))) if v % 3 else
                         Categorical(r.dirichlet(np.ones(4)))) for v in range(d)]
        return ProductNode(kids)

    root = SumNode([product() for _ in range(12)], r.dirichlet(np.ones(12)))
    spn = SPN(root)
    assert spn.circuit.root_plan() is not None
    q = np.where(np.arange(d) % 3 == 0, r.integers(0, 4, (80, d)), r.integers(0, 2, (80, d))).astype(float)
    q[r.random(q.shape) < 0.1] = np.nan
    _close(spn.log_likelihood_numpy(q), spn.log_likelihood(q))


def test_numpy_path_follows_em_updates():
    x, meta = _table(300, 8)
    spn = learn_spn(x, meta, seed=0, min_instances_slice=40)
    q = _queries(x, 9)
    before = spn.log_likelihood_numpy(q)
    spn.apply_em(spn.em_statistics(x[:100]))
    after = spn.log_likelihood_numpy(q)
    assert not np.allclose(before, after)
    _close(after, spn.log_likelihood(q))
