"""Exact cost-of-decentralisation engine (part 1: Examples V-A and V-B) against independent computations."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mpifc.analysis import decentralization as dz

TWO = ("x1", "x2")
THREE = dz.THREE_AGENTS
ALPHA, BETA = (2.0, 1.5), (1.5, 2.0)


# ---------------------------------------------------------------------------------------------
# An independent reference: scalar Python enumeration of Example V-A, dict-based entropies.
# ---------------------------------------------------------------------------------------------

def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _va_states(r: float, n_train: int = 3):
    """Yield (samples, prob): samples = ((x1, x2, y), ...) training rows then the test row."""
    px = {(0, 0): r / 2, (1, 1): r / 2, (0, 1): (1 - r) / 2, (1, 0): (1 - r) / 2}
    for samples in itertools.product(itertools.product((0, 1), repeat=3), repeat=n_train + 1):
        prob = 1.0
        for x1, x2, _ in samples:
            prob *= px[(x1, x2)]
        if prob == 0.0:
            continue
        for g in (0, 1):
            ys = [y for x1, x2, y in samples if (x1 ^ x2) == g]
            ones = sum(ys)
            prob *= math.exp(_log_beta(ALPHA[g] + ones, BETA[g] + len(ys) - ones)
                             - _log_beta(ALPHA[g], BETA[g]))
        yield samples, prob


def _reference_losses(r: float, views: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
                      ) -> dict[str, float]:
    """H(Y | X[test_cols], Xtr[train_cols], Ytr) per view, Example V-A by brute force, nats."""
    tables: dict[str, dict[tuple, list[float]]] = {name: {} for name in views}
    for samples, prob in _va_states(r):
        *train, test = samples
        for name, (test_cols, train_cols) in views.items():
            key = (tuple(test[c] for c in test_cols),
                   tuple((row[2], *(row[c] for c in train_cols)) for row in train))
            tables[name].setdefault(key, [0.0, 0.0])[test[2]] += prob
    out = {}
    for name, table in tables.items():
        h = 0.0
        for p0, p1 in table.values():
            tot = p0 + p1
            h -= sum(p * math.log(p / tot) for p in (p0, p1) if p > 0)
        out[name] = h
    return out


def _beta_bernoulli_predictive_entropy(a: float, b: float, n: int) -> float:
    """H(Y_{n+1} | Y_1..Y_n) when every label shares one W ~ Beta(a, b), nats (closed form)."""
    h = 0.0
    for k in range(n + 1):
        p_seq = math.exp(_log_beta(a + k, b + n - k) - _log_beta(a, b))
        h += math.comb(n, k) * p_seq * dz.binary_entropy((a + k) / (a + b + n))
    return h


# ---------------------------------------------------------------------------------------------
# Information primitives.
# ---------------------------------------------------------------------------------------------

def _plain_entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-np.sum(p * np.log(p)))


def test_entropy_and_cmi_primitives_agree_with_joint_entropies() -> None:
    rng = np.random.default_rng(0)
    p = rng.random((2, 3, 2, 2))
    p[0, 1, 1, 0] = 0.0  # zero cells must be handled
    p /= p.sum()
    # H(A | C) = H(A, C) - H(C) with A = axis 0, C = axes (2, 3)
    h_ac, h_c = _plain_entropy(p.sum(axis=1)), _plain_entropy(p.sum(axis=(0, 1)))
    assert dz.conditional_entropy(p, [0], [2, 3]) == pytest.approx(h_ac - h_c, abs=1e-13)
    # I(A; B | C) = H(A,C) + H(B,C) - H(A,B,C) - H(C)
    h_bc, h_abc = _plain_entropy(p.sum(axis=0)), _plain_entropy(p)
    cmi = dz.conditional_mutual_information(p, [0], [1], [2, 3])
    assert cmi == pytest.approx(h_ac + h_bc - h_abc - h_c, abs=1e-13)
    assert cmi > 0


def test_cmi_vanishes_under_conditional_independence() -> None:
    rng = np.random.default_rng(1)
    pc = rng.dirichlet(np.ones(3))
    pa_c = rng.dirichlet(np.ones(2), size=3)  # [c, a]
    pb_c = rng.dirichlet(np.ones(4), size=3)  # [c, b]
    p = np.einsum("c,ca,cb->abc", pc, pa_c, pb_c)
    assert abs(dz.conditional_mutual_information(p, [0], [1], [2])) < 1e-15
    assert dz.conditional_mutual_information(p, [0], [1], []) > 1e-4


def test_overlapping_axes_are_rejected() -> None:
    p = np.full((2, 2), 0.25)
    with pytest.raises(ValueError):
        dz.conditional_mutual_information(p, [0], [0], [1])


def test_joint_is_a_distribution_with_the_model_marginals() -> None:
    joint = dz.DataJoint(dz.three_agent_model(0.3, s=0.2), n_train=3)
    assert joint.p.ndim == 5 * 4
    assert joint.p.sum() == pytest.approx(1.0, abs=1e-13)
    test_feats, _ = dz.marginal(joint.p, joint.axes(test=("x1", "x2", "x3", "xhat")))
    np.testing.assert_allclose(test_feats, joint.model.feature_probs, atol=1e-14)
    # Prior predictive of one label: E[W_g] for the test point's group.
    y, _ = dz.marginal(joint.p, joint.axes(test_label=True))
    assert y[1] == pytest.approx(0.5 * 2 / 3.5 + 0.5 * 1.5 / 3.5, abs=1e-13)


# ---------------------------------------------------------------------------------------------
# Example V-A.
# ---------------------------------------------------------------------------------------------

R_GRID = (0.0, 0.1, 0.3, 0.5, 0.62, 0.8, 0.95, 1.0)


@pytest.fixture(scope="module")
def va_sweep() -> dict[float, tuple[dz.SettingLosses, dz.DataJoint]]:
    return {r: dz.example_va(r) for r in R_GRID}


@pytest.mark.parametrize("r", (0.2, 0.5, 0.9))
def test_va_matches_scalar_brute_force(r: float) -> None:
    losses, _ = dz.example_va(r)
    views = {"CL/CI": ((0, 1), (0, 1)), "CL/DI": ((0,), (0, 1)),
             "DL/CI": ((0, 1), (0,)), "DL/DI": ((0,), (0,))}
    ref = _reference_losses(r, views)
    for setting in dz.SETTINGS:
        assert losses.per_agent[setting][0] == pytest.approx(ref[setting], abs=1e-12), setting


def test_va_eq14_ordering_at_every_sweep_point(va_sweep) -> None:
    for r, (losses, _) in va_sweep.items():
        assert dz.eq14_holds(losses), (r, losses.as_dict())


def test_va_losses_are_entropies_of_a_binary_label(va_sweep) -> None:
    for losses, _ in va_sweep.values():
        for vals in losses.per_agent.values():
            assert all(0.0 <= v <= dz.LOG2 for v in vals)


@pytest.mark.parametrize("r", (0.3, 0.5, 0.8))
def test_va_table_i_costs_equal_cmi(va_sweep, r: float) -> None:
    losses, joint = va_sweep[r]
    costs = dz.table_i_costs(losses)
    for k in range(2):
        cmi = dz.table_i_cmi(joint, TWO, k)
        for pair in dz.TABLE_I:
            assert abs(costs[pair] - cmi[pair]) < 1e-9, (r, k, pair)
            assert cmi[pair] >= -1e-15


def test_va_one_feature_alone_is_useless(va_sweep) -> None:
    # For every r, X_k alone is independent of X1 xor X2 (P(X1 xor X2 = 0 | X_k) = r), hence of
    # everything else: an agent's own test feature or training column helps only with the other's.
    for r, (losses, joint) in va_sweep.items():
        assert losses.R("CL/DI") == pytest.approx(joint.label_entropy((), TWO), abs=1e-12), r
        assert losses.R("DL/CI") == pytest.approx(joint.label_entropy(TWO, ()), abs=1e-12), r
        assert losses.R("DL/DI") == pytest.approx(joint.label_entropy((), ()), abs=1e-12), r


def test_va_inference_collaboration_beats_learning_collaboration(va_sweep) -> None:
    # Sec. V-A: "centralized inference is more effective than centralized learning".
    for r, (losses, _) in va_sweep.items():
        if 0.0 < r < 1.0:
            cc, cd, dc, dd = (losses.R(s) for s in dz.SETTINGS)
            assert cc < dc < cd < dd, r


@pytest.mark.parametrize("r, group", ((1.0, 0), (0.0, 1)))
def test_va_identical_or_opposite_features_make_collaboration_useless(va_sweep, r: float,
                                                                      group: int) -> None:
    losses, _ = va_sweep[r]
    # X1 xor X2 is then deterministic: every label shares W_{group}, the features say nothing.
    expected = _beta_bernoulli_predictive_entropy(ALPHA[group], BETA[group], 3)
    for s in dz.SETTINGS:
        assert losses.R(s) == pytest.approx(expected, abs=1e-12), s


def test_va_costs_shrink_as_features_become_dependent(va_sweep) -> None:
    rs = (0.5, 0.62, 0.8, 0.95, 1.0)
    gaps = [va_sweep[r][0].R("DL/DI") - va_sweep[r][0].R("CL/CI") for r in rs]
    assert all(a > b for a, b in zip(gaps, gaps[1:]))


@pytest.mark.parametrize("r", (0.1, 0.3))
def test_va_is_symmetric_in_r(va_sweep, r: float) -> None:
    # The two Beta priors mirror each other, so swapping the groups (r -> 1 - r) and flipping Y
    # leaves every entropy unchanged.
    a, b = va_sweep[r][0], dz.example_va(1.0 - r)[0]
    for s in dz.SETTINGS:
        assert a.R(s) == pytest.approx(b.R(s), abs=1e-12)


def test_mutual_info_inversion() -> None:
    for mi in (0.0, 0.1, 0.4, dz.LOG2):
        r = dz.r_for_mutual_info(mi)
        assert 0.5 <= r <= 1.0
        assert dz.mutual_info_two_features(r) == pytest.approx(mi, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Example V-B.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("r", (0.2, 0.5, 0.85))
@pytest.mark.parametrize("s", (0.0, 0.07, 0.3, 0.5))
def test_privacy_closed_forms_match_enumeration(r: float, s: float) -> None:
    np.testing.assert_allclose(dz.privacy_leaks(r, s), dz.privacy_leaks_by_enumeration(r, s),
                               atol=1e-13)


def test_extracted_third_constraint_is_not_a_mutual_information() -> None:
    # Documents the reading taken: the literal extraction goes negative, enumeration never does.
    assert dz.privacy_leaks_as_extracted(0.5, 0.5)[1] < 0
    assert min(dz.privacy_leaks_by_enumeration(0.5, 0.5)) >= -1e-15


EPS_GRID = (0.0, 0.02, 0.15, 0.4)


@pytest.mark.parametrize("r", (0.3, 0.5, 0.85))
@pytest.mark.parametrize("eps", EPS_GRID)
def test_least_noise_meets_eq2_and_is_least(r: float, eps: float) -> None:
    s = dz.least_private_noise(r, eps)
    assert 0.0 <= s <= 0.5
    assert max(dz.privacy_leaks_by_enumeration(r, s)) <= eps + 1e-12
    if s > 0:
        assert max(dz.privacy_leaks_by_enumeration(r, s - 1e-6)) > eps
    else:
        assert dz.max_leak(r) <= eps


def test_no_noise_beyond_the_largest_leak() -> None:
    assert dz.least_private_noise(0.3, dz.max_leak(0.3) + 1e-9) == 0.0
    assert dz.least_private_noise(0.5, 0.0) == 0.5


@pytest.fixture(scope="module")
def vb_sweep() -> dict[tuple[float, float], dz.PrivatePoint]:
    return {(r, eps): dz.example_vb(r, eps) for r in (0.3, 0.5) for eps in EPS_GRID + (dz.LOG2,)}


def test_vb_eq14_ordering_and_range_at_every_eps(vb_sweep) -> None:
    for key, point in vb_sweep.items():
        assert dz.eq14_holds(point.losses), key
        for vals in point.losses.per_agent.values():
            assert all(0.0 <= v <= dz.LOG2 for v in vals)


@pytest.mark.parametrize("r", (0.3, 0.5))
def test_vb_zero_eps_collaboration_brings_nothing(vb_sweep, r: float) -> None:
    losses = vb_sweep[(r, 0.0)].losses
    for s in dz.SETTINGS:
        assert losses.R(s) == pytest.approx(losses.R("DL/DI"), abs=1e-12), s


@pytest.mark.parametrize("r", (0.3, 0.5))
def test_vb_losses_fall_as_privacy_relaxes(vb_sweep, r: float) -> None:
    for s in ("CL/CI", "CL/DI", "DL/CI"):
        curve = [vb_sweep[(r, eps)].losses.R(s) for eps in EPS_GRID + (dz.LOG2,)]
        assert all(a >= b - 1e-12 for a, b in zip(curve, curve[1:])), s
    assert vb_sweep[(r, dz.LOG2)].losses.R("CL/CI") < vb_sweep[(r, 0.0)].losses.R("CL/CI") - 1e-3


def test_vb_least_noise_is_the_best_feasible_aggregation() -> None:
    # The min over the feasible family of eq. 19: every larger (still feasible) s does no better.
    r, eps = 0.3, 0.15
    best = dz.example_vb(r, eps)
    for s in (best.s + 0.05, 0.5):
        other = dz.example_vb_at_noise(r, s)
        for setting in dz.SETTINGS:
            assert best.losses.R(setting) <= other.R(setting) + 1e-12


@pytest.mark.parametrize("r", (0.3, 0.5))
def test_vb_noiseless_aggregation_equals_full_sharing(vb_sweep, r: float) -> None:
    # With s = 0, X_hat = X1 xor X2 xor X3 is sufficient for Y, so sharing it is as good as
    # sharing all of X (eqs. 8, 12, 13), computed on the three-feature model without X_hat.
    private = vb_sweep[(r, dz.LOG2)]
    assert private.s == 0.0
    full = dz.setting_losses(dz.DataJoint(dz.three_agent_model(r), 3), THREE, shared=THREE)
    for s in dz.SETTINGS:
        np.testing.assert_allclose(private.losses.per_agent[s], full.per_agent[s], atol=1e-12)


def test_three_agent_table_i_costs_equal_cmi() -> None:
    # r = 1/2 makes the three agents symmetric, as Proposition 4.1 assumes.
    joint = dz.DataJoint(dz.three_agent_model(0.5), 3)
    losses = dz.setting_losses(joint, THREE, shared=THREE)
    costs = dz.table_i_costs(losses)
    for k in range(3):
        cmi = dz.table_i_cmi(joint, THREE, k)
        for pair in dz.TABLE_I:
            assert abs(costs[pair] - cmi[pair]) < 1e-9, (k, pair)
    assert costs[("DL/DI", "CL/CI")] > 1e-3


@pytest.mark.parametrize("r", (0.2, 0.7))
def test_three_feature_law_is_the_papers(r: float) -> None:
    p = dz.three_feature_probs(r)  # axes x1, x2, x3
    assert p.sum() == pytest.approx(1.0, abs=1e-15)
    for k in range(3):
        assert p.sum(axis=tuple(j for j in range(3) if j != k))[1] == pytest.approx(0.5, abs=1e-15)
    assert p[0, 0].sum() + p[1, 1].sum() == pytest.approx(r, abs=1e-15)  # P(X1 = X2)
    assert p[:, 0, 0].sum() + p[:, 1, 1].sum() == pytest.approx(r, abs=1e-15)  # P(X3 = X2)
    assert abs(dz.conditional_mutual_information(p, [0], [2], [1])) < 1e-15  # X3 depends on X2 only


def test_oversized_enumeration_is_refused() -> None:
    with pytest.raises(ValueError, match="cells"):
        dz.DataJoint(dz.three_agent_model(0.5, s=0.1), n_train=5)


def test_asymmetric_agents_table_i_holds_per_agent_not_for_every_agent() -> None:
    # r != 1/2: X2 sits in the middle of the chain X1 - X2 - X3, so the agents differ. The chain
    # rule still gives each agent's own loss gap as its CMI; the worst-agent cost of eq. 15 then
    # matches the worst agent's CMI only, which is why Proposition 4.1 assumes symmetry.
    joint = dz.DataJoint(dz.three_agent_model(0.3), 3)
    losses = dz.setting_losses(joint, THREE, shared=THREE)
    worst = int(np.argmax(losses.per_agent["DL/DI"]))
    assert worst == 1
    costs = dz.table_i_costs(losses)
    for k in range(3):
        cmi = dz.table_i_cmi(joint, THREE, k)
        for a, b in dz.TABLE_I:
            gap = losses.per_agent[a][k] - losses.per_agent[b][k]
            assert abs(gap - cmi[(a, b)]) < 1e-9, (k, a, b)
            if k == worst:
                assert abs(costs[(a, b)] - cmi[(a, b)]) < 1e-9
    assert abs(costs[("CL/DI", "CL/CI")] - dz.table_i_cmi(joint, THREE, 0)[("CL/DI", "CL/CI")]) > 1e-3
