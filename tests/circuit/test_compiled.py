"""Queries of the compiled evaluator against brute force, for every leaf type (contract battery)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from mpifc.circuit import graph as G
from mpifc.circuit.leaves import Categorical
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

from .conftest import (CONTINUOUS_KINDS, DISCRETE_KINDS, LEAF_KINDS, LeafKind, enumerate_domain, grid, ids,
                       random_circuit)

N_CELLS = {"gaussian": 350, "histogram": 250, "piecewise_linear": 220}  # grid cells per axis


def _spn(kind: LeafKind, n_vars: int, seed: int = 0) -> SPN:
    return SPN(random_circuit(tuple(range(n_vars)), kind, np.random.default_rng(seed)))


def _grid2(kind: LeafKind) -> tuple[np.ndarray, np.ndarray, float]:
    pts, h = grid(kind, N_CELLS[kind.name])
    xy = np.array(list(itertools.product(pts, pts)))
    return pts, xy, h


# ------------------------------------------------------------------ normalisation and marginals


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_discrete_circuit_sums_to_one(kind: LeafKind) -> None:
    for seed in range(3):
        spn = _spn(kind, 3, seed)
        assert float(np.exp(spn.log_likelihood(enumerate_domain(kind, 3))).sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_continuous_circuit_integrates_to_one(kind: LeafKind) -> None:
    spn = _spn(kind, 2)
    pts, xy, h = _grid2(kind)
    assert float(np.exp(spn.log_likelihood(xy)).sum()) * h * h == pytest.approx(1.0, abs=2e-3)
    # 1-D marginals through NaN integrate to 1 as well.
    x = np.stack([pts, np.full_like(pts, np.nan)], 1)
    assert float(np.exp(spn.log_likelihood(x)).sum()) * h == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_nan_marginal_equals_enumeration(kind: LeafKind, rng: np.random.Generator) -> None:
    spn = _spn(kind, 3, 1)
    full = enumerate_domain(kind, 3)
    p = np.exp(spn.log_likelihood(full))
    rows = full[rng.integers(0, len(full), 40)]
    mask = rng.random(rows.shape) < 0.5  # a different missing pattern per sample
    x = np.where(mask, np.nan, rows)
    got = np.exp(spn.log_likelihood(x))
    for i in range(len(x)):
        match = np.all(mask[i] | (full == rows[i]), axis=1)
        assert got[i] == pytest.approx(p[match].sum(), rel=1e-10)


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_nan_marginal_equals_integration(kind: LeafKind) -> None:
    spn = _spn(kind, 2, 2)
    pts, h = grid(kind, N_CELLS[kind.name])
    for x0 in (pts[17], pts[len(pts) // 2], pts[-40]):
        num = float(np.exp(spn.log_likelihood(np.stack([np.full_like(pts, x0), pts], 1))).sum()) * h
        got = float(np.exp(spn.log_likelihood(np.array([[x0, np.nan]])))[0])
        assert got == pytest.approx(num, rel=2e-3, abs=1e-6)


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_conditional_equals_enumeration(kind: LeafKind, rng: np.random.Generator) -> None:
    spn = _spn(kind, 3, 3)
    full = enumerate_domain(kind, 3)
    p = np.exp(spn.log_likelihood(full))
    x = full[rng.integers(0, len(full), 20)]
    got = spn.conditional(x, [0, 2])
    for i in range(len(x)):
        ev = full[:, 1] == x[i, 1]
        joint = p[np.all(full == x[i], axis=1)].sum()
        assert np.exp(got[i]) == pytest.approx(joint / p[ev].sum(), rel=1e-10)
    # conditional == joint - marginal, and conditionals over the query domain sum to 1
    m = x.copy()
    m[:, [0, 2]] = np.nan
    np.testing.assert_allclose(got, spn.log_likelihood(x) - spn.log_likelihood(m), atol=1e-12)
    ev_row = np.array([[np.nan, x[0, 1], np.nan]])
    qs = np.array([[a, x[0, 1], b] for a in kind.domain for b in kind.domain])
    assert float(np.exp(spn.conditional(qs, [0, 2])).sum()) == pytest.approx(1.0, abs=1e-12)
    assert ev_row.shape == (1, 3)


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_continuous_conditional_integrates_to_one(kind: LeafKind) -> None:
    spn = _spn(kind, 2, 4)
    pts, h = grid(kind, N_CELLS[kind.name])
    x1 = pts[len(pts) // 3]
    c = spn.conditional(np.stack([pts, np.full_like(pts, x1)], 1), [0])
    assert float(np.exp(c).sum()) * h == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_predict_proba_equals_enumeration(kind: LeafKind, rng: np.random.Generator) -> None:
    spn = _spn(kind, 3, 5)
    full = enumerate_domain(kind, 3)
    p = np.exp(spn.log_likelihood(full))
    x = full[rng.integers(0, len(full), 10)].copy()
    x[::2, 0] = np.nan  # other missing features are marginalised
    classes, proba = spn.classes(2), spn.predict_proba(x, target=2)
    np.testing.assert_array_equal(classes, np.array(kind.domain))
    for i in range(len(x)):
        obs = ~np.isnan(x[i])
        obs[2] = False
        match = np.all(full[:, obs] == x[i, obs], axis=1)
        want = np.array([p[match & (full[:, 2] == c)].sum() for c in classes])
        np.testing.assert_allclose(proba[i], want / want.sum(), rtol=1e-10)
    np.testing.assert_array_equal(spn.predict(x, 2), classes[proba.argmax(1)])


def test_predict_on_continuous_target_is_a_user_error() -> None:
    spn = _spn(CONTINUOUS_KINDS[0], 2)
    with pytest.raises(UserError, match="continuous"):
        spn.predict(np.zeros((1, 2)), 1)


# ------------------------------------------------------------------ MPE


def _selective(kind: LeafKind, rng: np.random.Generator, n_rest: int) -> G.Node:
    """Root sum over the values of a categorical x0; each branch a product of single leaves.
    Every sum is selective, so max-product is the exact MPE."""
    kids = []
    for v in range(3):
        ind = G.LeafNode(0, Categorical(np.eye(3)[v], alpha=0.0))
        kids.append(G.ProductNode([ind] + [G.LeafNode(1 + j, kind.make(rng)) for j in range(n_rest)]))
    return G.SumNode(kids, rng.dirichlet(np.ones(3)))


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_mpe_equals_bruteforce_argmax_on_selective_circuit(kind: LeafKind, rng: np.random.Generator) -> None:
    spn = SPN(_selective(kind, rng, 2))
    dom0 = (0.0, 1.0, 2.0)
    full = np.array(list(itertools.product(dom0, kind.domain, kind.domain)))
    p = spn.log_likelihood(full)
    for mask in itertools.product([False, True], repeat=3):
        row = full[rng.integers(len(full))]
        x = np.where(mask, np.nan, row)[None]
        got = spn.mpe(x)[0]
        match = np.all(np.array(mask) | (full == row), axis=1)
        best = p[match].max()
        assert float(spn.log_likelihood(got[None])[0]) == pytest.approx(best, abs=1e-12)
        np.testing.assert_array_equal(got[~np.array(mask)], row[~np.array(mask)])


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_mpe_maximises_the_max_product_value(kind: LeafKind, rng: np.random.Generator) -> None:
    """On non-selective circuits MPE is the best induced tree: check against brute force."""
    spn = _spn(kind, 3, 6)
    full = enumerate_domain(kind, 3)
    mp = spn.circuit.max_log_value(full).numpy()
    x = full[rng.integers(0, len(full), 12)].copy()
    x[rng.random(x.shape) < 0.5] = np.nan
    got = spn.mpe(x)
    for i in range(len(x)):
        match = np.all(np.isnan(x[i]) | (full == x[i]), axis=1)
        assert spn.circuit.max_log_value(got[i:i + 1]).item() == pytest.approx(mp[match].max(), abs=1e-12)
        assert spn.circuit.max_log_value(x[i:i + 1]).item() == pytest.approx(mp[match].max(), abs=1e-12)


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_continuous_mpe_beats_every_grid_point(kind: LeafKind, rng: np.random.Generator) -> None:
    spn = SPN(_selective(kind, rng, 1))
    pts, _ = grid(kind, 3000)
    cand = np.array([[v, t] for v in (0.0, 1.0, 2.0) for t in pts])
    best = spn.log_likelihood(cand).max().item()
    got = spn.mpe(np.array([[np.nan, np.nan]]))
    assert float(spn.log_likelihood(got)[0]) >= best - 1e-9


# ------------------------------------------------------------------ sampling


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_sample_frequencies_match_probabilities(kind: LeafKind) -> None:
    spn = _spn(kind, 3, 7)
    full = enumerate_domain(kind, 3)
    p = np.exp(spn.log_likelihood(full))
    s = spn.sample(20000, np.random.default_rng(11))
    obs = np.array([np.all(s == r, axis=1).sum() for r in full])
    assert obs.sum() == len(s)
    assert stats.chisquare(obs, p * len(s)).pvalue > 1e-3


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_continuous_sample_marginal_matches(kind: LeafKind) -> None:
    spn = _spn(kind, 2, 8)
    pts, h = grid(kind, N_CELLS[kind.name])
    dens = np.exp(spn.log_likelihood(np.stack([pts, np.full_like(pts, np.nan)], 1))) * h
    s = spn.sample(8000, 12)
    edges = np.linspace(pts[0] - h / 2, pts[-1] + h / 2, 11)
    p = np.array([dens[(pts >= a) & (pts < b)].sum() for a, b in zip(edges[:-1], edges[1:])])
    obs, _ = np.histogram(s[:, 0], bins=edges)
    keep = p > 1e-6
    assert obs[~keep].sum() == 0 and obs.sum() == len(s)
    assert stats.chisquare(obs[keep], p[keep] / p[keep].sum() * obs.sum()).pvalue > 1e-3


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_conditional_sampling_respects_evidence(kind: LeafKind) -> None:
    spn = _spn(kind, 3, 9)
    full = enumerate_domain(kind, 3)
    p = np.exp(spn.log_likelihood(full))
    e = kind.domain[1]
    ev = np.full((12000, 3), np.nan)
    ev[:, 1] = e
    s = spn.sample(len(ev), np.random.default_rng(13), evidence=ev)
    assert np.all(s[:, 1] == e)
    sub = full[full[:, 1] == e]
    q = p[full[:, 1] == e]
    obs = np.array([np.all(s == r, axis=1).sum() for r in sub])
    assert obs.sum() == len(s)
    assert stats.chisquare(obs, q / q.sum() * len(s)).pvalue > 1e-3


def test_sampling_is_deterministic_per_seed() -> None:
    spn = _spn(DISCRETE_KINDS[1], 3)
    np.testing.assert_array_equal(spn.sample(50, 3), spn.sample(50, 3))
    assert not np.array_equal(spn.sample(50, 3), spn.sample(50, 4))


# ------------------------------------------------------------------ robustness


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_no_nan_for_extreme_inputs(kind: LeafKind) -> None:
    spn = _spn(kind, 3, 10)
    x = np.array([[1e300, -1e300, np.inf], [np.nan, 1e-300, -np.inf], [np.nan] * 3, [5e7, 0.0, 1.0]])
    ll = spn.log_likelihood(x)
    assert np.all(np.isfinite(ll)) and ll[2].item() == pytest.approx(0.0, abs=1e-12)
    assert not np.any(np.isnan(spn.mpe(x)))
    assert not np.any(np.isnan(spn.sample(4, 0, evidence=x)))
    st = spn.em_statistics(x)
    assert all(np.all(np.isfinite(v)) for v in st.to_arrays().values())
    spn.apply_em(st)
    assert np.all(np.isfinite(spn.log_likelihood(x)))


def test_bad_input_shape_is_a_user_error() -> None:
    spn = _spn(DISCRETE_KINDS[0], 3)
    with pytest.raises(UserError, match=r"expected shape \(batch, 3\)"):
        spn.log_likelihood(np.zeros((2, 4)))


def test_dag_with_shared_subcircuit_sums_to_one(rng: np.random.Generator) -> None:
    kind = DISCRETE_KINDS[0]
    shared = random_circuit((1, 2), kind, rng)
    root = G.SumNode([G.ProductNode([G.LeafNode(0, kind.make(rng)), shared]),
                      G.ProductNode([G.LeafNode(0, kind.make(rng)), shared])], [0.25, 0.75])
    assert float(np.exp(SPN(root).log_likelihood(enumerate_domain(kind, 3))).sum()) == pytest.approx(1.0, abs=1e-12)


def test_non_contiguous_scope_uses_columns_in_scope_order() -> None:
    kind = DISCRETE_KINDS[1]
    root = random_circuit((2, 5, 9), kind, np.random.default_rng(0))
    spn = SPN(root)
    assert spn.scope == (2, 5, 9)
    assert float(np.exp(spn.log_likelihood(enumerate_domain(kind, 3))).sum()) == pytest.approx(1.0, abs=1e-12)
    c = spn.conditional(enumerate_domain(kind, 3)[:3], [5])
    assert np.all(np.isfinite(c))
