"""Discrete leaves: :class:`Bernoulli` and :class:`Categorical` (Laplace-smoothed)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mpifc.circuit.lazy import torch  # imported on first use: numpy paths never need it

from mpifc.circuit.leaves.base import (LOG_ZERO, MIN_FLOW, Leaf, Params, _clean_values, _finish, _flow, _mix,
                                       _np_finish, _np_safe_log, _safe_log, bad_value, unit_problem)
from mpifc.errors import UserError


def _alpha_problem(p: dict[str, np.ndarray]) -> str | None:
    return bad_value(p, "alpha", np.isfinite(p["alpha"]) & (p["alpha"] >= 0), "a pseudo-count must be finite and >= 0")


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
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        return (bad_value(p, "p", (p["p"] >= 0) & (p["p"] <= 1), "a probability must be in [0, 1]")
                or _alpha_problem(p))

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        # Logs on the (n,) parameters, not on the (batch, n) data: one pass over the batch.
        lp1, lp0 = _safe_log(P["p"])[None, :], _safe_log(1 - P["p"])[None, :]
        lp = torch.where(x == 1, lp1, torch.where(x == 0, lp0, LOG_ZERO))
        return torch.where(torch.isnan(x), 0.0, lp)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        lp1, lp0 = _np_safe_log(P["p"])[None, :], _np_safe_log(1 - P["p"])[None, :]
        lp = np.where(x == 1, lp1, np.where(x == 0, lp0, LOG_ZERO))
        return np.where(np.isnan(x), 0.0, lp)

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        return np.zeros(P["p"].shape[0])  # a probability

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return (P["p"] > 0.5).to(P["p"].dtype)

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (rng.random(len(idx)) < P["p"].double().cpu().numpy()[idx]).astype(np.float64)

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
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        probs = p["probs"]
        return (bad_value(p, "probs", np.isfinite(probs) & (probs >= 0), "a probability must be finite and >= 0")
                or unit_problem("probs", float(probs.sum()), tol) or _alpha_problem(p))

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        logp = _safe_log(P["probs"])  # (n, K)
        K = logp.shape[1]
        ok = (x >= 0) & (x < K) & (x == torch.floor(x))
        idx = torch.where(ok, x, torch.zeros_like(x)).long()
        lp = logp[torch.arange(logp.shape[0], device=logp.device)[None, :], idx]
        return _finish(torch.where(ok, lp, torch.full_like(lp, LOG_ZERO)), x)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        logp = _np_safe_log(P["probs"])  # (n, K)
        K = logp.shape[1]
        ok = (x >= 0) & (x < K) & (x == np.floor(x))
        idx = np.where(ok, x, 0.0).astype(np.int64)
        lp = logp[np.arange(logp.shape[0])[None, :], idx]
        return _np_finish(np.where(ok, lp, LOG_ZERO), x)

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        return np.zeros(P["probs"].shape[0])  # a probability

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return P["probs"].argmax(1).to(P["probs"].dtype)

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cdf = np.cumsum(P["probs"].double().cpu().numpy()[idx], axis=1)
        u = rng.random(len(idx)) * cdf[:, -1]
        return np.minimum((cdf <= u[:, None]).sum(1), P["len_probs"].cpu().numpy()[idx] - 1).astype(np.float64)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        n, K = P["probs"].shape
        ok = (x >= 0) & (x < K) & (x == torch.floor(x))
        w = torch.where(ok, w, torch.zeros_like(w))
        idx = torch.where(ok, x, torch.zeros_like(x)).long() + K * torch.arange(n, device=x.device)[None, :]
        counts = torch.zeros(n * K, dtype=w.dtype, device=w.device).index_add_(0, idx.reshape(-1), w.reshape(-1))
        return {"counts": counts.view(n, K)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        n, K = P["probs"].shape
        valid = torch.arange(K, device=P["len_probs"].device)[None, :] < P["len_probs"][:, None]
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
