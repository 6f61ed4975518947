"""Gaussian leaves: :class:`Gaussian` (variance floor/ceiling) and :class:`DiscretizedGaussian` (integer levels)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpifc.circuit.lazy import torch  # imported on first use: numpy paths never need it

from mpifc.circuit.leaves.base import (_BIG, _LOG_2PI, LOG_ZERO, MIN_FLOW, Leaf, Params, _clean_values, _finish, _flow,
                                       _mix, _np_finish, bad_value)
from mpifc.circuit.privacy import MIN_LEAF_ROWS
from mpifc.errors import UserError


def _normal_problem(p: dict[str, np.ndarray]) -> str | None:
    """The checks a Gaussian's and a discretized Gaussian's parameters share."""
    return (bad_value(p, "mean", np.isfinite(p["mean"]), "a mean must be finite")
            or bad_value(p, "var", np.isfinite(p["var"]) & (p["var"] > 0), "a variance must be finite and > 0")
            or bad_value(p, "min_var", np.isfinite(p["min_var"]) & (p["min_var"] > 0),
                         "the variance floor must be finite and > 0")
            or bad_value(p, "max_var", p["max_var"] >= p["min_var"], "the variance ceiling must be >= min_var"))


class Gaussian(Leaf):
    """Normal ``N(mean, var)`` with ``var`` kept in ``[min_var, max_var]``.

    Args:
        mean: mean.
        var: variance (> 0); clipped into ``[min_var, max_var]``.
        min_var: variance floor (guards collapsing components).
        max_var: optional variance ceiling (the paper's ``max_var``), ``None`` = no ceiling.
    """

    type_name = "gaussian"
    param_names = ("mean", "var", "min_var", "max_var")
    learnable = ("mean", "var")

    def __init__(self, mean: float, var: float, min_var: float = 1e-6, max_var: float | None = None) -> None:
        max_var = math.inf if max_var is None else float(max_var)
        if not (math.isfinite(mean) and math.isfinite(var) and var > 0):
            raise UserError(f"Gaussian: need finite mean and var > 0, got mean={mean}, var={var}")
        if not (min_var > 0 and max_var >= min_var):
            raise UserError(f"Gaussian: need 0 < min_var <= max_var, got {min_var}, {max_var}")
        v = min(max(float(var), float(min_var)), max_var)
        self._p = {k: np.array(float(val)) for k, val in
                   zip(self.param_names, (mean, v, min_var, max_var))}

    @classmethod
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        return _normal_problem(p)

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        v = P["var"]
        lp = -0.5 * (_LOG_2PI + torch.log(v) + (x - P["mean"]) ** 2 / v)
        return _finish(lp, x)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        v = P["var"]
        with np.errstate(invalid="ignore", over="ignore"):
            lp = -0.5 * (_LOG_2PI + np.log(v) + (x - P["mean"]) ** 2 / v)
        return _np_finish(lp, x)

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        return np.maximum(-0.5 * (_LOG_2PI + np.log(P["var"])), 0.0)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return P["mean"].clone()

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        m = P["mean"].double().cpu().numpy()[idx]
        s = np.sqrt(P["var"].double().cpu().numpy()[idx])
        return m + s * rng.standard_normal(len(idx))

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        w = _flow(x, w)
        # Centre on the current mean: same shift on every shard keeps stats additive and avoids
        # the cancellation in E[x^2] - E[x]^2 for large means.
        # Clamp so that absurd inputs (|x| ~ 1e300) cannot overflow the squares to inf.
        d = torch.nan_to_num(x - P["mean"], nan=0.0).clamp(-_BIG, _BIG)
        return {"N": w.sum(0), "S1": (w * d).sum(0), "S2": (w * d * d).sum(0)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        N = stats["N"]
        # A component with fewer than k rows' worth of flow keeps its mean and variance: fitted
        # to those rows, it would be (nearly) their values (mpifc.circuit.privacy).
        ok = N >= max(MIN_FLOW, MIN_LEAF_ROWS)
        Ns = torch.where(ok, N, torch.ones_like(N))
        m1 = stats["S1"] / Ns
        var = (stats["S2"] / Ns - m1 * m1).clamp_min(0.0)
        mean = P["mean"] + m1
        out = dict(P)
        out["mean"] = _mix(P["mean"], mean, ok, step_size)
        out["var"] = _mix(P["var"], var, ok, step_size).clamp(P["min_var"], P["max_var"])
        return out

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, min_var: float = 1e-6,
            max_var: float | None = None, **_: Any) -> "Gaussian":
        v, w = _clean_values(values, weights)
        if w.sum() <= 0:
            return cls(0.0, 1.0, min_var, max_var)
        m = float(np.average(v, weights=w))
        var = float(np.average((v - m) ** 2, weights=w))
        return cls(m, max(var, min_var), min_var, max_var)


def _log1mexp(z: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(z))`` for ``z <= 0``, accurate on both ends."""
    return torch.where(z > -math.log(2.0), torch.log(-torch.expm1(z)), torch.log1p(-torch.exp(z)))


def _log_interval_mass(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``log(Phi(b) - Phi(a))`` for standardised ``a < b`` (may be infinite), stable in both tails."""
    flip = a > 0  # upper tail: Phi(b)-Phi(a) == Phi(-a)-Phi(-b), evaluated where Phi is tiny
    hi = torch.where(flip, -a, b)
    lo = torch.where(flip, -b, a)
    lhi, llo = torch.special.log_ndtr(hi), torch.special.log_ndtr(lo)
    return lhi + _log1mexp((llo - lhi).clamp_max(0.0))


def _np_log_interval_mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_log_interval_mass` in numpy (scipy's ``log_ndtr``)."""
    from scipy.special import log_ndtr

    flip = a > 0
    hi = np.where(flip, -a, b)
    lo = np.where(flip, -b, a)
    lhi, llo = log_ndtr(hi), log_ndtr(lo)
    z = np.minimum(llo - lhi, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return lhi + np.where(z > -math.log(2.0), np.log(-np.expm1(z)), np.log1p(-np.exp(z)))


class DiscretizedGaussian(Leaf):
    """Gaussian censored to integer levels ``k = 0..levels-1`` (paper appendix E.2, fixed).

    Level ``k`` gets the mass of ``[k*w, (k+1)*w)`` under ``N(mean, var)`` with ``w = bin_width``,
    except that the first bin extends to ``-inf`` and the last to ``+inf``. The paper's
    ``Phi((x-mu+1/255)/sigma) - Phi((x-mu)/sigma)`` uses the same interior bins but loses the two
    tails, so its masses sum to less than 1; ours sum to exactly 1. ``mean``/``var`` are in the
    scaled unit (``k*w``; with the defaults, pixels in ``[0, 1]``).

    EM treats the continuous value as latent (censored-data EM with truncated-normal moments), so
    it is exact EM and never decreases the likelihood.

    Args:
        mean: mean in scaled units.
        var: variance in scaled units squared, clipped into ``[min_var, max_var]``.
        levels: number of integer levels ``L`` (256 for 8-bit pixels).
        bin_width: ``w``, scaled width of one level (1/255 maps levels to ``[0, 1]``).
        min_var, max_var: variance floor and optional ceiling (the paper uses 1e-3 and 0.25).
    """

    type_name = "discretized_gaussian"
    param_names = ("mean", "var", "levels", "bin_width", "min_var", "max_var")
    learnable = ("mean", "var")

    def __init__(self, mean: float, var: float, levels: int = 256, bin_width: float = 1.0 / 255,
                 min_var: float = 1e-6, max_var: float | None = None) -> None:
        max_var = math.inf if max_var is None else float(max_var)
        if not (math.isfinite(mean) and math.isfinite(var) and var > 0 and levels >= 2 and bin_width > 0):
            raise UserError(f"DiscretizedGaussian: bad parameters mean={mean}, var={var}, "
                            f"levels={levels}, bin_width={bin_width}")
        if not (min_var > 0 and max_var >= min_var):
            raise UserError(f"DiscretizedGaussian: need 0 < min_var <= max_var, got {min_var}, {max_var}")
        v = min(max(float(var), float(min_var)), max_var)
        self._p = {k: np.array(float(val)) for k, val in
                   zip(self.param_names, (mean, v, int(levels), bin_width, min_var, max_var))}

    @classmethod
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        levels = p["levels"]
        return (_normal_problem(p)
                or bad_value(p, "levels", (levels >= 2) & (levels == np.floor(levels)) & np.isfinite(levels),
                             "the number of levels must be an integer >= 2")
                or bad_value(p, "bin_width", np.isfinite(p["bin_width"]) & (p["bin_width"] > 0),
                             "a bin width must be finite and > 0"))

    @classmethod
    def _std_edges(cls, P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        L, w = P["levels"], P["bin_width"]
        xc = torch.nan_to_num(x, nan=0.0)
        ok = (xc >= 0) & (xc <= L - 1) & (xc == torch.floor(xc))
        s = torch.sqrt(P["var"])
        inf = torch.full_like(xc, math.inf)
        a = torch.where(xc <= 0, -inf, (xc * w - P["mean"]) / s)
        b = torch.where(xc >= L - 1, inf, ((xc + 1) * w - P["mean"]) / s)
        return a, b, ok

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        a, b, ok = cls._std_edges(P, x)
        lp = _log_interval_mass(a, b)
        return _finish(torch.where(ok, lp, torch.full_like(lp, LOG_ZERO)), x)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        L, w = P["levels"], P["bin_width"]
        xc = np.nan_to_num(x, nan=0.0)
        ok = (xc >= 0) & (xc <= L - 1) & (xc == np.floor(xc))
        s = np.sqrt(P["var"])
        with np.errstate(invalid="ignore", over="ignore"):
            a = np.where(xc <= 0, -np.inf, (xc * w - P["mean"]) / s)
            b = np.where(xc >= L - 1, np.inf, ((xc + 1) * w - P["mean"]) / s)
            lp = _np_log_interval_mass(a, b)
        return _np_finish(np.where(ok, lp, LOG_ZERO), x)

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        return np.zeros(P["mean"].shape[0])  # a probability mass

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        # Among the equal-width interior bins the one holding the mean has the most mass; the two
        # half-infinite end bins can hold more, so compare those three candidates.
        k = torch.floor(P["mean"] / P["bin_width"]).clamp(torch.zeros_like(P["levels"]), P["levels"] - 1)
        cand = torch.stack([k, torch.zeros_like(k), P["levels"] - 1], 0)  # (3, n)
        best = cls.batch_log_prob(P, cand).argmax(0, keepdim=True)
        return cand.gather(0, best)[0]

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        m = P["mean"].double().cpu().numpy()[idx]
        s = np.sqrt(P["var"].double().cpu().numpy()[idx])
        z = m + s * rng.standard_normal(len(idx))
        return np.clip(np.floor(z / P["bin_width"].double().cpu().numpy()[idx]), 0,
                       P["levels"].double().cpu().numpy()[idx] - 1)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        a, b, ok = cls._std_edges(P, x)
        w = torch.where(ok & ~torch.isnan(x), w, torch.zeros_like(w))
        logZ = _log_interval_mass(a, b)
        log_phi = lambda t: -0.5 * (t * t + _LOG_2PI)  # noqa: E731
        ra = torch.where(torch.isfinite(a), torch.exp(log_phi(a) - logZ), torch.zeros_like(a))
        rb = torch.where(torch.isfinite(b), torch.exp(log_phi(b) - logZ), torch.zeros_like(b))
        aa = torch.where(torch.isfinite(a), a * ra, torch.zeros_like(a))
        bb = torch.where(torch.isfinite(b), b * rb, torch.zeros_like(b))
        s = torch.sqrt(P["var"])
        # Truncated-normal moments of the latent value, centred on the current mean.
        d1 = s * (ra - rb)
        vz = (P["var"] * (1 + aa - bb - (ra - rb) ** 2)).clamp_min(0.0)
        good = torch.isfinite(d1) & torch.isfinite(vz)
        mid = (torch.nan_to_num(x, nan=0.0) + 0.5) * P["bin_width"] - P["mean"]
        d1 = torch.where(good, d1, mid)  # far-tail fallback: bin midpoint
        used = w > 0
        d1 = torch.where(used, d1, torch.zeros_like(d1)).clamp(-_BIG, _BIG)
        vz = torch.where(good & used, vz, torch.zeros_like(vz)).clamp_max(_BIG)
        return {"N": w.sum(0), "S1": (w * d1).sum(0), "S2": (w * (vz + d1 * d1)).sum(0)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        return Gaussian.batch_m_step(P, stats, step_size)

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, levels: int = 256, bin_width: float = 1.0 / 255,
            min_var: float = 1e-6, max_var: float | None = None, **_: Any) -> "DiscretizedGaussian":
        """Moments of the bin midpoints plus Sheppard's ``w^2/12`` (not the exact censored MLE;
        run EM to refine)."""
        v, w = _clean_values(values, weights)
        if w.sum() <= 0:
            return cls(0.5 * levels * bin_width, 1.0, levels, bin_width, min_var, max_var)
        u = (v + 0.5) * bin_width
        m = float(np.average(u, weights=w))
        var = float(np.average((u - m) ** 2, weights=w)) + bin_width ** 2 / 12
        return cls(m, var, levels, bin_width, min_var, max_var)


def tie_variance_floors(x: np.ndarray, real: Any) -> np.ndarray:
    """Per column of ``x`` ``(n, d)``, the variance floor a Gaussian leaf on it gets from its ties.

    A real column whose value ``v`` repeats (an imputed median, a point mass at 0, a few-valued
    column left real) holds no information finer than the interval ``v`` stands for: from
    halfway to the next lower distinct value to halfway to the next higher one (at an end of the
    range, the inner half mirrored). The floor is the variance of a uniform over that interval
    of the column's most repeated value, ``width^2 / 12``, so a component fitted to the repeats
    cannot shrink onto one point and claim an unbounded density there. The rule every learner
    applies (LearnSPN, RAT-SPN, EiNet), on the rows it fits, beside its own ``min_var``.

    Args:
        x: ``(n, d)`` float64 training rows (NaN ignored).
        real: ``(d,)`` booleans; other columns get 0.

    Returns:
        ``(d,)`` float64 floors; 0 where a column has no repeated value or fewer than two
        distinct values.
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(x.shape[1])
    for j in np.flatnonzero(np.asarray(real, dtype=bool)):
        col = x[:, j]
        uniq, counts = np.unique(col[~np.isnan(col)], return_counts=True)
        if uniq.size < 2 or counts.max() < 2:
            continue
        i = int(np.argmax(counts))
        below = uniq[i] - uniq[i - 1] if i > 0 else uniq[i + 1] - uniq[i]
        above = uniq[i + 1] - uniq[i] if i < uniq.size - 1 else uniq[i] - uniq[i - 1]
        width = 0.5 * (below + above)
        out[j] = width * width / 12.0
    return out
