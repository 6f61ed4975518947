"""Univariate leaf distributions with one shared, batched interface.

Every leaf type is a :class:`Leaf` subclass. A leaf instance holds its parameters as float64
numpy arrays (``leaf.params()``). All maths is written once, *batched over many leaves of the
same type*, as classmethods on a "stacked" parameter dict ``P`` of torch tensors with leading
dimension ``n`` (one row per leaf; vector parameters padded, see :meth:`Leaf.stack`). The
compiled evaluator calls these directly; the single-leaf methods (``log_prob``, ``mode``,
``sample``, ``fit``, ``em_statistics``) are thin wrappers with ``n = 1``.

Batched interface (``x`` is ``(batch, n)``: column ``i`` holds the values fed to leaf ``i``):

* ``batch_log_prob(P, x) -> (batch, n)`` log-density/mass in nats; NaN in ``x`` gives 0
  (marginalised); impossible values give :data:`LOG_ZERO` rather than ``-inf`` so that sums,
  differences and gradients stay finite.
* ``batch_mode(P) -> (n,)`` a most probable value per leaf.
* ``batch_sample(P, idx, rng) -> (len(idx),)`` one draw from leaf ``idx[j]`` for each ``j``.
* ``batch_em_stats(P, x, w) -> dict[str, (n, ...)]`` expected sufficient statistics given the
  per-sample responsibilities (flows) ``w`` ``(batch, n)``; additive over samples.
* ``batch_m_step(P, stats, step_size) -> P'`` new parameters, ``(1-step)*old + step*new``;
  leaves whose total flow is ~0 keep their old parameters.

Leaf types: :class:`Gaussian`, :class:`Bernoulli`, :class:`Categorical`, :class:`Histogram`,
:class:`PiecewiseLinear`, :class:`DiscretizedGaussian`. :func:`fit_leaf` picks one
per meta-type.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from mpifc.errors import UserError

LOG_ZERO = -1e30
"""Log-probability used for impossible values (nats); ``exp`` underflows to exactly 0."""

MIN_FLOW = 1e-12
"""A leaf or sum node whose total expected count is below this keeps its old parameters in EM."""

Params = dict[str, torch.Tensor]

_LOG_2PI = math.log(2.0 * math.pi)

_BIG = 1e150
"""Deviations from the mean are clamped to +-_BIG in EM statistics (squares stay finite)."""


def _as_tensor(x: Any, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype)


def _safe_log(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p).clamp_min(LOG_ZERO)


def _finish(lp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Floor at LOG_ZERO, replace NaN results by LOG_ZERO, and marginalise NaN inputs to 0."""
    lp = torch.nan_to_num(lp, nan=LOG_ZERO, neginf=LOG_ZERO).clamp_min(LOG_ZERO)
    return torch.where(torch.isnan(x), torch.zeros_like(lp), lp)


def _clean_values(values: Any, weights: Any | None) -> tuple[np.ndarray, np.ndarray]:
    """Drop NaN values; return (values, weights) as float64 1-D arrays."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != v.shape:
        raise UserError(f"leaf fit: weights shape {w.shape} != values shape {v.shape}")
    if np.any(~np.isfinite(w)) or np.any(w < 0):
        raise UserError("leaf fit: weights must be finite and >= 0")
    keep = ~np.isnan(v)
    return v[keep], w[keep]


class Leaf:
    """Base class: a univariate distribution with batched, log-space maths.

    Subclasses set ``type_name`` (stable string used in HDF5), ``param_names`` (storage order),
    ``learnable`` (parameters counted by ``num_parameters`` and updated by EM) and ``ragged``
    (vector parameters; padded with ``pad`` values when stacked).
    """

    type_name: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = ()
    learnable: ClassVar[tuple[str, ...]] = ()
    ragged: ClassVar[tuple[str, ...]] = ()
    pad: ClassVar[dict[str, float]] = {}
    em_trainable: ClassVar[bool] = True

    _p: dict[str, np.ndarray]

    # -- parameter storage -------------------------------------------------------------------

    def params(self) -> dict[str, np.ndarray]:
        """Copies of all parameters (learnable and hyper-parameters) as float64 arrays."""
        return {k: self._p[k].copy() for k in self.param_names}

    @classmethod
    def from_params(cls, params: dict[str, np.ndarray]) -> "Leaf":
        """Rebuild a leaf from :meth:`params` output, bit-exactly, without re-validation."""
        obj = cls.__new__(cls)
        obj._p = {k: np.array(params[k], dtype=np.float64) for k in cls.param_names}
        return obj

    def num_parameters(self) -> int:
        """Number of learnable scalars."""
        return int(sum(self._p[k].size for k in self.learnable))

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={np.array2string(self._p[k], precision=4)}" for k in self.learnable)
        return f"{type(self).__name__}({parts})"

    @classmethod
    def stack(cls, leaves: Sequence["Leaf"], dtype: torch.dtype = torch.float64) -> Params:
        """Stack ``n`` leaves of this type into batched parameters.

        Scalars become ``(n,)``; ragged vectors become ``(n, max_len)`` padded with ``cls.pad``,
        and their lengths are stored under ``"len_<name>"`` as int64 ``(n,)``.
        """
        P: Params = {}
        for k in cls.param_names:
            arrs = [lf._p[k] for lf in leaves]
            if k in cls.ragged:
                m = max(a.size for a in arrs)
                buf = np.full((len(arrs), m), cls.pad.get(k, 0.0))
                for i, a in enumerate(arrs):
                    buf[i, : a.size] = a
                P[k] = torch.as_tensor(buf, dtype=dtype)
                P["len_" + k] = torch.as_tensor([a.size for a in arrs], dtype=torch.int64)
            else:
                P[k] = torch.as_tensor(np.array([float(a) for a in arrs]), dtype=dtype)
        return P

    @classmethod
    def unstack(cls, P: Params) -> list["Leaf"]:
        """Inverse of :meth:`stack` (float64 leaves)."""
        n = next(iter(P.values())).shape[0]
        out = []
        for i in range(n):
            d = {}
            for k in cls.param_names:
                v = P[k][i].detach().to(torch.float64).cpu().numpy()
                if k in cls.ragged:
                    v = v[: int(P["len_" + k][i])]
                d[k] = np.array(v, dtype=np.float64)
            out.append(cls.from_params(d))
        return out

    # -- batched maths (overridden) ----------------------------------------------------------

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """Default (EM-frozen types): only the total flow ``N`` ``(n,)``."""
        return {"N": _flow(x, w).sum(0)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        return dict(P)

    # -- single-leaf convenience -------------------------------------------------------------

    def _P(self) -> Params:
        return type(self).stack([self])

    def log_prob(self, x: Any) -> torch.Tensor:
        """Log-density/mass of values ``x`` ``(batch,)`` in nats, NaN -> 0. Returns ``(batch,)``."""
        xt = _as_tensor(x).reshape(-1, 1)
        return type(self).batch_log_prob(self._P(), xt)[:, 0]

    def mode(self) -> float:
        """A most probable value."""
        return float(type(self).batch_mode(self._P())[0])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` independent draws, float64 ``(n,)``."""
        return type(self).batch_sample(self._P(), np.zeros(n, dtype=np.int64), rng)

    def em_statistics(self, x: Any, weights: Any | None = None) -> dict[str, np.ndarray]:
        """EM hook: expected sufficient statistics of values ``x`` ``(batch,)`` with responsibilities
        ``weights`` ``(batch,)`` (default 1). Additive over samples."""
        xt = _as_tensor(x).reshape(-1, 1)
        wt = torch.ones_like(xt) if weights is None else _as_tensor(weights).reshape(-1, 1)
        st = type(self).batch_em_stats(self._P(), xt, wt)
        return {k: v[0].numpy().copy() for k, v in st.items()}

    def em_update(self, stats: dict[str, np.ndarray], step_size: float = 1.0) -> None:
        """M-step in place from :meth:`em_statistics` output."""
        st = {k: torch.as_tensor(np.asarray(v, dtype=np.float64))[None] for k, v in stats.items()}
        newP = type(self).batch_m_step(self._P(), st, step_size)
        self._p = type(self).unstack(newP)[0]._p

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, **hp: Any) -> "Leaf":
        """Weighted maximum-likelihood (with smoothing/floors) from ``values`` ``(n,)``; NaN ignored."""
        raise NotImplementedError


def _flow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Responsibilities with NaN (marginalised) entries zeroed: they carry no information."""
    return torch.where(torch.isnan(x), torch.zeros_like(w), w)


def _mix(old: torch.Tensor, new: torch.Tensor, ok: torch.Tensor, step: float) -> torch.Tensor:
    """``(1-step)*old + step*new`` where ``ok``, else ``old`` (guards empty leaves)."""
    while ok.dim() < new.dim():
        ok = ok[..., None]
    upd = old + step * (new - old) if step != 1.0 else new
    return torch.where(ok, upd, old)


TAIL_MASS = 1e-6
"""Default probability mass a continuous Histogram / PiecewiseLinear leaf keeps *outside* its
body ``[lo, hi]`` (the bin edges / outer knots): values beyond the training range get a small
finite density instead of "impossible", so test rows there keep valid posteriors."""


def _tail_log_density(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """Log-density of the two exponential tails attached to a body on ``[lo, hi]``.

    Each side carries mass ``tail / 2`` and decays with scale ``hi - lo`` from the edge:
    ``(tail / 2) / (hi - lo) * exp(-dist / (hi - lo))``, which integrates to exactly ``tail`` over
    ``x < lo`` and ``x > hi``. With the body scaled by ``1 - tail`` the leaf is normalised on the
    whole real line and its log-density falls off linearly, never to ``-inf``.
    """
    scale = (hi - lo)[None, :]
    dist = torch.where(x < lo[None, :], lo[None, :] - x, x - hi[None, :]).clamp_min(0.0)
    return torch.log(tail / 2)[None, :] - torch.log(scale) - dist / scale


def _sample_tails(out: np.ndarray, lo: np.ndarray, hi: np.ndarray, tail: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """Replace each draw by a tail draw with probability ``tail`` (side and distance as in
    :func:`_tail_log_density`). All arrays ``(m,)``; draws always consume the same randoms."""
    u, side, e = rng.random(len(out)), rng.random(len(out)) < 0.5, rng.exponential(size=len(out))
    scale = hi - lo
    t = np.where(side, lo - e * scale, hi + e * scale)
    return np.where(u < tail, t, out)


def _check_tail(tail: float, who: str) -> float:
    if not (0.0 <= float(tail) < 1.0):
        raise UserError(f"{who}: tail mass must be in [0, 1), got {tail}")
    return float(tail)


# ============================================================================== Gaussian


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
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        v = P["var"]
        lp = -0.5 * (_LOG_2PI + torch.log(v) + (x - P["mean"]) ** 2 / v)
        return _finish(lp, x)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return P["mean"].clone()

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        m = P["mean"].double().numpy()[idx]
        s = np.sqrt(P["var"].double().numpy()[idx])
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
        ok = N > MIN_FLOW
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


# ============================================================================== Bernoulli


class Bernoulli(Leaf):
    """Bernoulli on ``{0, 1}`` with ``P(1) = p``; other values are impossible.

    Args:
        p: success probability in ``[0, 1]``.
        alpha: Laplace pseudo-count used by ``fit`` and EM: ``p = (n1 + alpha) / (n + 2 alpha)``.
    """

    type_name = "bernoulli"
    param_names = ("p", "alpha")
    learnable = ("p",)

    def __init__(self, p: float, alpha: float = 1.0) -> None:
        if not (0.0 <= p <= 1.0) or not alpha >= 0:
            raise UserError(f"Bernoulli: need 0 <= p <= 1 and alpha >= 0, got p={p}, alpha={alpha}")
        self._p = {"p": np.array(float(p)), "alpha": np.array(float(alpha))}

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        # Logs on the (n,) parameters, not on the (batch, n) data: one pass over the batch.
        lp1, lp0 = _safe_log(P["p"])[None, :], _safe_log(1 - P["p"])[None, :]
        lp = torch.where(x == 1, lp1, torch.where(x == 0, lp0, LOG_ZERO))
        return torch.where(torch.isnan(x), 0.0, lp)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return (P["p"] > 0.5).to(P["p"].dtype)

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (rng.random(len(idx)) < P["p"].double().numpy()[idx]).astype(np.float64)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        w = _flow(x, w)
        return {"N": w.sum(0), "S1": (w * (x == 1).to(w.dtype)).sum(0)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        a = P["alpha"]
        den = stats["N"] + 2 * a
        ok = den > MIN_FLOW
        p = (stats["S1"] + a) / torch.where(ok, den, torch.ones_like(den))
        out = dict(P)
        out["p"] = _mix(P["p"], p, ok, step_size).clamp(0.0, 1.0)
        return out

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, alpha: float = 1.0, **_: Any) -> "Bernoulli":
        v, w = _clean_values(values, weights)
        n, n1 = w.sum(), w[v == 1].sum()
        if n + 2 * alpha <= 0:
            return cls(0.5, alpha)
        return cls(float((n1 + alpha) / (n + 2 * alpha)), alpha)


# ============================================================================== Categorical


class Categorical(Leaf):
    """Categorical on ``{0, ..., k-1}`` with probabilities ``probs``; other values impossible.

    Args:
        probs: ``(k,)`` non-negative, summing to 1.
        alpha: Laplace pseudo-count per category used by ``fit`` and EM.
    """

    type_name = "categorical"
    param_names = ("probs", "alpha")
    learnable = ("probs",)
    ragged = ("probs",)
    pad = {"probs": 0.0}

    def __init__(self, probs: Sequence[float] | np.ndarray, alpha: float = 1.0) -> None:
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if p.size == 0 or np.any(~np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1) > 1e-6:
            raise UserError(f"Categorical: probs must be finite, >= 0 and sum to 1, got {p}")
        self._p = {"probs": p / p.sum(), "alpha": np.array(float(alpha))}

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        logp = _safe_log(P["probs"])  # (n, K)
        K = logp.shape[1]
        ok = (x >= 0) & (x < K) & (x == torch.floor(x))
        idx = torch.where(ok, x, torch.zeros_like(x)).long()
        lp = logp[torch.arange(logp.shape[0])[None, :], idx]
        return _finish(torch.where(ok, lp, torch.full_like(lp, LOG_ZERO)), x)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return P["probs"].argmax(1).to(P["probs"].dtype)

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cdf = np.cumsum(P["probs"].double().numpy()[idx], axis=1)
        u = rng.random(len(idx)) * cdf[:, -1]
        return np.minimum((cdf <= u[:, None]).sum(1), P["len_probs"].numpy()[idx] - 1).astype(np.float64)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        n, K = P["probs"].shape
        ok = (x >= 0) & (x < K) & (x == torch.floor(x))
        w = torch.where(ok, w, torch.zeros_like(w))
        idx = torch.where(ok, x, torch.zeros_like(x)).long() + K * torch.arange(n)[None, :]
        counts = torch.zeros(n * K, dtype=w.dtype).index_add_(0, idx.reshape(-1), w.reshape(-1))
        return {"counts": counts.view(n, K)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        n, K = P["probs"].shape
        valid = torch.arange(K)[None, :] < P["len_probs"][:, None]
        c = torch.where(valid, stats["counts"] + P["alpha"][:, None], torch.zeros_like(stats["counts"]))
        tot = c.sum(1)
        ok = tot > MIN_FLOW
        p = c / torch.where(ok, tot, torch.ones_like(tot))[:, None]
        out = dict(P)
        out["probs"] = _mix(P["probs"], p, ok, step_size)
        return out

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, alpha: float = 1.0,
            n_categories: int | None = None, **_: Any) -> "Categorical":
        v, w = _clean_values(values, weights)
        if np.any(v != np.floor(v)) or np.any(v < 0):
            raise UserError("Categorical.fit: values must be integers >= 0")
        k = int(n_categories) if n_categories is not None else int(v.max()) + 1 if v.size else 1
        if v.size and v.max() >= k:
            raise UserError(f"Categorical.fit: value {v.max():g} >= n_categories={k}")
        c = np.bincount(v.astype(np.int64), weights=w, minlength=k)[:k] + alpha
        if c.sum() <= 0:
            c = np.ones(k)
        return cls(c / c.sum(), alpha)


# ============================================================================== Histogram


class Histogram(Leaf):
    """Piecewise-constant density on bins ``[breaks[i], breaks[i+1])`` (MSPN leaf).

    With integer ``breaks`` one unit apart and ``discrete=True`` the density equals the mass of
    each integer, so it doubles as a discrete leaf (mode and samples are then the integers; values
    outside the bins are impossible, as for :class:`Categorical`).

    A continuous histogram keeps mass ``tail`` outside ``[breaks[0], breaks[-1])``: the bins
    carry ``1 - tail`` and two exponential tails (see :func:`_tail_log_density`) the rest, so the
    density is positive and normalised on the whole line. EM re-estimates the bins from the
    points inside them (exact EM: the tails have no free parameter).

    Args:
        breaks: ``(b+1,)`` strictly increasing bin edges.
        densities: ``(b,)`` non-negative densities with ``sum(densities * widths) == 1`` (the
            body's shape; the evaluated density inside is ``(1 - tail) * densities``).
        discrete: values are the integers ``breaks[i]`` (mode/sampling return left edges).
        alpha: Laplace pseudo-count per bin used by ``fit`` and EM.
        tail: mass outside the bins (continuous only; ignored when ``discrete``); 0 makes values
            outside impossible.
    """

    type_name = "histogram"
    param_names = ("breaks", "densities", "discrete", "alpha", "tail")
    learnable = ("densities",)
    ragged = ("breaks", "densities")
    pad = {"breaks": math.inf, "densities": 0.0}

    def __init__(self, breaks: Sequence[float] | np.ndarray, densities: Sequence[float] | np.ndarray,
                 discrete: bool = False, alpha: float = 1.0, tail: float = TAIL_MASS) -> None:
        b = np.asarray(breaks, dtype=np.float64).reshape(-1)
        d = np.asarray(densities, dtype=np.float64).reshape(-1)
        if b.size != d.size + 1 or d.size == 0 or np.any(~np.isfinite(b)) or np.any(np.diff(b) <= 0):
            raise UserError(f"Histogram: need b+1 strictly increasing finite breaks for b densities, "
                            f"got {b.size} breaks, {d.size} densities")
        mass = float((d * np.diff(b)).sum())
        if np.any(~np.isfinite(d)) or np.any(d < 0) or abs(mass - 1) > 1e-6:
            raise UserError(f"Histogram: densities must be >= 0 and integrate to 1 (got {mass:.6g})")
        self._p = {"breaks": b, "densities": d / mass, "discrete": np.array(float(discrete)),
                   "alpha": np.array(float(alpha)),
                   "tail": np.array(0.0 if discrete else _check_tail(tail, "Histogram"))}

    @classmethod
    def _bin(cls, P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bin index ``(batch, n)`` and a validity mask."""
        br = P["breaks"]
        xs = torch.nan_to_num(x, nan=0.0).T.contiguous()
        j = (torch.searchsorted(br.contiguous(), xs, right=True) - 1).T
        ok = (j >= 0) & (j < (P["len_breaks"] - 1)[None, :]) & ~torch.isnan(x)
        # A discrete histogram puts its mass on the integers only.
        ok &= (P["discrete"] == 0)[None, :] | (x == torch.floor(x))
        return torch.where(ok, j, torch.zeros_like(j)), ok

    @classmethod
    def _edges(cls, P: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """First and last bin edge ``(n,)`` each."""
        return P["breaks"][:, 0], P["breaks"].gather(1, (P["len_breaks"] - 1)[:, None])[:, 0]

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        j, ok = cls._bin(P, x)
        tail = P["tail"]
        lp = _safe_log(P["densities"])[torch.arange(j.shape[1])[None, :], j] + torch.log1p(-tail)[None, :]
        lo, hi = cls._edges(P)
        xc = torch.nan_to_num(x, nan=0.0)
        outside = ((xc < lo[None, :]) | (xc >= hi[None, :])) & (P["discrete"] == 0)[None, :]
        lt = torch.where(outside, _tail_log_density(xc, lo, hi, tail), torch.full_like(lp, LOG_ZERO))
        return _finish(torch.where(ok, lp, lt), x)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        j = P["densities"].argmax(1, keepdim=True)
        lo = P["breaks"].gather(1, j)[:, 0]
        hi = P["breaks"].gather(1, j + 1)[:, 0]
        return torch.where(P["discrete"] > 0, lo, 0.5 * (lo + hi))

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        br = P["breaks"].double().numpy()[idx]
        d = P["densities"].double().numpy()[idx]
        L = P["len_densities"].numpy()[idx]
        with np.errstate(invalid="ignore"):  # padding edges are inf; their widths become 0
            wid = np.nan_to_num(br[:, 1:] - br[:, :-1], nan=0.0, posinf=0.0)
        cdf = np.cumsum(d * wid, axis=1)
        u = rng.random(len(idx)) * cdf[:, -1]
        j = np.minimum((cdf <= u[:, None]).sum(1), L - 1)
        rows = np.arange(len(idx))
        lo = br[rows, j]
        disc = P["discrete"].double().numpy()[idx] > 0
        out = np.where(disc, lo, lo + rng.random(len(idx)) * wid[rows, j])
        first, last = (e.double().numpy()[idx] for e in cls._edges(P))
        return _sample_tails(out, first, last, P["tail"].double().numpy()[idx], rng)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        n, B = P["densities"].shape
        j, ok = cls._bin(P, x)
        w = torch.where(ok, w, torch.zeros_like(w))
        counts = torch.zeros(n * B, dtype=w.dtype).index_add_(
            0, (j + B * torch.arange(n)[None, :]).reshape(-1), w.reshape(-1))
        return {"counts": counts.view(n, B)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        n, B = P["densities"].shape
        valid = torch.arange(B)[None, :] < P["len_densities"][:, None]
        c = torch.where(valid, stats["counts"] + P["alpha"][:, None], torch.zeros_like(stats["counts"]))
        tot = c.sum(1)
        ok = tot > MIN_FLOW
        wid = torch.where(valid, P["breaks"][:, 1:] - P["breaks"][:, :-1], torch.ones_like(c))
        wid = torch.nan_to_num(wid, nan=1.0, posinf=1.0)
        d = c / torch.where(ok, tot, torch.ones_like(tot))[:, None] / wid
        out = dict(P)
        out["densities"] = _mix(P["densities"], d, ok, step_size)
        return out

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, discrete: bool = False,
            bins: int | str = "auto", alpha: float = 1.0, breaks: Any | None = None,
            tail: float = TAIL_MASS, **_: Any) -> "Histogram":
        """Weighted histogram. ``discrete``: one unit bin per integer from min to max (or pass
        ``breaks``); otherwise numpy's ``bins`` rule on the (unweighted) values. Values outside
        ``breaks`` are left to the tails (``tail``)."""
        v, w = _clean_values(values, weights)
        if breaks is not None:
            br = np.asarray(breaks, dtype=np.float64)
        elif v.size == 0:
            br = np.array([0.0, 1.0])
        elif discrete:
            br = np.arange(np.floor(v.min()), np.floor(v.max()) + 2.0)
        else:
            lo, hi = float(v.min()), float(v.max())
            br = np.histogram_bin_edges(v, bins=bins) if hi > lo else np.array([lo - 0.5, hi + 0.5])
            br[-1] = np.nextafter(br[-1], np.inf)  # half-open bins: keep the maximum inside
        c, _ = np.histogram(v, bins=br, weights=w)
        c = c + alpha
        if c.sum() <= 0:
            c = np.ones_like(c)
        return cls(br, c / c.sum() / np.diff(br), discrete, alpha, tail)

    @classmethod
    def fit_fixed(cls, values: Any, bins: "FixedBins", discrete: bool = False, alpha: float = 1.0,
                  tail: float = TAIL_MASS) -> "Histogram":
        """Unweighted :meth:`fit` on the fixed edges ``bins.edges`` (``breaks=``), without
        re-deriving them: bit-identical parameters, a fraction of the time."""
        return _histogram_fit_fixed(cls, values, bins, discrete, alpha, tail)


# ============================================================================== PiecewiseLinear


class PiecewiseLinear(Leaf):
    """Density linear between knots ``(xs[i], ys[i])`` (MSPN), with exponential tails outside.

    With the knots fixed, linear interpolation is a mixture of normalised "hat" densities: hat
    ``i`` rises from ``xs[i-1]`` to 1 at ``xs[i]`` and falls to ``xs[i+1]``, has area
    ``a_i = (xs[i+1] - xs[i-1]) / 2`` (half of that at the two ends) and weight
    ``pi_i = ys[i] * a_i`` (the trapezoid rule makes ``sum(pi) == 1``). EM therefore updates the
    heights exactly as mixture weights: ``pi_i`` becomes the expected share of the points
    attributed to hat ``i``; its statistic (the per-knot responsibilities) adds up over shards.
    The knots stay where ``fit`` put them, like a histogram's bin edges.

    The body on ``[xs[0], xs[-1]]`` carries mass ``1 - tail``; two exponential tails carry
    ``tail`` (see :func:`_tail_log_density`), so values outside the training range keep a small
    finite, normalised density.

    Args:
        xs: ``(m,)`` strictly increasing knots, ``m >= 2``.
        ys: ``(m,)`` non-negative densities at the knots; trapezoid integral must be 1.
        tail: mass outside ``[xs[0], xs[-1]]``; 0 makes values there impossible.
    """

    type_name = "piecewise_linear"
    param_names = ("xs", "ys", "tail")
    learnable = ("ys",)
    ragged = ("xs", "ys")
    pad = {"xs": math.inf, "ys": 0.0}

    def __init__(self, xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray,
                 tail: float = TAIL_MASS) -> None:
        a = np.asarray(xs, dtype=np.float64).reshape(-1)
        b = np.asarray(ys, dtype=np.float64).reshape(-1)
        if a.size < 2 or a.size != b.size or np.any(~np.isfinite(a)) or np.any(np.diff(a) <= 0):
            raise UserError("PiecewiseLinear: need >= 2 strictly increasing finite xs and as many ys")
        area = float(np.trapezoid(b, a)) if np.all(np.isfinite(b)) else math.nan
        if np.any(b < 0) or not abs(area - 1) <= 1e-6:
            raise UserError(f"PiecewiseLinear: ys must be >= 0 with integral 1 (got {area:.6g})")
        self._p = {"xs": a, "ys": b / area, "tail": np.array(_check_tail(tail, "PiecewiseLinear"))}

    @classmethod
    def _segment(cls, P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Segment index ``j`` ``(batch, n)``, position ``t`` in it (0..1) and an inside mask."""
        xs = P["xs"]
        xc = torch.nan_to_num(x, nan=0.0)
        j = (torch.searchsorted(xs.contiguous(), xc.T.contiguous(), right=True) - 1).T
        last = P["len_xs"] - 1
        # The support is closed: the last knot belongs to the last segment.
        j = torch.where(xc == xs.gather(1, last[:, None])[:, 0][None, :], (last - 1)[None, :], j)
        ok = (j >= 0) & (j < last[None, :]) & ~torch.isnan(x)
        j = torch.where(ok, j, torch.zeros_like(j))
        col = torch.arange(xs.shape[0])[None, :]
        x0, x1 = xs[col, j], xs[col, j + 1]
        t = ((xc - x0) / torch.where(ok, x1 - x0, torch.ones_like(x0))).clamp(0, 1)
        return j, t, ok

    @classmethod
    def _ends(cls, P: Params) -> tuple[torch.Tensor, torch.Tensor]:
        return P["xs"][:, 0], P["xs"].gather(1, (P["len_xs"] - 1)[:, None])[:, 0]

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        ys = P["ys"]
        j, t, ok = cls._segment(P, x)
        col = torch.arange(ys.shape[0])[None, :]
        y = (ys[col, j] + t * (ys[col, j + 1] - ys[col, j])).clamp_min(0)
        body = _safe_log(y) + torch.log1p(-P["tail"])[None, :]
        lo, hi = cls._ends(P)
        xc = torch.nan_to_num(x, nan=0.0)
        lt = _tail_log_density(xc, lo, hi, P["tail"])
        return _finish(torch.where(ok, body, lt), x)

    @classmethod
    def _hat_areas(cls, P: Params) -> torch.Tensor:
        """Area of each knot's hat ``(n, m)`` (1 on padding, which has no mass)."""
        xs, L = P["xs"], P["len_xs"]
        m = xs.shape[1]
        valid = torch.arange(m)[None, :] < L[:, None]
        xv = torch.where(valid, xs, torch.zeros_like(xs))
        idx = torch.arange(m)[None, :].expand_as(xs)
        left = xv.gather(1, (idx - 1).clamp_min(0))
        right = xv.gather(1, torch.minimum(idx + 1, (L - 1)[:, None]))
        a = 0.5 * (right - left)
        return torch.where(valid & (a > 0), a, torch.ones_like(a))

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        ys = P["ys"]
        n, m = ys.shape
        j, t, ok = cls._segment(P, x)
        col = torch.arange(n)[None, :]
        left, right = ys[col, j] * (1 - t), ys[col, j + 1] * t
        y = left + right
        use = ok & (y > 0)
        w = torch.where(use, w, torch.zeros_like(w))
        ys_ = torch.where(use, y, torch.ones_like(y))
        base = (col * m).expand_as(j)
        counts = torch.zeros(n * m, dtype=w.dtype)
        counts.index_add_(0, (base + j).reshape(-1), (w * left / ys_).reshape(-1))
        counts.index_add_(0, (base + j + 1).reshape(-1), (w * right / ys_).reshape(-1))
        return {"counts": counts.view(n, m)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        c = stats["counts"]
        valid = torch.arange(c.shape[1])[None, :] < P["len_ys"][:, None]
        c = torch.where(valid, c, torch.zeros_like(c))
        tot = c.sum(1)
        ok = tot > MIN_FLOW
        pi = c / torch.where(ok, tot, torch.ones_like(tot))[:, None]
        ys = torch.where(valid, pi / cls._hat_areas(P), torch.zeros_like(pi))
        out = dict(P)
        out["ys"] = _mix(P["ys"], ys, ok, step_size)
        return out

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        j = P["ys"].argmax(1, keepdim=True)
        return P["xs"].gather(1, j)[:, 0]

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(len(idx))
        xs_all, ys_all = P["xs"].double().numpy(), P["ys"].double().numpy()
        lens = P["len_xs"].numpy()
        for leaf in np.unique(idx):  # one vectorised inverse-CDF per distinct leaf
            sel = np.nonzero(idx == leaf)[0]
            xs, ys = xs_all[leaf, : lens[leaf]], ys_all[leaf, : lens[leaf]]
            h = np.diff(xs)
            area = 0.5 * (ys[:-1] + ys[1:]) * h
            cdf = np.cumsum(area)
            u = rng.random(len(sel)) * cdf[-1]
            j = np.minimum(np.searchsorted(cdf, u, side="right"), len(h) - 1)
            r = u - np.concatenate([[0.0], cdf])[j]  # area still to cover inside segment j
            y0, s = ys[j], (ys[j + 1] - ys[j]) / h[j]
            # Stable root of y0*t + s*t^2/2 = r (also fine for s = 0 or y0 = 0).
            t = 2 * r / np.maximum(y0 + np.sqrt(np.maximum(y0 * y0 + 2 * s * r, 0.0)), 1e-300)
            out[sel] = xs[j] + np.clip(t, 0.0, h[j])
        lo, hi = (e.double().numpy()[idx] for e in cls._ends(P))
        return _sample_tails(out, lo, hi, P["tail"].double().numpy()[idx], rng)

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, bins: int | str = "auto",
            alpha: float = 1.0, tail: float = TAIL_MASS, **_: Any) -> "PiecewiseLinear":
        """Knots at the (weighted, Laplace-smoothed) histogram's bin centres, with zero-density
        knots half a bin beyond each end; normalised by the trapezoid rule."""
        h = Histogram.fit(values, weights, bins=bins, alpha=alpha)
        br, d = h._p["breaks"], h._p["densities"]
        c = 0.5 * (br[:-1] + br[1:])
        w0, w1 = br[1] - br[0], br[-1] - br[-2]
        xs = np.concatenate([[br[0] - 0.5 * w0], c, [br[-1] + 0.5 * w1]])
        ys = np.concatenate([[0.0], d, [0.0]])
        return cls(xs, ys / np.trapezoid(ys, xs), tail)

    @classmethod
    def fit_fixed(cls, values: Any, bins: "FixedBins", alpha: float = 1.0,
                  tail: float = TAIL_MASS) -> "PiecewiseLinear":
        """Unweighted :meth:`fit` with ``bins=bins.edges``, reusing the knots computed once:
        bit-identical parameters, a fraction of the time."""
        return _piecewise_fit_fixed(cls, values, bins, alpha, tail)


class FixedBins:
    """Histogram edges shared by many fits, with their derived geometry computed once.

    LearnSPN fits thousands of histogram / piecewise-linear leaves of one column on the same
    global edges; each generic ``fit`` re-validates the edges and recomputes widths and knots
    (about 0.5 ms per leaf, a fixed cost per leaf). :meth:`Histogram.fit_fixed` and
    :meth:`PiecewiseLinear.fit_fixed` reuse this geometry and give bit-for-bit the parameters of
    ``Histogram.fit(values, breaks=edges, ...)`` and ``PiecewiseLinear.fit(values, bins=edges,
    ...)`` (same floating-point operations in the same order; tested).

    Args:
        edges: ``(b+1,)`` strictly increasing finite edges, ``b >= 1``.
    """

    def __init__(self, edges: Sequence[float] | np.ndarray) -> None:
        br = np.array(edges, dtype=np.float64).reshape(-1)
        if br.size < 2 or np.any(~np.isfinite(br)) or np.any(np.diff(br) <= 0):
            raise UserError(f"FixedBins: need >= 2 strictly increasing finite edges, got {br}")
        self.edges = br
        self.widths = np.diff(br)
        # PiecewiseLinear.fit passes the edges as ``bins``: Histogram.fit then moves the last edge
        # up by one ulp (half-open bins keep the maximum inside), and knots sit at bin centres.
        pw = br.copy()
        pw[-1] = np.nextafter(pw[-1], np.inf)
        self.pw_edges = pw
        self.pw_widths = np.diff(pw)
        c = 0.5 * (pw[:-1] + pw[1:])
        w0, w1 = pw[1] - pw[0], pw[-1] - pw[-2]
        self.knots = np.concatenate([[pw[0] - 0.5 * w0], c, [pw[-1] + 0.5 * w1]])
        self.knot_steps = np.diff(self.knots)
        self._constant: dict[float, FixedBins] = {}

    @classmethod
    def many(cls, edges: Sequence[np.ndarray]) -> list["FixedBins"]:
        """``[FixedBins(e) for e in edges]``, bit for bit, with the geometry of all edge arrays
        computed by one pass of element-wise operations over their concatenation (the per-array
        cost of a few dozen small numpy calls is what a small LearnSPN fit pays per column).
        Any edge array that ``FixedBins`` would reject goes through the constructor (its error)."""
        arrs = [np.array(e, dtype=np.float64).reshape(-1) for e in edges]
        if not arrs:
            return []
        lens = np.array([a.size for a in arrs], dtype=np.int64)
        flat = np.concatenate(arrs)
        ends = np.cumsum(lens)
        starts = ends - lens
        step = flat[1:] - flat[:-1]  # np.diff, across array boundaries too (those are ignored)
        inside = np.ones(step.size, dtype=bool)
        inside[ends[:-1] - 1] = False
        if lens.min() < 2 or not np.isfinite(flat).all() or np.any(step[inside] <= 0):
            return [cls(a) for a in arrs]
        pw = flat.copy()
        pw[ends - 1] = np.nextafter(pw[ends - 1], np.inf)
        pw_step = pw[1:] - pw[:-1]
        centre = 0.5 * (pw[:-1] + pw[1:])
        first = pw[starts] - 0.5 * pw_step[starts]
        last = pw[ends - 1] + 0.5 * pw_step[ends - 2]
        # Knots of array j: first[j], its centres, last[j]; laid out back to back (j extra slots each).
        knots = np.empty(flat.size + len(arrs))
        at = np.arange(len(arrs))
        knots[starts + at] = first
        knots[ends + at] = last
        knots[np.flatnonzero(inside) + np.repeat(at, lens - 1) + 1] = centre[inside]
        knot_step = knots[1:] - knots[:-1]
        out = []
        for j, a in enumerate(arrs):
            s, e = int(starts[j]), int(ends[j])
            b = cls.__new__(cls)
            b.edges = a
            b.widths = step[s: e - 1].copy()
            b.pw_edges = pw[s: e].copy()
            b.pw_widths = pw_step[s: e - 1].copy()
            b.knots = knots[s + j: e + j + 1].copy()
            b.knot_steps = knot_step[s + j: e + j].copy()
            b._constant = {}
            out.append(b)
        return out

    def constant(self, value: float) -> "FixedBins":
        """The one bin ``[value - 0.5, value + 0.5]`` that the generic piecewise fit uses for a
        slice whose values all equal ``value`` (cached: constant slices repeat a few values)."""
        out = self._constant.get(value)
        if out is None:
            out = self._constant[value] = FixedBins(np.array([value - 0.5, value + 0.5]))
        return out


def _fixed_counts(v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``np.histogram(v, bins=edges)[0]`` as float64 (unit weights; last bin closed), by one
    searchsorted + bincount instead of a sort; exact integer counts either way."""
    nb = edges.size - 1
    idx = np.searchsorted(edges, v, side="right") - 1
    idx[v == edges[-1]] = nb - 1
    if idx.size and (idx.min() < 0 or idx.max() >= nb):
        idx = idx[(idx >= 0) & (idx < nb)]
    return np.bincount(idx, minlength=nb).astype(np.float64)


def _fixed_values(values: Any) -> np.ndarray | None:
    """Values as a float64 1-D array if all are finite (the fast fits' precondition), else None."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0 or not np.isfinite(v).all():
        return None
    return v


def _trapezoid(y: np.ndarray, steps: np.ndarray) -> float:
    """``np.trapezoid(y, x)`` given ``steps = np.diff(x)`` (the same expression, so same bits)."""
    return (steps * (y[1:] + y[:-1]) / 2.0).sum()


def _fixed_densities(v: np.ndarray, edges: np.ndarray, widths: np.ndarray,
                     alpha: float) -> tuple[np.ndarray, float, bool]:
    """Smoothed bin densities of ``v`` on fixed edges, as the generic histogram fit computes them:
    ``(densities, their mass, whether they are valid)`` (finite, non-negative, mass 1 +- 1e-6)."""
    c = _fixed_counts(v, edges) + alpha
    if c.sum() <= 0:
        c = np.ones_like(c)
    d = c / c.sum() / widths
    mass = float((d * widths).sum())
    return d, mass, bool(np.all(np.isfinite(d)) and not np.any(d < 0) and abs(mass - 1) <= 1e-6)


def _histogram_fit_fixed(cls: type, values: Any, bins: FixedBins, discrete: bool = False, alpha: float = 1.0,
                         tail: float = TAIL_MASS) -> Any:
    v = _fixed_values(values)
    if v is None:
        return cls.fit(values, discrete=discrete, alpha=alpha, breaks=bins.edges.copy(), tail=tail)
    d, mass, ok = _fixed_densities(v, bins.edges, bins.widths, alpha)
    if not ok:
        return cls(bins.edges.copy(), d, discrete, alpha, tail)  # raises as the generic fit would
    obj = cls.__new__(cls)
    obj._p = {"breaks": bins.edges.copy(), "densities": d / mass, "discrete": np.array(float(discrete)),
              "alpha": np.array(float(alpha)),
              "tail": np.array(0.0 if discrete else _check_tail(tail, "Histogram"))}
    return obj


def _piecewise_fit_fixed(cls: type, values: Any, bins: FixedBins, alpha: float = 1.0,
                         tail: float = TAIL_MASS) -> Any:
    v = _fixed_values(values)
    if v is None:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    lo, hi = float(v.min()), float(v.max())
    if not hi > lo:  # constant values: the generic fit ignores the edges (one bin around the value)
        try:
            bins = bins.constant(lo)
        except UserError:  # value +- 0.5 not representable: let the generic fit decide
            return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    d, mass, ok = _fixed_densities(v, bins.pw_edges, bins.pw_widths, alpha)
    if not ok:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    ys = np.concatenate([[0.0], d / mass, [0.0]])
    ys = ys / _trapezoid(ys, bins.knot_steps)
    area = float(_trapezoid(ys, bins.knot_steps))
    if np.any(ys < 0) or not abs(area - 1) <= 1e-6:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    obj = cls.__new__(cls)
    obj._p = {"xs": bins.knots.copy(), "ys": ys / area, "tail": np.array(_check_tail(tail, "PiecewiseLinear"))}
    return obj


def piecewise_fit_fixed_columns(block: np.ndarray, bins: Sequence[FixedBins], alpha: float = 1.0,
                                tail: float = TAIL_MASS) -> list[Any]:
    """``[PiecewiseLinear.fit_fixed(block[:, j], bins[j], alpha, tail) for j ...]`` for the
    columns of one slice, bit for bit: the element-wise steps run once over all columns'
    concatenated bins, and only the reductions (each a sum over one column's own contiguous
    values, as in the single fit) run per column. ``None`` marks a column that this path leaves
    to :meth:`PiecewiseLinear.fit_fixed` (a constant column, or any fit that would fall back to
    the generic one).

    Args:
        block: ``(n, m)`` float64 values, ``n >= 1``.
        bins: ``m`` column geometries.
    """
    n, m = block.shape
    out: list[Any] = [None] * m
    if m == 0 or n == 0 or block.dtype != np.float64 or not np.isfinite(block).all():
        return out
    if not 0.0 <= float(tail) < 1.0:
        return out  # the single fit raises the error
    tail_v = float(tail)
    cols = np.ascontiguousarray(block.T)  # row j: column j's values, contiguous as x[rows, v]
    lo, hi = cols.min(1), cols.max(1)
    use = [j for j in range(m) if hi[j] > lo[j]]
    if not use:
        return out
    nb = np.array([bins[j].pw_widths.size for j in use], dtype=np.int64)
    bin_end = np.cumsum(nb)
    bin_start = bin_end - nb
    total = int(bin_end[-1])
    idx = np.empty((len(use), n), dtype=np.int64)
    for r, j in enumerate(use):  # _fixed_counts per column, shifted to the column's bins
        e = bins[j].pw_edges
        k = np.searchsorted(e, cols[j], side="right") - 1
        k[cols[j] == e[-1]] = nb[r] - 1
        k[(k < 0) | (k >= nb[r])] = total - bin_start[r]  # outside the bins: a spare slot, dropped
        idx[r] = k + bin_start[r]
    with np.errstate(all="ignore"):  # a column that would fail is left to the single fit
        return _piecewise_columns_rest(idx, total, nb, bin_start, bin_end, use, bins, out, alpha, tail_v)


def _piecewise_columns_rest(idx: np.ndarray, total: int, nb: np.ndarray, bin_start: np.ndarray,
                            bin_end: np.ndarray, use: list[int], bins: Sequence[FixedBins], out: list[Any],
                            alpha: float, tail_v: float) -> list[Any]:
    """The arithmetic of :func:`piecewise_fit_fixed_columns` once the bin indices are known."""
    c = np.bincount(idx.reshape(-1), minlength=total + 1)[:total].astype(np.float64) + alpha
    widths = np.concatenate([bins[j].pw_widths for j in use])
    add = np.add.reduce  # ndarray.sum() of a 1-D array, without the method's wrapper
    csum = np.array([add(c[bin_start[r]: bin_end[r]]) for r in range(len(use))])
    d = c / np.repeat(csum, nb) / widths
    dw = d * widths
    mass = np.array([float(add(dw[bin_start[r]: bin_end[r]])) for r in range(len(use))])
    bad_d = np.add.reduceat((~np.isfinite(d) | (d < 0)).astype(np.int64), bin_start)
    # ys per column: 0, d / mass, 0 (knot layout: nb + 2 values each), then twice normalised
    nk = nb + 2
    k_end = np.cumsum(nk)
    k_start = k_end - nk
    ys = np.zeros(int(k_end[-1]))
    at = np.repeat(np.arange(len(use)), nb)
    ys[np.arange(total) + 2 * at + 1] = d / np.repeat(mass, nb)
    steps = np.concatenate([bins[j].knot_steps for j in use])
    # each column's knot steps (nk - 1 of them) aligned with its ys; 0 between two columns
    st = np.zeros(ys.size - 1)
    inside = np.ones(ys.size - 1, dtype=bool)
    inside[k_end[:-1] - 1] = False  # between two columns
    st[inside] = steps

    def trapezoids(y: np.ndarray) -> np.ndarray:
        prod = st * (y[1:] + y[:-1]) / 2.0
        return np.array([add(prod[k_start[r]: k_end[r] - 1]) for r in range(len(use))])

    ys = ys / np.repeat(trapezoids(ys), nk)
    area = trapezoids(ys)
    bad_y = np.add.reduceat((ys < 0).astype(np.int64), k_start)
    for r, j in enumerate(use):
        if bad_d[r] or csum[r] <= 0 or not abs(mass[r] - 1) <= 1e-6 or bad_y[r] or not abs(float(area[r]) - 1) <= 1e-6:
            continue  # the single fit decides (it falls back to the generic fit)
        obj = PiecewiseLinear.__new__(PiecewiseLinear)
        obj._p = {"xs": bins[j].knots.copy(), "ys": ys[k_start[r]: k_end[r]] / float(area[r]),
                  "tail": np.array(tail_v)}
        out[j] = obj
    return out


# ============================================================================== DiscretizedGaussian


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
    def batch_mode(cls, P: Params) -> torch.Tensor:
        # Among the equal-width interior bins the one holding the mean has the most mass; the two
        # half-infinite end bins can hold more, so compare those three candidates.
        k = torch.floor(P["mean"] / P["bin_width"]).clamp(torch.zeros_like(P["levels"]), P["levels"] - 1)
        cand = torch.stack([k, torch.zeros_like(k), P["levels"] - 1], 0)  # (3, n)
        best = cls.batch_log_prob(P, cand).argmax(0, keepdim=True)
        return cand.gather(0, best)[0]

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        m = P["mean"].double().numpy()[idx]
        s = np.sqrt(P["var"].double().numpy()[idx])
        z = m + s * rng.standard_normal(len(idx))
        return np.clip(np.floor(z / P["bin_width"].double().numpy()[idx]), 0,
                       P["levels"].double().numpy()[idx] - 1)

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


# ============================================================================== registry / factory

LEAF_TYPES: dict[str, type[Leaf]] = {
    c.type_name: c for c in (Gaussian, Bernoulli, Categorical, Histogram, PiecewiseLinear, DiscretizedGaussian)
}
"""``type_name -> class``; the order of insertion fixes the HDF5 type codes (never reorder)."""


def _meta_name(meta_type: Any) -> str:
    name = getattr(meta_type, "name", None) or getattr(meta_type, "value", None) or meta_type
    return str(name).lower()


def fit_leaf(meta_type: Any, values: Any, weights: Any | None = None, leaf: str | None = None,
             **hp: Any) -> Leaf:
    """Fit the leaf type suited to a column's meta-type.

    Args:
        meta_type: ``"real"`` (default Gaussian; ``leaf="histogram"`` or ``"piecewise_linear"``
            for MSPN), ``"binary"`` (Bernoulli), ``"categorical"`` (Categorical),
            ``"discrete"`` (integer-valued; default Histogram with unit bins, or
            ``leaf="categorical"``), or ``"pixel"`` (DiscretizedGaussian). Enum members are
            accepted by their ``name``/``value``.
        values: ``(n,)`` column values; NaN ignored.
        weights: optional ``(n,)`` non-negative sample weights.
        leaf: override the leaf type by ``type_name``.
        **hp: passed to the chosen class's ``fit`` (e.g. ``min_var``, ``alpha``, ``bins``).

    Raises:
        UserError: unknown meta-type or leaf name.
    """
    mt = _meta_name(meta_type)
    default = {"real": "gaussian", "continuous": "gaussian", "binary": "bernoulli",
               "bernoulli": "bernoulli", "categorical": "categorical", "discrete": "histogram",
               "integer": "histogram", "pixel": "discretized_gaussian"}
    if mt not in default:
        raise UserError(f"fit_leaf: unknown meta_type {meta_type!r} (known: {sorted(default)})")
    name = (leaf or default[mt]).lower()
    name = {"piecewise": "piecewise_linear", "pwl": "piecewise_linear", "normal": "gaussian"}.get(name, name)
    if name not in LEAF_TYPES:
        raise UserError(f"fit_leaf: unknown leaf {name!r} (known: {sorted(LEAF_TYPES)})")
    if name == "histogram" and mt in ("discrete", "integer"):
        hp.setdefault("discrete", True)
    return LEAF_TYPES[name].fit(values, weights, **hp)
