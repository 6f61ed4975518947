"""Contract tests: the same battery against every leaf type."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from mpifc.circuit.leaves import (LEAF_TYPES, LOG_ZERO, Bernoulli, Categorical, DiscretizedGaussian,
                                  Gaussian, Histogram, PiecewiseLinear, fit_leaf)
from mpifc.errors import UserError

from .conftest import CONTINUOUS_KINDS, DISCRETE_KINDS, LEAF_KINDS, LeafKind, grid, ids


def _total_mass(kind: LeafKind, leaf) -> float:
    if kind.domain is not None:
        return float(leaf.log_prob(np.array(kind.domain)).exp().sum())
    h = 0.005
    pts, h = grid(kind, int(round((kind.box[1] - kind.box[0]) / h)))
    return float(leaf.log_prob(pts).exp().sum()) * h


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_normalised(kind: LeafKind, rng: np.random.Generator) -> None:
    for _ in range(3):
        assert _total_mass(kind, kind.make(rng)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_nan_is_marginalised_and_extremes_are_finite(kind: LeafKind, rng: np.random.Generator) -> None:
    leaf = kind.make(rng)
    x = np.array([np.nan, 1e300, -1e300, np.inf, -np.inf, 0.5, 1e-300])
    lp = leaf.log_prob(x)
    assert lp[0] == 0.0
    assert torch.all(torch.isfinite(lp))
    assert torch.all(lp <= 50)


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_mode_is_most_probable(kind: LeafKind, rng: np.random.Generator) -> None:
    leaf = kind.make(rng)
    if kind.domain is not None:
        pts = np.array(kind.domain)
    else:
        pts, _ = grid(kind, 2000)
    best = float(leaf.log_prob(pts).max())
    assert float(leaf.log_prob([leaf.mode()])[0]) >= best - 1e-9


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_log_bound_is_at_least_every_log_value(kind: LeafKind, rng: np.random.Generator) -> None:
    """``np_log_bound``: at least 0 and at least every value's log-density (on a fine grid, at the
    mode, far out and in the tails), per leaf of a stack; what the flat evaluator's floors use."""
    leaves = [kind.make(rng) for _ in range(4)] + ([_tailed(kind.name, 0.3)] if kind.name in _TAILED else [])
    if kind.name == "gaussian":
        leaves.append(Gaussian(0.2, 1e-4, min_var=1e-6))  # a density far above 1
    cls = type(leaves[0])
    P = cls.stack_numpy(leaves)
    bound = cls.np_log_bound(P)
    pts = np.array(kind.domain) if kind.domain is not None else grid(kind, 4000)[0]
    pts = np.concatenate([pts, [lf.mode() for lf in leaves], [-1e6, -3.0, 3.0, 1e6, np.nan]])
    lp = cls.np_log_prob(P, np.repeat(pts[:, None], len(leaves), axis=1))
    assert np.all(bound >= 0) and np.all(lp <= bound[None, :] + 1e-12)


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_sample_frequencies_match(kind: LeafKind) -> None:
    rng = np.random.default_rng(7)
    leaf = kind.make(rng)
    s = leaf.sample(4000, np.random.default_rng(8))
    if kind.domain is not None:
        p = leaf.log_prob(np.array(kind.domain)).exp().numpy()
        obs = np.array([(s == v).sum() for v in kind.domain])
        assert obs.sum() == len(s)
    else:
        edges = np.linspace(*kind.box, 9) if kind.name != "gaussian" else np.array([-7, -1, -0.5, 0, 0.5, 1, 7.0])
        pts, h = grid(kind, 7000)
        dens = leaf.log_prob(pts).exp().numpy() * h
        p = np.array([dens[(pts >= a) & (pts < b)].sum() for a, b in zip(edges[:-1], edges[1:])])
        obs, _ = np.histogram(s, bins=edges)
        assert obs.sum() == len(s)
    keep = p > 1e-9
    assert stats.chisquare(obs[keep], p[keep] / p[keep].sum() * obs.sum()).pvalue > 1e-3


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=ids(LEAF_KINDS))
def test_stack_unstack_round_trip(kind: LeafKind, rng: np.random.Generator) -> None:
    leaves = [kind.make(rng) for _ in range(4)]
    cls = type(leaves[0])
    back = cls.unstack(cls.stack(leaves))
    x = np.array(kind.domain if kind.domain else [-0.5, 0.0, 0.7])
    for a, b in zip(leaves, back):
        assert torch.equal(a.log_prob(x), b.log_prob(x))
        assert a.num_parameters() == b.num_parameters()


@pytest.mark.parametrize("kind", [k for k in LEAF_KINDS if k.em], ids=ids([k for k in LEAF_KINDS if k.em]))
def test_em_update_never_decreases_weighted_ll(kind: LeafKind, rng: np.random.Generator) -> None:
    leaf = kind.make(rng)
    data = kind.make(rng).sample(300, rng)
    data[::17] = np.nan
    w = rng.uniform(0, 2, len(data))
    prev = float((w * leaf.log_prob(data).numpy()).sum())
    for _ in range(4):
        leaf.em_update(leaf.em_statistics(data, w))
        cur = float((w * leaf.log_prob(data).numpy()).sum())
        assert cur >= prev - 1e-9
        prev = cur


_CLOSED_FORM_M = [k for k in LEAF_KINDS if k.em and k.name not in ("discretized_gaussian", "piecewise_linear")]


@pytest.mark.parametrize("kind", _CLOSED_FORM_M, ids=ids(_CLOSED_FORM_M))
def test_em_update_equals_weighted_fit(kind: LeafKind, rng: np.random.Generator) -> None:
    """For exponential-family leaves one M-step from any start is the weighted MLE."""
    leaf = kind.make(rng)
    data = kind.make(rng).sample(200, rng)
    w = rng.uniform(0, 2, len(data))
    hp = {k: float(v) for k, v in leaf.params().items() if k in ("alpha", "min_var", "tail")}
    if kind.name.startswith("histogram"):
        hp["breaks"] = leaf.params()["breaks"]
        hp["discrete"] = bool(leaf.params()["discrete"])
    fitted = type(leaf).fit(data, w, **hp)
    leaf.em_update(leaf.em_statistics(data, w))
    probe = np.array(kind.domain if kind.domain else [-0.9, -0.1, 0.3, 1.1])
    np.testing.assert_allclose(leaf.log_prob(probe).numpy(), fitted.log_prob(probe).numpy(), rtol=1e-9, atol=1e-9)


def test_em_statistics_are_additive(rng: np.random.Generator) -> None:
    for kind in LEAF_KINDS:
        leaf = kind.make(rng)
        data = kind.make(rng).sample(100, rng)
        w = rng.uniform(0, 1, 100)
        a, b, both = leaf.em_statistics(data[:40], w[:40]), leaf.em_statistics(data[40:], w[40:]), leaf.em_statistics(data, w)
        for k in both:
            np.testing.assert_allclose(a[k] + b[k], both[k], rtol=1e-12, atol=1e-12)


def test_empty_leaf_keeps_parameters() -> None:
    g = Gaussian(0.3, 0.5)
    g.em_update(g.em_statistics(np.array([np.nan, np.nan])))
    assert g.params()["mean"] == 0.3 and g.params()["var"] == 0.5
    b = Bernoulli(0.3, alpha=0.0)
    b.em_update(b.em_statistics(np.array([1.0]), np.array([0.0])))
    assert float(b.params()["p"]) == 0.3


def test_a_gaussian_with_less_than_k_rows_of_flow_keeps_its_parameters() -> None:
    # fitted to one row (its flow ~1, everyone else's ~0) the mean would be that row's value
    x = np.array([7.25, 0.1, -0.3, 0.2, 0.4, -0.1])
    g = Gaussian(0.0, 1.0)
    g.em_update(g.em_statistics(x, np.array([1.0, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9])))
    assert g.params()["mean"] == 0.0 and g.params()["var"] == 1.0
    g.em_update(g.em_statistics(x[:5], np.full(5, 1.0)))  # k rows' worth: updated
    assert g.params()["mean"] == pytest.approx(x[:5].mean())


def test_variance_floor_and_ceiling() -> None:
    g = Gaussian.fit(np.full(10, 2.0), min_var=1e-4)
    assert float(g.params()["var"]) == 1e-4
    assert torch.isfinite(g.log_prob([2.0, 1e200])).all()
    g = Gaussian.fit(np.array([-100.0, 100.0]), min_var=1e-3, max_var=0.25)
    assert float(g.params()["var"]) == 0.25
    g.em_update(g.em_statistics(np.full(5, 5.0)))
    assert float(g.params()["var"]) == 1e-3


def test_laplace_smoothing_never_gives_zero_or_one() -> None:
    b = Bernoulli.fit(np.ones(50), alpha=0.1)
    assert 0 < float(b.params()["p"]) < 1
    c = Categorical.fit(np.zeros(20), alpha=0.5, n_categories=3)
    assert np.all(c.params()["probs"] > 0)
    h = Histogram.fit(np.array([0.0, 0.0, 2.0]), discrete=True, alpha=0.5)
    assert np.all(h.params()["densities"] > 0)


def test_discretized_gaussian_masses_sum_to_one_where_paper_formula_does_not() -> None:
    d = DiscretizedGaussian(0.05, 0.04, levels=256, bin_width=1 / 255)
    k = np.arange(256.0)
    assert float(d.log_prob(k).exp().sum()) == pytest.approx(1.0, abs=1e-12)
    mu, sd = 0.05, 0.2
    paper = stats.norm.cdf((k / 255 - mu + 1 / 255) / sd) - stats.norm.cdf((k / 255 - mu) / sd)
    assert paper.sum() < 0.7  # the left tail below level 0 is lost
    # Interior levels agree with the paper's bins [k/255, (k+1)/255).
    np.testing.assert_allclose(d.log_prob(k[1:-1]).exp().numpy(), paper[1:-1], rtol=1e-9)


def test_discretized_gaussian_far_tail_is_finite() -> None:
    d = DiscretizedGaussian(-0.1, 1e-6, levels=256, bin_width=1 / 255)
    lp = d.log_prob(np.array([0.0, 128.0, 255.0, 3.5, -1.0]))
    assert float(lp[0]) == pytest.approx(0.0, abs=1e-12)
    assert torch.all(torch.isfinite(lp)) and float(lp[1]) < -1e4
    assert float(lp[3]) == LOG_ZERO and float(lp[4]) == LOG_ZERO


@pytest.mark.parametrize("bad", [
    lambda: Gaussian(0.0, -1.0), lambda: Gaussian(np.nan, 1.0), lambda: Bernoulli(1.5),
    lambda: Categorical([0.5, 0.6]), lambda: Histogram([0, 1], [2.0]), lambda: Histogram([1, 0], [1.0]),
    lambda: PiecewiseLinear([0, 1], [1.0, 2.0]), lambda: DiscretizedGaussian(0.5, 0.1, levels=1),
])
def test_bad_parameters_raise_user_error(bad) -> None:
    with pytest.raises(UserError):
        bad()


def test_fit_leaf_picks_type_per_meta_type(rng: np.random.Generator) -> None:
    assert isinstance(fit_leaf("real", rng.normal(size=50)), Gaussian)
    assert isinstance(fit_leaf("real", rng.normal(size=50), leaf="piecewise_linear"), PiecewiseLinear)
    assert isinstance(fit_leaf("binary", rng.integers(0, 2, 50)), Bernoulli)
    assert isinstance(fit_leaf("categorical", rng.integers(0, 4, 50)), Categorical)
    h = fit_leaf("discrete", rng.integers(0, 6, 50).astype(float))
    assert isinstance(h, Histogram) and bool(h.params()["discrete"])
    assert float(h.log_prob(np.arange(6.0)).exp().sum()) == pytest.approx(1.0)
    assert isinstance(fit_leaf("pixel", rng.integers(0, 256, 50)), DiscretizedGaussian)
    with pytest.raises(UserError, match="meta_type"):
        fit_leaf("complex", [1.0])
    assert set(LEAF_TYPES) == {"gaussian", "bernoulli", "categorical", "histogram", "piecewise_linear",
                               "discretized_gaussian"}


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS, ids=ids(CONTINUOUS_KINDS))
def test_fit_on_continuous_data_is_normalised(kind: LeafKind, rng: np.random.Generator) -> None:
    data = rng.normal(size=300)
    leaf = fit_leaf("real", data, leaf={"histogram": "histogram", "gaussian": "gaussian",
                                        "piecewise_linear": "piecewise_linear"}[kind.name])
    lo, hi = data.min() - 3, data.max() + 3
    pts = np.linspace(lo, hi, 200001)
    assert np.trapezoid(leaf.log_prob(pts).exp().numpy(), pts) == pytest.approx(1.0, abs=2e-3)
    assert np.all(leaf.log_prob(data).numpy() > LOG_ZERO)  # training points are in the support


@pytest.mark.parametrize("kind", DISCRETE_KINDS, ids=ids(DISCRETE_KINDS))
def test_out_of_support_is_impossible_not_nan(kind: LeafKind, rng: np.random.Generator) -> None:
    leaf = kind.make(rng)
    lp = leaf.log_prob(np.array([-1.0, 0.5, 99.0]))
    assert torch.all(lp == LOG_ZERO)


_TAILED = ("histogram", "piecewise_linear")


def _tailed(kind: str, tail: float) -> Any:
    """A continuous Histogram / PiecewiseLinear leaf on [-1, 1.5] with ``tail`` mass outside."""
    if kind == "histogram":
        br = np.array([-1.0, -0.2, 0.5, 1.5])
        d = np.array([0.3, 0.9, 0.5])
        return Histogram(br, d / (d * np.diff(br)).sum(), alpha=1e-3, tail=tail)
    xs = np.array([-1.0, -0.3, 0.4, 1.5])
    ys = np.array([0.0, 0.8, 0.5, 0.2])
    return PiecewiseLinear(xs, ys / np.trapezoid(ys, xs), tail=tail)


@pytest.mark.parametrize("kind", ["histogram", "piecewise_linear"])
def test_tails_are_finite_and_normalised_on_the_whole_line(kind: str) -> None:
    tail = 1e-2
    leaf = _tailed(kind, tail)
    far = leaf.log_prob(np.array([-1e6, -3.0, 2.0, 40.0, 1e6])).numpy()
    assert np.all(np.isfinite(far)) and np.all(far > LOG_ZERO)
    assert far[1] > far[0] and far[2] > far[3] > far[4]  # decays away from the body
    # Body plus both tails: the exponential tails (scale 2.5) are negligible beyond 60 scales.
    pts = np.linspace(-151.0, 151.5, 3_000_001)
    dens = leaf.log_prob(pts).exp().numpy()
    assert np.trapezoid(dens, pts) == pytest.approx(1.0, abs=1e-4)
    inside = (pts >= -1.0) & (pts <= 1.5)
    assert np.trapezoid(np.where(inside, dens, 0.0), pts) == pytest.approx(1 - tail, abs=1e-4)
    # Samples fall outside with frequency ~ tail (binomial 5-sigma band, fixed seed).
    x = leaf.sample(200_000, np.random.default_rng(0))
    frac = float(np.mean((x < -1.0) | (x > 1.5)))
    assert abs(frac - tail) < 5 * np.sqrt(tail * (1 - tail) / len(x))


@pytest.mark.parametrize("kind", ["histogram", "piecewise_linear"])
def test_fitted_leaf_gives_test_values_outside_training_range_a_finite_density(kind: str) -> None:
    rng = np.random.default_rng(3)
    leaf = fit_leaf("real", rng.normal(size=200), leaf=kind)
    lp = leaf.log_prob(np.array([-50.0, 50.0, np.nan])).numpy()
    assert np.all(np.isfinite(lp)) and np.all(lp[:2] > LOG_ZERO) and lp[2] == 0.0


def test_piecewise_linear_em_matches_weighted_mixture_of_hats() -> None:
    """One EM step from uniform heights equals the closed form: pi_i = sum_x w r_i(x) / sum w."""
    xs = np.array([0.0, 1.0, 3.0])
    leaf = PiecewiseLinear(xs, np.full(3, 1 / 3.0), tail=0.0)
    x = np.array([0.5, 2.0, 3.0, 9.0])  # 9 is outside: no information about the body
    w = np.array([1.0, 2.0, 1.0, 5.0])
    st = leaf.em_statistics(x, w)
    # Uniform heights: responsibilities are the hat values at x.
    np.testing.assert_allclose(st["counts"], [0.5, 0.5 + 2 * 0.5, 2 * 0.5 + 1.0])
    leaf.em_update(st)
    pi = st["counts"] / st["counts"].sum()
    np.testing.assert_allclose(leaf.params()["ys"], pi / np.array([0.5, 1.5, 1.0]))
    assert np.trapezoid(leaf.params()["ys"], xs) == pytest.approx(1.0)
