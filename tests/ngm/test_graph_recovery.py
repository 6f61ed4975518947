"""Local graph recovery by the graphical lasso, and expert graphs."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.ngm.graph_recovery import expert_graph, recover_graph
from mpifc.ngm.schema import Schema, categorical, real


def gaussian_chain(n: int, d: int, rho: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.empty((n, d))
    x[:, 0] = rng.standard_normal(n)
    for j in range(1, d):
        x[:, j] = rho * x[:, j - 1] + np.sqrt(1 - rho ** 2) * rng.standard_normal(n)
    return x


def test_graphical_lasso_recovers_a_chain():
    d = 6
    x = gaussian_chain(4000, d, 0.6, seed=0)
    # Shuffle the columns so that the chain is not simply the index order.
    perm = np.random.default_rng(1).permutation(d)
    schema = Schema(tuple(real(f"v{j}") for j in range(d)))
    g = recover_graph(x[:, perm], schema, alpha=0.05, tol=0.02)
    inv = np.argsort(perm)  # column c of the shuffled data holds chain position perm[c]
    expected = {frozenset((f"v{inv[j]}", f"v{inv[j + 1]}")) for j in range(d - 1)}
    assert g.edges() == expected


def test_recovery_maps_one_hot_columns_back_to_features():
    rng = np.random.default_rng(0)
    n = 3000
    a = rng.standard_normal(n)
    # A 4-valued categorical driven by a; b independent of both.
    cat = np.digitize(a + 0.3 * rng.standard_normal(n), [-1.0, 0.0, 1.0]).astype(float)
    b = rng.standard_normal(n)
    schema = Schema((real("a"), categorical("k", 4), real("b")))
    g = recover_graph(np.stack([a, cat, b], 1), schema, alpha=0.05, tol=0.02)
    assert g.edges() == {frozenset(("a", "k"))}
    assert not g.adjacency.diagonal().any()


def test_recovery_survives_constant_and_empty_columns():
    rng = np.random.default_rng(0)
    x = np.stack([rng.standard_normal(200), np.full(200, 3.0), np.zeros(200)], 1)
    g = recover_graph(x, Schema((real("a"), real("const"), categorical("never", 3))))
    assert g.edges() == set()


def test_recovery_names_the_bad_feature():
    x = np.array([[0.0, 1.0], [1.0, np.nan]])
    with pytest.raises(UserError, match="'y'"):
        recover_graph(x, Schema((real("x"), real("y"))))
    with pytest.raises(UserError, match="'k'"):
        recover_graph(np.array([[0.0, 5.0], [1.0, 0.0]]), Schema((real("x"), categorical("k", 3))))


def test_expert_graph():
    a = np.array([[1, 1, 0], [0, 0, 1], [0, 0, 0]])
    g = expert_graph(("x", "y", "z"), a, symmetrize=True)
    assert g.edges() == {frozenset("xy"), frozenset("yz")}
    with pytest.raises(UserError, match="symmetric"):
        expert_graph(("x", "y", "z"), a)
    with pytest.raises(UserError, match="0/1"):
        expert_graph(("x", "y"), np.array([[0, 2], [2, 0]]))
