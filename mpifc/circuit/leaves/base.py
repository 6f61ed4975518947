"""The :class:`Leaf` base class, the batched interface every leaf family implements, and shared helpers."""
from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import numpy as np

from mpifc.circuit.lazy import torch  # imported on first use: numpy paths never need it

from mpifc.errors import UserError


LOG_ZERO = -1e30
"""Log-probability used for impossible values (nats); ``exp`` underflows to exactly 0."""

MIN_FLOW = 1e-12
"""A leaf or sum node whose total expected count is below this keeps its old parameters in EM."""

Params = dict[str, Any]
"""Stacked leaf parameters: ``torch.Tensor`` values (:meth:`Leaf.stack`), or numpy arrays
(:meth:`Leaf.stack_numpy`, the numpy evaluator's)."""

_LOG_2PI = math.log(2.0 * math.pi)

_BIG = 1e150
"""Deviations from the mean are clamped to +-_BIG in EM statistics (squares stay finite)."""


def _as_tensor(x: Any, dtype: Any = None) -> torch.Tensor:
    if dtype is None:
        dtype = torch.float64
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device="cpu")


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

    @classmethod
    def param_problem(cls, params: dict[str, np.ndarray], tol: float = 1e-6) -> str | None:
        """What is wrong with one leaf's parameters (as :meth:`params` gives them), naming the
        parameter and its value; None when they describe a valid distribution. Run on every leaf
        a model file or a message brings in (:meth:`from_params` itself never checks).

        ``tol``: how far a sum or an integral that must be 1 may be off (rounding).
        """
        for k in cls.param_names:
            if k not in params:
                return f"parameter {k!r} missing"
            a = np.asarray(params[k])
            if k in cls.ragged:
                if a.ndim != 1 or a.size == 0:
                    return f"{k!r} must be a non-empty list of numbers, got shape {a.shape}"
            elif a.size != 1:
                return f"{k!r} must be one number, got {a.size}"
            if a.dtype.kind not in "biuf":
                return f"{k!r} must be numeric, got {a.dtype}"
        return cls._value_problem({k: np.asarray(params[k], dtype=np.float64) for k in cls.param_names}, tol)

    @classmethod
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        """:meth:`param_problem` for the values (shapes and dtypes already checked)."""
        return None

    def num_parameters(self) -> int:
        """Number of learnable scalars."""
        return int(sum(self._p[k].size for k in self.learnable))

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={np.array2string(self._p[k], precision=4)}" for k in self.learnable)
        return f"{type(self).__name__}({parts})"

    @classmethod
    def stack(cls, leaves: Sequence["Leaf"], dtype: Any = None) -> Params:
        """Stack ``n`` leaves of this type into batched parameters.

        Scalars become ``(n,)``; ragged vectors become ``(n, max_len)`` padded with ``cls.pad``,
        and their lengths are stored under ``"len_<name>"`` as int64 ``(n,)``.
        """
        if dtype is None:
            dtype = torch.float64
        return {k: torch.as_tensor(v, dtype=torch.int64 if k.startswith("len_") else dtype, device="cpu")
                for k, v in cls.stack_numpy(leaves).items()}

    @classmethod
    def stack_numpy(cls, leaves: Sequence["Leaf"]) -> Params:
        """:meth:`stack` as numpy arrays (float64; ``len_*`` int64), for :meth:`np_log_prob`."""
        P: Params = {}
        for k in cls.param_names:
            arrs = [lf._p[k] for lf in leaves]
            if k in cls.ragged:
                m = max(a.size for a in arrs)
                buf = np.full((len(arrs), m), cls.pad.get(k, 0.0))
                for i, a in enumerate(arrs):
                    buf[i, : a.size] = a
                P[k] = buf
                P["len_" + k] = np.array([a.size for a in arrs], dtype=np.int64)
            else:
                P[k] = np.array([float(a) for a in arrs], dtype=np.float64)
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
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        """:meth:`batch_log_prob` in numpy, on :meth:`stack_numpy` parameters and float64 ``x``
        ``(batch, n)``: the same operations, so the same values up to rounding (no torch)."""
        raise NotImplementedError

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        """An upper bound of :meth:`np_log_prob` over every value, at least 0 (a missing value
        gives 0), per leaf ``(n,)`` nats, on :meth:`stack_numpy` parameters; ``inf`` when the
        type knows none."""
        n = next(iter(P.values())).shape[0]
        return np.full(n, np.inf)

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
        st = {k: torch.as_tensor(np.asarray(v, dtype=np.float64), device="cpu")[None] for k, v in stats.items()}
        newP = type(self).batch_m_step(self._P(), st, step_size)
        self._p = type(self).unstack(newP)[0]._p

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, **hp: Any) -> "Leaf":
        """Weighted maximum-likelihood (with smoothing/floors) from ``values`` ``(n,)``; NaN ignored."""
        raise NotImplementedError


def bad_value(p: dict[str, np.ndarray], name: str, ok: Any, rule: str) -> str | None:
    """``"'name' = value: rule"`` for the first value of ``p[name]`` where ``ok`` is False (None
    if every one is fine); ``ok`` is a boolean array over ``p[name]`` (NaN compares False)."""
    ok = np.asarray(ok, dtype=bool).reshape(-1)
    if ok.all():
        return None
    vals = np.asarray(p[name], dtype=np.float64).reshape(-1)
    i = int(np.argmin(ok))
    where = f"[{i}]" if vals.size > 1 else ""
    return f"{name!r}{where} = {float(vals[i])!r}: {rule}"


def unit_problem(name: str, total: float, tol: float, what: str = "sum") -> str | None:
    """``"'name' sum to X, not 1"`` unless ``total`` is 1 within ``tol``."""
    if abs(total - 1.0) <= tol:
        return None
    return f"{name!r} {what} to {total!r}, not 1"


def weights_problem(w: np.ndarray, tol: float) -> str | None:
    """What keeps the weights ``w`` of one sum node from being a distribution (naming the first
    bad weight), or None: each finite and >= 0, all summing to 1 within ``tol``."""
    bad = ~(np.isfinite(w) & (w >= 0))
    if bad.any():
        j = int(np.argmax(bad))
        return f"weight {j} = {float(w[j])!r} (weights must be finite and >= 0)"
    if abs(float(w.sum()) - 1.0) > tol:
        return f"the weights sum to {float(w.sum())!r}, not 1"
    return None


def grouped_weights_problem(name: str, w: np.ndarray, axes: tuple[int, ...], tol: float) -> str | None:
    """:func:`weights_problem` for an array of weight groups (RAT-SPN and EiNet layers): every
    weight finite and >= 0, each group along ``axes`` summing to 1 within ``tol``."""
    if not (np.all(np.isfinite(w)) and np.all(w >= 0)):
        return f"{name!r} holds a weight that is negative or not finite"
    sums = np.ravel(w.sum(axis=axes))
    worst = int(np.argmax(np.abs(sums - 1.0))) if sums.size else 0
    if sums.size and abs(float(sums[worst]) - 1.0) > tol:
        return f"{name!r} are not normalised (a group sums to {float(sums[worst])!r})"
    return None


def _np_safe_log(p: np.ndarray) -> np.ndarray:
    """:func:`_safe_log` in numpy."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(np.log(p), LOG_ZERO)


def _np_finish(lp: np.ndarray, x: np.ndarray) -> np.ndarray:
    """:func:`_finish` in numpy."""
    lp = np.maximum(np.nan_to_num(lp, nan=LOG_ZERO, neginf=LOG_ZERO), LOG_ZERO)
    return np.where(np.isnan(x), 0.0, lp)


def _np_row_searchsorted(sorted_rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per leaf ``i``, ``searchsorted(sorted_rows[i], x[:, i], side="right")``, ``(batch, n)``
    int64: the number of entries of row ``i`` at or below each value (rows ascending, padded
    with ``inf``), as ``torch.searchsorted(..., right=True)`` counts them."""
    out = np.zeros(x.shape, dtype=np.int64)
    for k in range(sorted_rows.shape[1]):  # a few bins or knots: one comparison per column
        out += sorted_rows[None, :, k] <= x
    return out


def _flow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Responsibilities with NaN (marginalised) entries zeroed: they carry no information."""
    return torch.where(torch.isnan(x), torch.zeros_like(w), w)


def _mix(old: torch.Tensor, new: torch.Tensor, ok: torch.Tensor, step: float) -> torch.Tensor:
    """``(1-step)*old + step*new`` where ``ok``, else ``old`` (guards empty leaves)."""
    while ok.dim() < new.dim():
        ok = ok[..., None]
    upd = old + step * (new - old) if step != 1.0 else new
    return torch.where(ok, upd, old)
