"""Column transforms for density models on real tables: level codes and the normal-score scale.

Two rules, both fitted on training rows only and both invertible for queries:

* **Few values are levels.** A numeric column whose training rows hold at most
  :data:`MAX_LEVELS` distinct values (counts, flags, codes) is stored as the level code
  ``0..k-1`` of its value (levels = its distinct training values that at least
  :data:`MIN_ROWS` rows hold, ascending) and declared ``discrete``: every learner gives it a
  discrete leaf, whose probability mass is at most 1. A Gaussian on such a column puts a
  near-zero variance on a value that repeats and reports an unbounded "density" there
  (Income's positive log-likelihoods). A value between or beyond the levels, a rarer training
  value included, is read as its nearest level (ties: the lower one), so the model scores a new
  value by the mass of the level it falls nearest to.
* **Heavy tails.** A real column is scaled either by standardisation, ``(x - mean) / std``, or
  by the normal-score transform :class:`NormalScore` (the standard normal quantiles of the
  training values' mid-ranks, linear in between, logarithmic beyond the range), which no
  training or test value can leave far out: a value 10,000 standard deviations out lands ~10
  units out instead of 10,000, so one row no longer sets a test set's mean log-likelihood.
  :func:`select_scale` chooses between the two per column on validation rows carved from the
  training rows (:func:`validation_split`), by the validation log-likelihood of a small Gaussian
  mixture fitted in each candidate's units and measured in standardised units (the normal-score
  candidate's log-Jacobian added), so the two are compared on one scale.

Both keep to the k-rows rule (:data:`MIN_ROWS`): what they store, and so what a model's codec
carries, holds no value that fewer than ``k`` training rows hold: rarer values are no level,
and every knot of a normal score is the mean of ``k`` consecutive values.
:func:`safe_median` does the same for imputation.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpifc.errors import UserError

MAX_LEVELS = 32
"""A numeric column with at most this many distinct training values is stored as level codes."""

MIN_ROWS = 5
"""``k`` of the k-rows rule: a value fewer training rows hold is never stored (no level, knot or
imputed value is one); the same ``k`` as ``mpifc.circuit.privacy.MIN_LEAF_ROWS``."""

OFF_GRID = 2.0 ** -40
"""Relative step that moves a mean of values off their decimal grid (as
``mpifc.circuit.privacy.OFF_GRID`` does for a client's Gaussian moments)."""

GOLDEN_SHARE = (3.0 - math.sqrt(5.0)) / 2.0
"""Where in the gap between two neighbouring values a stored point goes (~0.382 of the way up):
an irrational share, so that on a column of integer-like values it is no value of the lattice."""

SCALES = ("auto", "standardize", "normal-score")
"""``--scale`` choices for real columns; ``auto`` picks one of the other two per column."""

N_KNOTS = 256
"""At most this many quantile knots per normal-score column (and at most one per ``k`` rows), so a
manifest stays small on large tables."""

VALIDATION_FRACTION = 0.2
"""Share of the training rows held out to choose a column's scale."""

GMM_COMPONENTS = 3
"""Components of the Gaussian mixture that scores a candidate scale: a column's marginal under a
circuit of Gaussian leaves is a mixture of Gaussians."""

_GMM_ITERS = 60
_GMM_MIN_VAR = 1e-3  # in the candidate's units (both candidates have unit spread)
_LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- levels
def few_levels(values: np.ndarray, max_levels: int, k: int = MIN_ROWS) -> np.ndarray | None:
    """If ``values`` (NaN ignored) hold at most ``max_levels`` distinct values: those that at
    least ``k`` of them hold, sorted (the others are read as their nearest level, see
    :func:`to_levels`); else None (also for ``max_levels <= 0``, no value, or no value held
    ``k`` times)."""
    if max_levels <= 0:
        return None
    seen = values[~np.isnan(values)]
    if seen.size == 0:
        return None
    levels, counts = np.unique(seen, return_counts=True)
    if levels.size > max_levels or not np.any(counts >= k):
        return None
    return levels[counts >= k]


def safe_median(values: np.ndarray, k: int = MIN_ROWS) -> float:
    """The median of ``values`` (NaN ignored, at least one value) if at least ``k`` of them hold
    it; else a point in the gap above the lower middle value (:data:`GOLDEN_SHARE` of the way to
    the next value up), which no value is (for an even count, still a median: any point between
    the two middle values is). One distinct value: that value."""
    seen = np.sort(values[~np.isnan(values)])
    med = float(np.median(seen))
    if int(np.count_nonzero(seen == med)) >= k:
        return med
    lo = float(seen[(seen.size - 1) // 2])
    above = seen[seen > lo]
    if above.size == 0:
        below = seen[seen < lo]
        return lo if below.size == 0 else lo - GOLDEN_SHARE * (lo - float(below[-1]))
    return lo + GOLDEN_SHARE * (float(above[0]) - lo)


def to_levels(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Level codes ``(m,)`` float64 of ``values``: the index of the nearest level (ties: the
    lower); NaN stays NaN."""
    out = np.full(values.shape, np.nan)
    seen = ~np.isnan(values)
    if levels.size == 1:
        out[seen] = 0.0
        return out
    mids = 0.5 * (levels[:-1] + levels[1:])
    out[seen] = np.searchsorted(mids, values[seen], side="left").astype(np.float64)
    return out


def from_levels(codes: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The level values of ``codes`` (rounded and clipped into ``0..k-1``); NaN stays NaN."""
    out = np.full(codes.shape, np.nan)
    seen = ~np.isnan(codes)
    idx = np.clip(np.rint(codes[seen]), 0, levels.size - 1).astype(np.int64)
    out[seen] = levels[idx]
    return out


# --------------------------------------------------------------------------- normal scores
class NormalScore:
    """The normal-score transform of one column, ``z = T(x)``, strictly increasing on the reals.

    Knots ``(x_k, z_k)``: the mean of ``k`` consecutive training values (:data:`MIN_ROWS`; a
    statistic of ``k`` rows, like every parameter a client sends) and the standard normal
    quantile of their middle rank, for at most ``n_knots`` such windows, evenly spaced over the
    sorted values and disjoint (windows inside one block of equal values make one knot at their
    mean rank), moved off the values' decimal grid by a relative :data:`OFF_GRID`, so no
    knot is a value and no row's score is a knot's. Between knots ``T`` is linear; beyond the
    first and last knot it grows with the logarithm of the distance,
    ``z = z_K + log(1 + (x - x_K) / s)``, with ``s`` set so the slope is continuous, so far-out
    values stay within a few units. :meth:`inverse` undoes it exactly up to floating-point
    rounding.

    Attributes:
        x, z: ``(K,)`` knots, both strictly increasing (``K >= 2``).
        scale_lo, scale_hi: ``s`` of the lower and upper tail (units of ``x``).
    """

    def __init__(self, x: np.ndarray, z: np.ndarray, scale_lo: float, scale_hi: float) -> None:
        self.x = np.asarray(x, dtype=np.float64)
        self.z = np.asarray(z, dtype=np.float64)
        self.scale_lo = float(scale_lo)
        self.scale_hi = float(scale_hi)
        if (self.x.ndim != 1 or self.x.size < 2 or self.x.shape != self.z.shape
                or not np.all(np.diff(self.x) > 0) or not np.all(np.diff(self.z) > 0)
                or not (self.scale_lo > 0 and self.scale_hi > 0)
                or not (np.all(np.isfinite(self.x)) and np.all(np.isfinite(self.z)))):
            raise UserError("normal-score transform: knots must be finite and strictly increasing "
                            "(at least 2) and the tail scales > 0")

    @classmethod
    def fit(cls, values: np.ndarray, n_knots: int = N_KNOTS, k: int = MIN_ROWS) -> "NormalScore | None":
        """Fit on ``values`` (NaN ignored); None if there are fewer than two knots to make (fewer
        than ``2 k`` values, or a column that is one value but for a few rows)."""
        from scipy.special import ndtri

        seen = np.sort(np.asarray(values, dtype=np.float64))
        seen = seen[~np.isnan(seen)]
        n = seen.size
        m = min(int(n_knots), n // k)
        if m < 2:
            return None
        # m windows of k sorted values, evenly spaced and disjoint (n / m >= k rows apart)
        start = np.floor(np.arange(m) * ((n - k) / (m - 1))).astype(np.int64)
        x = seen[start[:, None] + np.arange(k)[None, :]].mean(axis=1)
        # windows inside one block of equal values share one knot, at their mean rank
        x, inverse = np.unique(x, return_inverse=True)
        z = ndtri(np.bincount(inverse, weights=(start + 0.5 * k) / n) / np.bincount(inverse))
        # off the grid of values with a few decimals (the mean of five such values is often one
        # of them, or a sixth), by a relative 2^-40
        x = x * (1.0 + OFF_GRID)
        if x.size < 2:
            return None
        slope_lo = (z[1] - z[0]) / (x[1] - x[0])
        slope_hi = (z[-1] - z[-2]) / (x[-1] - x[-2])
        return cls(x, z, 1.0 / slope_lo, 1.0 / slope_hi)

    def forward(self, v: np.ndarray) -> np.ndarray:
        """``T(v)``, elementwise; NaN stays NaN."""
        v = np.asarray(v, dtype=np.float64)
        out = np.interp(v, self.x, self.z)
        lo, hi = v < self.x[0], v > self.x[-1]
        out[lo] = self.z[0] - np.log1p((self.x[0] - v[lo]) / self.scale_lo)
        out[hi] = self.z[-1] + np.log1p((v[hi] - self.x[-1]) / self.scale_hi)
        out[np.isnan(v)] = np.nan
        return out

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """``T^-1(z)``, elementwise; NaN stays NaN."""
        z = np.asarray(z, dtype=np.float64)
        out = np.interp(z, self.z, self.x)
        lo, hi = z < self.z[0], z > self.z[-1]
        with np.errstate(over="ignore"):
            out[lo] = self.x[0] - self.scale_lo * np.expm1(self.z[0] - z[lo])
            out[hi] = self.x[-1] + self.scale_hi * np.expm1(z[hi] - self.z[-1])
        out[np.isnan(z)] = np.nan
        return out

    def log_derivative(self, v: np.ndarray) -> np.ndarray:
        """``log T'(v)`` (nats), elementwise; at a knot the mean of the two neighbouring slopes."""
        v = np.asarray(v, dtype=np.float64)
        slopes = np.diff(self.z) / np.diff(self.x)  # (K - 1,)
        # slope of each piece: lower tail, K - 1 segments, upper tail (tails: at the knot)
        left = np.concatenate([[1.0 / self.scale_lo], slopes])     # piece ending at knot k
        right = np.concatenate([slopes, [1.0 / self.scale_hi]])    # piece starting at knot k
        k = np.clip(np.searchsorted(self.x, v, side="right") - 1, 0, self.x.size - 1)
        out = np.log(right[k])
        inside = (v > self.x[0]) & (v < self.x[-1])
        seg = np.clip(k, 0, slopes.size - 1)
        out[inside] = np.log(slopes[seg[inside]])
        at_knot = self.x[k] == v
        out[at_knot] = np.log(0.5 * (left[k[at_knot]] + right[k[at_knot]]))
        lo, hi = v < self.x[0], v > self.x[-1]
        out[lo] = -np.log(self.scale_lo + (self.x[0] - v[lo]))
        out[hi] = -np.log(self.scale_hi + (v[hi] - self.x[-1]))
        out[np.isnan(v)] = np.nan
        return out

    def to_json(self) -> dict[str, Any]:
        return {"x": [float(a) for a in self.x], "z": [float(a) for a in self.z],
                "scale_lo": self.scale_lo, "scale_hi": self.scale_hi}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "NormalScore":
        return cls(np.asarray(data["x"], dtype=np.float64), np.asarray(data["z"], dtype=np.float64),
                   float(data["scale_lo"]), float(data["scale_hi"]))


# --------------------------------------------------------------------------- choosing a scale
def validation_split(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(fit, validation)`` of ``n`` training rows: a random
    :data:`VALIDATION_FRACTION` (at least one row) held out, both sorted."""
    n_val = max(1, int(round(VALIDATION_FRACTION * n))) if n >= 2 else 0
    perm = rng.permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


_GMM_CELLS = 2_000_000
"""At most this many (row, column, component) cells per batch of :func:`gmm_fit_columns`."""


def _column_quantiles(z: np.ndarray, seen: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.quantile`` (linear) of every column of ``z`` ``(n, c)`` over its values ``seen``, at
    each of ``q``: ``(q.size, c)`` (one sort, where ``np.nanquantile`` loops over columns)."""
    srt = np.sort(z, axis=0)  # NaN last
    pos = q[:, None] * (seen.sum(axis=0) - 1)[None, :]
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(seen.sum(axis=0) - 1, 0))
    t = pos - lo
    a, b = np.take_along_axis(srt, lo, axis=0), np.take_along_axis(srt, hi, axis=0)
    # numpy's linear interpolation: from the nearer end
    return np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)


def gmm_fit_columns(z: np.ndarray, k: int = GMM_COMPONENTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``k``-component 1-D Gaussian mixture by EM for every column of ``z`` ``(n, c)`` at once,
    NaN cells ignored, each started at its column's quantiles (no random start, so the same data
    give the same mixtures). Every column needs at least ``k`` values. Returns ``(weights, means,
    variances)``, each ``(c, k)``."""
    z = np.asarray(z, dtype=np.float64)
    n, c = z.shape
    out = [np.empty((c, k)) for _ in range(3)]
    step = max(1, _GMM_CELLS // max(1, n * k))
    for lo in range(0, c, step):
        block = z[:, lo: lo + step]
        seen = ~np.isnan(block)
        zz = np.where(seen, block, 0.0)[None]  # (1, n, c): components along the first axis
        means = _column_quantiles(block, seen, (np.arange(k) + 0.5) / k)[:, None, :]  # (k, 1, c)
        var = np.repeat(np.maximum(np.nanvar(block, axis=0), _GMM_MIN_VAR)[None, None, :], k, axis=0)
        w = np.full(means.shape, 1.0 / k)
        for _ in range(_GMM_ITERS):
            lp = np.log(w) - 0.5 * (_LOG_2PI + np.log(var) + (zz - means) ** 2 / var)  # (k, n, c)
            r = np.exp(lp - lp.max(axis=0))
            r *= seen / r.sum(axis=0)
            nk = r.sum(axis=1, keepdims=True) + 1e-12
            w = nk / nk.sum(axis=0)
            means = (r * zz).sum(axis=1, keepdims=True) / nk
            var = np.maximum((r * (zz - means) ** 2).sum(axis=1, keepdims=True) / nk, _GMM_MIN_VAR)
        for o, a in zip(out, (w, means, var)):
            o[lo: lo + step] = a[:, 0, :].T
    return out[0], out[1], out[2]


def _mean_log_density(z: np.ndarray, mixture: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Per column of ``z`` ``(n, c)`` (NaN cells ignored), the mean of ``log p(z)`` (nats) under
    that column's mixture of ``mixture`` (each ``(c, k)``)."""
    w, means, var = (a.T[:, None, :] for a in mixture)  # (k, 1, c)
    seen = ~np.isnan(z)
    lp = np.log(w) - 0.5 * (_LOG_2PI + np.log(var) + (np.where(seen, z, 0.0)[None] - means) ** 2 / var)
    top = lp.max(axis=0)
    dens = np.where(seen, top + np.log(np.exp(lp - top).sum(axis=0)), 0.0)
    return dens.sum(0) / seen.sum(0)


def _pad(columns: list[np.ndarray]) -> np.ndarray:
    """Columns of different lengths as one ``(max length, c)`` array, NaN below each."""
    out = np.full((max(c.size for c in columns), len(columns)), np.nan)
    for j, col in enumerate(columns):
        out[: col.size, j] = col
    return out


def select_scales(fit_values: np.ndarray, val_values: np.ndarray,
                  progress: Any = None) -> list[tuple[str, dict[str, float]]]:
    """The scale of every real column of ``fit_values`` ``(n_fit, c)`` chosen on the validation
    rows ``val_values`` ``(n_val, c)`` (NaN cells ignored; the mixtures of all columns fitted
    together, in batches).

    Per column, each candidate is fitted on its fit values, a :func:`gmm_fit_columns` mixture is fitted
    to the fitted candidate's values, and the candidate is scored by the mean log-density of the
    validation values in standardised units (the fit values' mean and std): the mixture's
    log-density plus, for the normal score, ``log T'(x) + log std``. The higher score wins; a tie,
    a column without two distinct values, or no validation value keeps ``standardize``.
    ``progress(done)``, if given, is called with the columns done so far.

    Returns:
        per column, ``(chosen, {candidate: validation mean log-density in nats per row})``.
    """
    c = fit_values.shape[1]
    out: list[tuple[str, dict[str, float]]] = [("standardize", {}) for _ in range(c)]
    cand: list[int] = []
    zs, zn, vs, vn, jac = [], [], [], [], []
    for j in range(c):
        fit = fit_values[:, j][~np.isnan(fit_values[:, j])]
        val = val_values[:, j][~np.isnan(val_values[:, j])]
        std = float(np.std(fit)) if fit.size else 0.0
        ns = NormalScore.fit(fit) if fit.size else None
        if std <= 0 or ns is None or val.size == 0:
            continue
        mean = float(np.mean(fit))
        cand.append(j)
        zs.append((fit - mean) / std)
        zn.append(ns.forward(fit))
        vs.append((val - mean) / std)
        vn.append(ns.forward(val))
        jac.append(ns.log_derivative(val) + math.log(std))
    step = max(1, _GMM_CELLS // max(1, fit_values.shape[0] * GMM_COMPONENTS))
    for lo in range(0, len(cand), step):
        part = slice(lo, lo + step)
        s_std = _mean_log_density(_pad(vs[part]), gmm_fit_columns(_pad(zs[part])))
        s_ns = _mean_log_density(_pad(vn[part]), gmm_fit_columns(_pad(zn[part])))
        s_ns = s_ns + np.array([float(np.mean(a)) for a in jac[part]])
        for i, j in enumerate(cand[part]):
            scores = {"standardize": float(s_std[i]), "normal-score": float(s_ns[i])}
            out[j] = ("normal-score" if scores["normal-score"] > scores["standardize"] else "standardize", scores)
        if progress is not None:
            progress(min(lo + step, len(cand)))
    return out


def select_scale(fit_values: np.ndarray, val_values: np.ndarray) -> tuple[str, dict[str, float]]:
    """:func:`select_scales` of one column ``(n,)``: ``(chosen, {candidate: score})``."""
    return select_scales(np.asarray(fit_values, dtype=np.float64)[:, None],
                         np.asarray(val_values, dtype=np.float64)[:, None])[0]


