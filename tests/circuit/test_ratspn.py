"""Tensorised RAT-SPN: brute force on tiny models, and agreement with its explicit graph."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from mpifc.circuit.em import batch_em, sum_statistics
from mpifc.circuit.graph import count_nodes, validate
from mpifc.circuit.ratspn import RatSPN, RatStats
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

PRODUCTS = ["outer", "elementwise"]
LEAVES = [("gaussian", {"min_var": 1e-3}), ("bernoulli", {}), ("categorical", {"n_categories": 3}),
          ("discretized_gaussian", {"levels": 3, "bin_width": 0.5})]


def _tiny_binary(product: str, seed: int = 0) -> RatSPN:
    return RatSPN(5, depth=2, repetitions=3, num_sums=3, num_leaves=3, num_roots=2, leaf="bernoulli",
                  product=product, seed=seed)


def _data(leaf: str, n: int, n_vars: int, seed: int, nan: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if leaf == "gaussian":
        x = rng.normal(size=(n, n_vars)) + np.arange(n_vars) * 0.3
    else:
        x = rng.integers(0, 2 if leaf == "bernoulli" else 3, (n, n_vars)).astype(float)
    if nan:
        x[rng.random(x.shape) < 0.25] = np.nan
    return x


@pytest.mark.parametrize("product", PRODUCTS)
def test_tiny_binary_sums_to_one(product: str) -> None:
    m = _tiny_binary(product)
    full = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    assert float(np.exp(m.log_likelihood(full)).sum()) == pytest.approx(1.0, abs=1e-12)
    # marginal through NaN == enumeration over the missing variables
    p = np.exp(m.log_likelihood(full))
    x = full[[3, 17, 30]].copy()
    x[0, [1, 4]] = np.nan
    x[1, :3] = np.nan
    got = np.exp(m.log_likelihood(x))
    for i in range(3):
        match = np.all(np.isnan(x[i]) | (full == x[i]), axis=1)
        assert got[i] == pytest.approx(p[match].sum(), rel=1e-11)


@pytest.mark.parametrize("leaf, kw", LEAVES, ids=[l for l, _ in LEAVES])
def test_all_missing_has_log_likelihood_zero(leaf: str, kw: dict) -> None:
    m = RatSPN(9, depth=3, repetitions=2, num_sums=2, num_leaves=2, leaf=leaf, leaf_kwargs=kw, seed=1)
    ll = m.log_likelihood(np.full((3, 9), np.nan))
    np.testing.assert_allclose(ll, np.zeros(3), rtol=0, atol=1e-12)


@pytest.mark.parametrize("product", PRODUCTS)
@pytest.mark.parametrize("leaf, kw", LEAVES, ids=[l for l, _ in LEAVES])
@pytest.mark.parametrize("nan", [False, True], ids=["complete", "missing"])
def test_matches_explicit_graph(product: str, leaf: str, kw: dict, nan: bool) -> None:
    m = RatSPN(7, depth=2, repetitions=2, num_sums=2, num_leaves=2, num_roots=2, leaf=leaf, leaf_kwargs=kw,
               product=product, seed=2)
    root = m.to_graph()
    validate(root)
    g = SPN(root)
    assert g.num_parameters() == m.num_parameters()
    x = _data(leaf, 30, 7, 3, nan)
    torch.testing.assert_close(m.log_likelihood(x), g.log_likelihood(x), rtol=0, atol=1e-11)
    # MPE: same max-product value as the graph evaluator's backtracking
    a, b = m.mpe(x), g.mpe(x)
    torch.testing.assert_close(g.circuit.max_log_value(a), g.circuit.max_log_value(b), rtol=0, atol=1e-10)
    # EM: one step on each gives the same model
    m.apply_em(m.em_statistics(x))
    g.apply_em(g.em_statistics(x))
    torch.testing.assert_close(m.log_likelihood(x), g.log_likelihood(x), rtol=0, atol=1e-9)


def test_mpe_maximises_max_product_value_by_brute_force() -> None:
    m = _tiny_binary("outer", 3)
    g = SPN(m.to_graph())
    full = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    mp = g.circuit.max_log_value(full).numpy()
    x = full[[5, 9, 22, 31]].copy()
    x[0, :] = np.nan
    x[1, [0, 2]] = np.nan
    x[2, 4] = np.nan
    got = m.mpe(x)
    for i in range(len(x)):
        obs = ~np.isnan(x[i])
        np.testing.assert_array_equal(got[i, obs], x[i, obs])
        match = np.all(~obs | (full == x[i]), axis=1)
        assert g.circuit.max_log_value(got[i:i + 1]).item() == pytest.approx(mp[match].max(), abs=1e-12)


@pytest.mark.parametrize("product", PRODUCTS)
def test_sample_frequencies_match(product: str) -> None:
    m = _tiny_binary(product, 4)
    full = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    p = np.exp(m.log_likelihood(full))
    s = m.sample(20000, 5)
    obs = np.array([np.all(s == r, axis=1).sum() for r in full])
    assert obs.sum() == len(s)
    assert stats.chisquare(obs, p * len(s)).pvalue > 1e-3


def test_conditional_sampling_respects_evidence() -> None:
    m = _tiny_binary("outer", 6)
    full = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    p = np.exp(m.log_likelihood(full))
    ev = np.full((15000, 5), np.nan)
    ev[:, 0], ev[:, 3] = 1.0, 0.0
    s = m.sample(len(ev), 7, evidence=ev)
    assert np.all(s[:, 0] == 1.0) and np.all(s[:, 3] == 0.0) and not np.any(np.isnan(s))
    sel = (full[:, 0] == 1) & (full[:, 3] == 0)
    obs = np.array([np.all(s == r, axis=1).sum() for r in full[sel]])
    assert stats.chisquare(obs, p[sel] / p[sel].sum() * len(s)).pvalue > 1e-3


@pytest.mark.parametrize("leaf, kw", LEAVES, ids=[l for l, _ in LEAVES])
def test_em_never_decreases_train_ll_and_stats_add_up(leaf: str, kw: dict) -> None:
    m = RatSPN(8, depth=2, repetitions=2, num_sums=3, num_leaves=3, leaf=leaf, leaf_kwargs=kw, seed=8)
    x = _data(leaf, 200, 8, 9, nan=True)
    w = np.random.default_rng(1).uniform(0.5, 1.5, len(x))
    whole = m.em_statistics(x, w)
    parts = sum_statistics([m.em_statistics(x[:70], w[:70]), m.em_statistics(x[70:], w[70:])])
    a, b = whole.to_arrays(), parts.to_arrays()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-10, atol=1e-10)
    assert isinstance(RatStats.from_arrays(b), RatStats)
    hist = batch_em(m, x, n_iter=5, sample_weight=w)
    assert all(q >= p - 1e-9 for p, q in zip(hist, hist[1:])), hist
    assert hist[-1] > hist[0]


def test_same_seed_same_model_and_no_nan_at_extremes() -> None:
    a = RatSPN(10, depth=2, repetitions=3, seed=11)
    b = RatSPN(10, depth=2, repetitions=3, seed=11)
    c = RatSPN(10, depth=2, repetitions=3, seed=12)
    x = _data("gaussian", 20, 10, 0, nan=True)
    assert np.array_equal(a.log_likelihood(x), b.log_likelihood(x))
    assert not np.array_equal(a.log_likelihood(x), c.log_likelihood(x))
    # variance at the floor, huge values, infinities
    m = RatSPN(10, depth=2, repetitions=3, leaf_kwargs={"min_var": 1e-6}, seed=11)
    const = np.zeros((1000, 10))
    batch_em(m, const, n_iter=2)
    real = m.real[..., None].expand(*m._shape).reshape(-1)  # padding slots see no data
    # at the floor, or untouched (1.0) where a component's flow stayed below k rows' worth
    var = m.P["var"][real]
    assert torch.all((var == 1e-6) | (var == 1.0)) and (var == 1e-6).float().mean() > 0.5
    assert torch.all(m.P["var"][~real] == 1.0)
    xx = np.array([[1e300] * 10, [-np.inf] + [0.0] * 9, [np.nan] * 10, [0.0] * 10])
    assert np.all(np.isfinite(m.log_likelihood(xx)))
    assert not np.any(np.isnan(m.mpe(xx))) and not np.any(np.isnan(m.sample(4, 0, evidence=xx)))
    st = m.em_statistics(xx)
    assert all(np.all(np.isfinite(v)) for v in st.to_arrays().values())
    m.apply_em(st)
    assert all(bool(torch.all(torch.isfinite(W))) for W in m.weights)


def test_size_formula_matches_spflow_configuration() -> None:
    # 784 Gaussian inputs, depth 4, 5 repetitions, K = 10, elementwise products, one root per rep.
    m = RatSPN(784, depth=4, repetitions=5, num_sums=10, num_leaves=10, product="elementwise", seed=0)
    R, K = 5, 10
    sums = R * (8 + 4 + 2) * K * K + R * 1 * 1 * K
    assert m.num_parameters() == 784 * K * R * 2 + sums + R
    small = RatSPN(6, depth=2, repetitions=2, num_sums=2, num_leaves=3, num_roots=2, seed=0)
    c = count_nodes(small.to_graph())
    assert c["sum"] == 2 * (2 * 2 + 2) + 1  # per rep: 2 regions x 2 sums, top region 2 roots; plus root


@pytest.mark.parametrize("kwargs, msg", [({"n_vars": 3, "depth": 2}, "n_vars >= 2\\*\\*depth"),
                                         ({"n_vars": 4, "depth": 1, "leaf": "cauchy"}, "unknown leaf"),
                                         ({"n_vars": 4, "depth": 1, "product": "kron"}, "product"),
                                         ({"n_vars": 4, "depth": 1, "product": "elementwise", "num_leaves": 3,
                                           "num_sums": 2}, "num_leaves == num_sums")])
def test_bad_configuration_is_a_user_error(kwargs: dict, msg: str) -> None:
    with pytest.raises(UserError, match=msg):
        RatSPN(**kwargs)
    with pytest.raises(UserError, match="expected shape"):
        RatSPN(4, depth=1).log_likelihood(np.zeros((2, 5)))


def test_online_em_improves_and_stays_finite() -> None:
    from mpifc.circuit.em import online_em

    m = RatSPN(8, depth=2, repetitions=2, num_sums=3, num_leaves=3, seed=13)
    x = _data("gaussian", 400, 8, 14, nan=True)
    before = float(m.log_likelihood(x).mean())
    hist = online_em(m, x, batch_size=50, n_epochs=2, step_size=0.3, rng=0)
    assert len(hist) == 16 and np.all(np.isfinite(hist))
    assert float(m.log_likelihood(x).mean()) > before
    for W in m.weights:
        torch.testing.assert_close(W.sum(-1), torch.ones_like(W.sum(-1)), rtol=0, atol=1e-12)
