"""Exact cost of decentralisation in vertical FL (seed paper vertical-fl-cost-of-decentralization).

Everything here is computed exactly, in float64, by enumerating every training set of size ``N``
together with the test point, for Bayesian models whose parameters integrate out in closed form.
All entropies and mutual informations are in nats.

Model class (:class:`BetaBernoulliModel`): each sample has ``D`` binary feature columns with a
known distribution ``p(x)``, and a binary label ``Y ~ Bern(W_g)`` where the group ``g = g(x)`` is
a fixed function of the features. The ``W_g ~ Beta(alpha_g, beta_g)`` are a priori independent,
so ``P(training labels, test label | all features)`` is a product of Beta-Bernoulli marginals
``B(alpha_g + ones_g, beta_g + zeros_g) / B(alpha_g, beta_g)``. :class:`DataJoint` holds the
joint mass of ``(X_1, Y_1, ..., X_N, Y_N, X, Y)`` as one array with one binary axis per variable;
conditional entropies and conditional mutual informations are then reductions of that array.
The two are implemented separately (:func:`conditional_entropy`, from ``p(a|c)``;
:func:`conditional_mutual_information`, from its definition), so the chain-rule identities of
Table I can be checked rather than assumed.

The four settings, for agent ``k`` with own column ``X_k`` and shared columns ``S`` (``S = X`` when
there is no privacy constraint, ``S = X_hat`` for a private aggregation):

* CL/CI: ``H(Y | X_k, S, Xtr_k, Str, Ytr)`` (eq. 6, and eq. 8 when ``S = X``),
* CL/DI: ``H(Y | X_k, Xtr_k, Str, Ytr)`` (eqs. 9 and 12),
* DL/CI: ``H(Y | X_k, S, Xtr_k, Ytr)`` (eqs. 10 and 13),
* DL/DI: ``H(Y | X_k, Xtr_k, Ytr)`` (eq. 11),

each followed by the worst agent, ``R = max_k``. ``Xtr`` is the training feature matrix (the
paper's calligraphic X), ``Ytr`` the training labels, which every agent holds.

Readings taken where the text extraction lost symbols:

* Example V-A: the text reads ``Pr[X1 = X2] = r/2``; with ``P(X_k = 1) = 0.5`` and
  ``I(X1; X2) = log 2 - H_b(r)`` this can only mean ``Pr[X1 = X2 = x] = r/2`` for each ``x``,
  i.e. ``P(X1 = X2) = r`` (the issue's reading).
* Example V-B: ``X3`` depends on ``X2`` only, with ``P(X3 != X2) = 1 - r``.
* Table I: the five costs are the chain-rule differences of the entropies above, e.g.
  ``C^{CL/DI - CL/CI} = I(Y; X^(-k) | X_k, Xtr, Ytr)`` and
  ``C^{DL/DI - CL/CI} = I(Y; X^(-k), Xtr^(-k) | X_k, Xtr_k, Ytr)``; see :data:`TABLE_I`.
* Privacy constraints of Example V-B: the first two closed forms are confirmed by enumeration
  (they are equal, as ``H_b(a) = H_b(1 - a)``; for ``r != 1/2`` they bind, the ``X2`` one is looser).
  The third, extracted as ``I(X_hat; X2 | X1, X3) = -H_b(s) + 2r(1-r) log 2``, is not (it is
  negative at ``r = 0.5, s = 0.5``). Enumeration agrees with
  ``-H_b(s) + (r^2 + (1-r)^2) H_b(q * s) + 2r(1-r) log 2`` with ``q = (1-r)^2 / (r^2 + (1-r)^2)``
  and ``a * b = a(1-b) + b(1-a)``: given ``X1 = X3`` the posterior of ``X2`` is ``q``-biased,
  given ``X1 != X3`` it is uniform. The latter term is probably what the extraction dropped;
  :func:`privacy_leaks` uses it.
* The aggregation family is the paper's one-parameter family (19). Because a larger ``s`` is a
  binary symmetric channel applied after a smaller one, every loss is non-decreasing in
  ``s`` on ``[0, 1/2]`` (data processing), so the ``min`` over the feasible family is attained by
  the least feasible noise, :func:`least_private_noise`.
* Units: the paper's figures appear to use bits (it says ``I(X1; X2)`` peaks at 1 and Fig. 3
  ends at ``eps = 1``); everything here is in nats, so those end points are ``log 2``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

LOG2 = float(np.log(2.0))
SETTINGS: tuple[str, ...] = ("CL/CI", "CL/DI", "DL/CI", "DL/DI")
MAX_JOINT_CELLS = 2 ** 24  # 128 MiB of float64; Example V-B with N = 3 needs 2^20


# ---------------------------------------------------------------------------------------------
# Information measures on an explicit joint mass array (one axis per variable).
# ---------------------------------------------------------------------------------------------

def binary_entropy(p: float | np.ndarray) -> float | np.ndarray:
    """``H_b(p)`` in nats, with ``0 log 0 = 0``."""
    p = np.asarray(p, dtype=np.float64)
    q = 1.0 - p
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0) - np.where(q > 0, q * np.log(q), 0.0)
    return float(h) if h.ndim == 0 else h


def binary_convolution(a: float, b: float) -> float:
    """``a * b = a(1-b) + b(1-a)``: the flip probability of two independent flips in a row."""
    return a * (1.0 - b) + b * (1.0 - a)


def marginal(p: np.ndarray, keep: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """Sum out every axis not in ``keep``; returns the marginal and its axes (ascending)."""
    kept = sorted(set(keep))
    m = p
    # One binary axis at a time builds a summation tree (error ~ depth * 1e-16), where a single
    # multi-axis sum over strided axes accumulates sequentially (~1e-13 over 2^20 cells). Leading
    # axes go first because each step then adds long contiguous blocks.
    removed = 0
    for axis in range(p.ndim):
        if axis not in kept:
            m = m.sum(axis=axis - removed)
            removed += 1
    return m, kept


def _check_disjoint(*groups: Sequence[int]) -> None:
    flat = [a for g in groups for a in g]
    if len(flat) != len(set(flat)):
        raise ValueError(f"axis groups overlap: {groups}")


def conditional_entropy(p: np.ndarray, target: Sequence[int], given: Sequence[int]) -> float:
    """``H(A | C) = -sum p(a, c) log p(a | c)`` in nats.

    Args:
        p: joint mass, one axis per variable, summing to 1.
        target: axes of ``A``.
        given: axes of ``C`` (may be empty).
    """
    _check_disjoint(target, given)
    m, kept = marginal(p, [*target, *given])
    pos = tuple(kept.index(a) for a in target)
    pc = m.sum(axis=pos, keepdims=True)
    mask = m > 0
    cond = np.divide(m, pc, out=np.ones_like(m), where=mask)
    return float(-np.sum(m[mask] * np.log(cond[mask])))


def conditional_mutual_information(p: np.ndarray, a: Sequence[int], b: Sequence[int],
                                   given: Sequence[int]) -> float:
    """``I(A; B | C) = sum p(a,b,c) log [p(a,b,c) p(c) / (p(a,c) p(b,c))]`` in nats.

    Computed from the definition, not from entropies, so it can cross-check them.
    """
    _check_disjoint(a, b, given)
    m, kept = marginal(p, [*a, *b, *given])
    pos_a = tuple(kept.index(i) for i in a)
    pos_b = tuple(kept.index(i) for i in b)
    p_bc = m.sum(axis=pos_a, keepdims=True)
    p_ac = m.sum(axis=pos_b, keepdims=True)
    p_c = p_ac.sum(axis=pos_a, keepdims=True)
    mask = m > 0
    num = m * p_c
    den = p_ac * p_bc
    ratio = np.divide(num, den, out=np.ones_like(m), where=mask)
    return float(np.sum(m[mask] * np.log(ratio[mask])))


# ---------------------------------------------------------------------------------------------
# Beta-Bernoulli model and the exact joint over (training set, test point).
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BetaBernoulliModel:
    """Binary features with a known law, and ``Y ~ Bern(W_g)`` with ``g = group_of[x]``.

    Attributes:
        feature_names: names of the ``D`` binary feature columns.
        feature_probs: ``p(x)``, shape ``(2,) * D``, sums to 1.
        group_of: group index of each feature configuration, shape ``(2,) * D``, ints in ``[0, G)``.
        alpha: Beta prior first parameters, shape ``(G,)``.
        beta: Beta prior second parameters, shape ``(G,)``.
    """

    feature_names: tuple[str, ...]
    feature_probs: np.ndarray
    group_of: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray

    def __post_init__(self) -> None:
        d = len(self.feature_names)
        shape = (2,) * d
        if self.feature_probs.shape != shape or self.group_of.shape != shape:
            raise ValueError(f"feature_probs and group_of must have shape {shape}")
        if abs(float(self.feature_probs.sum()) - 1.0) > 1e-12 or np.any(self.feature_probs < 0):
            raise ValueError("feature_probs must be a probability table")
        if np.any(self.group_of < 0) or np.any(self.group_of >= len(self.alpha)):
            raise ValueError("group_of must index the prior parameters")


# math.lgamma on a few hundred counts: importing scipy.special for betaln costs more than this.
_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def _log_beta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log B(a, b)`` elementwise."""
    return _lgamma(a) + _lgamma(b) - _lgamma(a + b)


def _label_marginal_likelihood(alpha: np.ndarray, beta: np.ndarray, n_samples: int) -> np.ndarray:
    """``P(y_1..y_M | g_1..g_M)`` with ``W`` integrated out, over every (group, label) sequence.

    Returns shape ``(2G,) * M`` indexed by ``2 g_m + y_m`` per sample.
    """
    n_groups = len(alpha)
    idx = np.indices((2 * n_groups,) * n_samples).reshape(n_samples, -1)
    g, y = idx // 2, idx % 2
    log_ml = np.zeros(idx.shape[1])
    for j in range(n_groups):
        ones = np.sum((g == j) & (y == 1), axis=0)
        zeros = np.sum((g == j) & (y == 0), axis=0)
        log_ml += _log_beta(alpha[j] + ones, beta[j] + zeros) - _log_beta(alpha[j], beta[j])
    return np.exp(log_ml).reshape((2 * n_groups,) * n_samples)


class DataJoint:
    """Exact joint mass of ``N`` training samples and one test sample under a model.

    The array ``p`` has ``(D + 1) * (N + 1)`` binary axes: sample block ``n`` (``n = N`` is the test
    point) holds the ``D`` feature columns, then the label.
    """

    def __init__(self, model: BetaBernoulliModel, n_train: int) -> None:
        if n_train < 1:
            raise ValueError("n_train must be >= 1")
        self.model = model
        self.n_train = n_train
        self.names = model.feature_names
        d = len(self.names)
        n_samples = n_train + 1
        n_cells = 2 ** ((d + 1) * n_samples)
        if n_cells > MAX_JOINT_CELLS:
            raise ValueError(f"the joint would have {n_cells} cells (> {MAX_JOINT_CELLS}): "
                             f"use fewer features or a smaller n_train")
        # One "cell" per sample = (feature configuration, label), encoded 2 * f + y, so that the
        # C-order reshape to binary axes gives the feature bits first and the label last.
        cell_prob = np.repeat(model.feature_probs.reshape(-1), 2)
        cell_gy = 2 * np.repeat(model.group_of.reshape(-1), 2) + np.tile([0, 1], 2 ** d)
        ml = _label_marginal_likelihood(np.asarray(model.alpha, float),
                                        np.asarray(model.beta, float), n_samples)
        joint = ml[np.ix_(*([cell_gy] * n_samples))]
        for n in range(n_samples):
            shape = [1] * n_samples
            shape[n] = -1
            joint = joint * cell_prob.reshape(shape)
        self.p = joint.reshape((2,) * ((d + 1) * n_samples))

    def _axis(self, sample: int, name: str) -> int:
        block = len(self.names) + 1
        col = len(self.names) if name == "y" else self.names.index(name)
        return sample * block + col

    def axes(self, test: Sequence[str] = (), train: Sequence[str] = (),
             test_label: bool = False, train_labels: bool = False) -> list[int]:
        """Axes of the named test-point columns, the named training columns (every row), labels."""
        out = [self._axis(self.n_train, c) for c in test]
        out += [self._axis(n, c) for n in range(self.n_train) for c in train]
        if test_label:
            out.append(self._axis(self.n_train, "y"))
        if train_labels:
            out += [self._axis(n, "y") for n in range(self.n_train)]
        return out

    def label_entropy(self, test: Sequence[str], train: Sequence[str]) -> float:
        """``H(Y | X[test], Xtr[train], Ytr)`` in nats."""
        return conditional_entropy(self.p, self.axes(test_label=True),
                                   self.axes(test, train, train_labels=True))

    def label_cmi(self, extra_test: Sequence[str], extra_train: Sequence[str],
                  test: Sequence[str], train: Sequence[str]) -> float:
        """``I(Y; X[extra_test], Xtr[extra_train] | X[test], Xtr[train], Ytr)`` in nats."""
        return conditional_mutual_information(
            self.p, self.axes(test_label=True), self.axes(extra_test, extra_train),
            self.axes(test, train, train_labels=True))


# ---------------------------------------------------------------------------------------------
# The four settings, Table I.
# ---------------------------------------------------------------------------------------------

def setting_views(setting: str, own: Sequence[str], shared: Sequence[str]
                  ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(test columns, training columns) that agent ``k`` conditions on in ``setting``."""
    both = tuple(dict.fromkeys([*own, *shared]))
    own = tuple(own)
    views = {"CL/CI": (both, both), "CL/DI": (own, both), "DL/CI": (both, own), "DL/DI": (own, own)}
    if setting not in views:
        raise ValueError(f"unknown setting {setting!r}; expected one of {SETTINGS}")
    return views[setting]


@dataclass(frozen=True)
class SettingLosses:
    """Per-agent losses (nats) of the four settings; ``R(setting)`` is the worst agent."""

    per_agent: Mapping[str, tuple[float, ...]]

    def R(self, setting: str) -> float:  # noqa: N802 - the paper's symbol
        """``max_k`` loss of ``setting``, nats."""
        return max(self.per_agent[setting])

    def as_dict(self) -> dict[str, float]:
        """``{setting: R(setting)}``."""
        return {s: self.R(s) for s in SETTINGS}


def setting_losses(joint: DataJoint, agents: Sequence[str], shared: Sequence[str],
                   settings: Sequence[str] = SETTINGS) -> SettingLosses:
    """Losses of each agent (own column ``agents[k]``) in each setting, nats."""
    per_agent = {}
    for s in settings:
        vals = []
        for a in agents:
            test, train = setting_views(s, (a,), shared)
            vals.append(joint.label_entropy(test, train))
        per_agent[s] = tuple(vals)
    return SettingLosses(per_agent)


# Table I (eps = inf, symmetric agents). C^{a-b} = I(Y; X[extra_test], Xtr[extra_train] |
# X[test], Xtr[train], Ytr), each entry naming a column set of agent k: "own" = (X_k,),
# "others" = X^(-k), "all" = X, "none" = ().
TABLE_I: dict[tuple[str, str], tuple[str, str, str, str]] = {
    # (a, b):           (extra_test, extra_train, test, train)
    ("CL/DI", "CL/CI"): ("others", "none", "own", "all"),
    ("DL/CI", "CL/CI"): ("none", "others", "all", "own"),
    ("DL/DI", "CL/CI"): ("others", "others", "own", "own"),
    ("DL/DI", "CL/DI"): ("none", "others", "own", "own"),
    ("DL/DI", "DL/CI"): ("others", "none", "own", "own"),
}


def table_i_cmi(joint: DataJoint, agents: Sequence[str], k: int) -> dict[tuple[str, str], float]:
    """The conditional mutual informations of Table I for agent ``k``, nats, by definition."""
    own = (agents[k],)
    others = tuple(a for a in agents if a != agents[k])
    cols = {"none": (), "own": own, "others": others, "all": tuple(agents)}
    return {pair: joint.label_cmi(*(cols[c] for c in spec)) for pair, spec in TABLE_I.items()}


def table_i_costs(losses: SettingLosses) -> dict[tuple[str, str], float]:
    """``C^{a-b} = R^a - R^b`` (eq. 15) for the pairs of Table I, nats."""
    return {(a, b): losses.R(a) - losses.R(b) for (a, b) in TABLE_I}


# ---------------------------------------------------------------------------------------------
# Example V-A: two agents, no privacy constraint.
# ---------------------------------------------------------------------------------------------

PRIOR_ALPHA = np.array([2.0, 1.5])  # (alpha_1, alpha_2) of eq. 17, Figs. 2-3
PRIOR_BETA = np.array([1.5, 2.0])   # (beta_1, beta_2)
N_TRAIN = 3


def _pair_probs(r: float) -> np.ndarray:
    """``p(x1, x2)`` with uniform marginals and ``P(X1 = X2) = r``, shape ``(2, 2)``."""
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"r must be in [0, 1], got {r}")
    return np.array([[r / 2, (1 - r) / 2], [(1 - r) / 2, r / 2]])


def two_agent_model(r: float, alpha: np.ndarray = PRIOR_ALPHA,
                    beta: np.ndarray = PRIOR_BETA) -> BetaBernoulliModel:
    """Example V-A: features ``(x1, x2)``, ``Y ~ Bern(W_{1 + x1 xor x2})`` (eq. 16)."""
    parity = np.indices((2, 2)).sum(axis=0) % 2
    return BetaBernoulliModel(("x1", "x2"), _pair_probs(r), parity, np.asarray(alpha, float),
                              np.asarray(beta, float))


def mutual_info_two_features(r: float) -> float:
    """``I(X1; X2) = log 2 - H_b(r)`` in nats."""
    return LOG2 - binary_entropy(r)


def r_for_mutual_info(mi: float) -> float:
    """The ``r`` in ``[1/2, 1]`` with ``I(X1; X2) = mi`` (nats), by bisection."""
    if not 0.0 <= mi <= LOG2 + 1e-15:
        raise ValueError(f"mi must be in [0, log 2], got {mi}")
    lo, hi = 0.5, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mutual_info_two_features(mid) < mi:
            lo = mid
        else:
            hi = mid
    return hi if mi > 0 else 0.5


def example_va(r: float, n_train: int = N_TRAIN) -> tuple[SettingLosses, DataJoint]:
    """Four non-private losses of Example V-A (agents ``x1``, ``x2``; ``X_hat = X``)."""
    joint = DataJoint(two_agent_model(r), n_train)
    agents = ("x1", "x2")
    return setting_losses(joint, agents, shared=agents), joint


# ---------------------------------------------------------------------------------------------
# Example V-B: three agents, private aggregation X_hat = X1 xor X2 xor X3 xor E, E ~ Bern(s).
# ---------------------------------------------------------------------------------------------

def three_feature_probs(r: float) -> np.ndarray:
    """``p(x1, x2, x3) = p(x1, x2) p(x3 | x2)`` with ``P(X3 = X2) = r``, shape ``(2, 2, 2)``."""
    copy = np.array([[r, 1 - r], [1 - r, r]])  # [x2, x3]
    return _pair_probs(r)[:, :, None] * copy[None, :, :]


def three_agent_model(r: float, s: float | None = None, alpha: np.ndarray = PRIOR_ALPHA,
                      beta: np.ndarray = PRIOR_BETA) -> BetaBernoulliModel:
    """Example V-B (eq. 18); with ``s`` given, the shared column ``xhat`` of eq. 19 is added."""
    px = three_feature_probs(r)
    parity = np.indices((2, 2, 2)).sum(axis=0) % 2
    alpha, beta = np.asarray(alpha, float), np.asarray(beta, float)
    if s is None:
        return BetaBernoulliModel(("x1", "x2", "x3"), px, parity, alpha, beta)
    if not 0.0 <= s <= 1.0:
        raise ValueError(f"s must be in [0, 1], got {s}")
    flip = np.array([[1 - s, s], [s, 1 - s]])  # [parity, xhat]
    pxh = px[..., None] * flip[parity]
    group = np.broadcast_to(parity[..., None], pxh.shape).copy()
    return BetaBernoulliModel(("x1", "x2", "x3", "xhat"), pxh, group, alpha, beta)


def privacy_leaks(r: float, s: float) -> tuple[float, float, float]:
    """Closed forms of ``I(X_hat; X_k | X^(-k))`` for ``k = 1, 2, 3``, nats (see module notes)."""
    hs = binary_entropy(s)
    leak1 = binary_entropy(binary_convolution(r, s)) - hs
    leak3 = binary_entropy(binary_convolution(1 - r, s)) - hs
    same = r * r + (1 - r) * (1 - r)
    q = (1 - r) ** 2 / same if same > 0 else 0.5
    leak2 = same * binary_entropy(binary_convolution(q, s)) + 2 * r * (1 - r) * LOG2 - hs
    return float(leak1), float(leak2), float(leak3)


def privacy_leaks_as_extracted(r: float, s: float) -> tuple[float, float, float]:
    """The three constraints exactly as the text extraction reads (kept to document the gap)."""
    hs = binary_entropy(s)
    return (float(binary_entropy(s * r + (1 - r) * (1 - s)) - hs),
            float(-hs + 2 * r * (1 - r) * LOG2),
            float(binary_entropy(s * (1 - r) + r * (1 - s)) - hs))


def privacy_leaks_by_enumeration(r: float, s: float) -> tuple[float, float, float]:
    """``I(X_hat; X_k | X^(-k))`` for ``k = 1, 2, 3`` from the one-sample joint, nats."""
    p = three_agent_model(r, s).feature_probs  # axes x1, x2, x3, xhat
    return tuple(conditional_mutual_information(p, [3], [k], [j for j in range(3) if j != k])
                 for k in range(3))


def least_private_noise(r: float, eps: float, iters: int = 80) -> float:
    """Least ``s`` in ``[0, 1/2]`` whose aggregation meets all three ``eps`` constraints (eq. 2).

    Each leak falls monotonically as ``s`` grows to 1/2 (data processing), so the feasible set
    is ``[s*, 1/2]``; bisection keeps ``hi`` feasible, so the returned ``s`` always satisfies eq. 2.
    """
    if eps < 0:
        raise ValueError("eps must be >= 0")

    def worst(s: float) -> float:
        return max(privacy_leaks(r, s))

    if worst(0.0) <= eps:
        return 0.0
    if eps == 0.0:
        # Near s = 1/2 the leak is O((1/2 - s)^2) and rounds to 0 before s reaches 1/2, yet only
        # s = 1/2 makes X_hat independent of X.
        return 0.5
    lo, hi = 0.0, 0.5
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if worst(mid) <= eps:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class PrivatePoint:
    """The eps-private losses of Example V-B at one ``eps`` (nats)."""

    eps: float
    s: float
    leaks: tuple[float, float, float]
    losses: SettingLosses


THREE_AGENTS = ("x1", "x2", "x3")


def example_vb_at_noise(r: float, s: float, n_train: int = N_TRAIN) -> SettingLosses:
    """Four losses of Example V-B for the aggregation noise ``s`` (eqs. 6, 9-11)."""
    joint = DataJoint(three_agent_model(r, s), n_train)
    return setting_losses(joint, THREE_AGENTS, shared=("xhat",))


def example_vb(r: float, eps: float, n_train: int = N_TRAIN) -> PrivatePoint:
    """eps-private losses of Example V-B with the least feasible noise ``s(eps)``."""
    s = least_private_noise(r, eps)
    return PrivatePoint(eps, s, privacy_leaks(r, s), example_vb_at_noise(r, s, n_train))


def max_leak(r: float) -> float:
    """``max_k I(X_hat; X_k | X^(-k))`` without noise: beyond this ``eps`` changes nothing."""
    return max(privacy_leaks(r, 0.0))


def eq14_holds(losses: SettingLosses, tol: float = 1e-12) -> bool:
    """``R(CL/CI) <= min(R(CL/DI), R(DL/CI)) <= max(...) <= R(DL/DI)`` (eq. 14)."""
    cc, cd, dc, dd = (losses.R(s) for s in SETTINGS)
    return cc <= min(cd, dc) + tol and max(cd, dc) <= dd + tol

