"""A fully factorised density model: the smallest real :class:`DensityModel`.

Each column is independent: a categorical (Laplace-smoothed) for discrete meta-types, a Gaussian
(variance floored) for real ones. It is the ``factorized`` learner, and the test workhorse: with
K clusters per client it already makes a FedPC a proper mixture of products.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from mpifc.circuit.io import register_model
from mpifc.errors import UserError

if TYPE_CHECKING:
    import torch

# torch is imported on first use only (it takes seconds): a rank that fits, ships and evaluates
# factorised leaves with numpy never needs it.

REAL_TYPES = ("real", "continuous", "gaussian")
MIN_VAR = 1e-4


def is_real(meta_type: str) -> bool:
    return str(meta_type).lower() in REAL_TYPES


@dataclass
class FactorizedStats:
    """Weighted sufficient statistics: per column weight, sum, sum of squares, category counts.

    Shapes: ``weight, s1, s2`` are ``(d,)``; ``counts`` is ``(d, max_k)``.
    """

    weight: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    counts: np.ndarray

    def __add__(self, other: "FactorizedStats") -> "FactorizedStats":
        return FactorizedStats(self.weight + other.weight, self.s1 + other.s1, self.s2 + other.s2,
                               self.counts + other.counts)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight, "s1": self.s1, "s2": self.s2, "counts": self.counts}


class FactorizedModel:
    """``p(x) = Π_j p_j(x_j)`` over ``len(meta_types)`` columns.

    Args:
        meta_types: per column, "real" (Gaussian) or a discrete type (categorical).
        n_categories: per column number of categories (ignored for real columns).
        scope: variable indices (default ``0..d-1``).
    """

    def __init__(self, meta_types: Sequence[str], n_categories: Sequence[int],
                 scope: Sequence[int] | None = None, alpha: float = 1.0) -> None:
        self.meta_types = [str(m) for m in meta_types]
        d = len(self.meta_types)
        self.real = np.array([is_real(m) for m in self.meta_types], dtype=bool)
        self.n_categories = np.array([0 if r else max(int(k), 1) for r, k in zip(self.real, n_categories)],
                                     dtype=np.int64)
        self.scope = tuple(range(d)) if scope is None else tuple(int(s) for s in scope)
        self.alpha = float(alpha)
        self.mean = np.zeros(d)
        self.var = np.ones(d)
        kmax = int(self.n_categories.max()) if d and self.n_categories.max() > 0 else 1
        self.log_probs = np.full((d, kmax), -np.inf)
        for j in range(d):
            if not self.real[j]:
                self.log_probs[j, : self.n_categories[j]] = -np.log(self.n_categories[j])

    # -- fitting -------------------------------------------------------------------------------
    @classmethod
    def fit(cls, x: np.ndarray, meta_types: Sequence[str], n_categories: Sequence[int] | None = None,
            alpha: float = 1.0) -> "FactorizedModel":
        """Maximum-likelihood (Laplace-smoothed) fit on ``x`` ``(n, d)``."""
        x = np.asarray(x, dtype=np.float64)
        d = x.shape[1]
        ks = list(n_categories) if n_categories is not None else [0] * d
        for j in range(d):
            if not is_real(meta_types[j]):
                col = x[:, j][~np.isnan(x[:, j])]
                seen = int(col.max()) + 1 if len(col) else 1
                ks[j] = max(int(ks[j] or 0), seen)
        m = cls(meta_types, ks, alpha=alpha)
        m.apply_em(m.em_statistics(x), step_size=1.0)
        return m

    def em_statistics(self, x: Any, sample_weight: Any = None) -> FactorizedStats:
        x = _np(x)
        n, d = x.shape
        w = np.ones(n) if sample_weight is None else _np(sample_weight).reshape(-1)
        obs = ~np.isnan(x)
        xz = np.where(obs, x, 0.0)
        ww = w[:, None] * obs
        counts = np.zeros_like(self.log_probs)
        for j in np.flatnonzero(~self.real):
            counts[j, : self.n_categories[j]] = np.bincount(
                xz[:, j].astype(np.int64), weights=ww[:, j], minlength=self.n_categories[j])[: self.n_categories[j]]
        return FactorizedStats(ww.sum(0), (ww * xz).sum(0), (ww * xz * xz).sum(0), counts)

    def apply_em(self, stats: FactorizedStats, step_size: float = 1.0) -> None:
        wt = np.maximum(stats.weight, 1e-12)
        mean = stats.s1 / wt
        var = np.maximum(stats.s2 / wt - mean ** 2, MIN_VAR)
        new_mean = np.where(self.real & (stats.weight > 0), mean, self.mean)
        new_var = np.where(self.real & (stats.weight > 0), var, self.var)
        new_lp = self.log_probs.copy()
        for j in np.flatnonzero(~self.real):
            k = self.n_categories[j]
            c = stats.counts[j, :k] + self.alpha
            new_lp[j, :k] = np.log(c / c.sum())
        a = float(step_size)
        self.mean = (1 - a) * self.mean + a * new_mean
        self.var = (1 - a) * self.var + a * new_var
        if a >= 1.0:
            self.log_probs = new_lp
        else:
            with np.errstate(divide="ignore"):
                self.log_probs = np.log((1 - a) * np.exp(self.log_probs) + a * np.exp(new_lp))

    # -- queries -------------------------------------------------------------------------------
    def _column_ll(self, x: np.ndarray) -> np.ndarray:
        obs = ~np.isnan(x)
        xz = np.where(obs, x, 0.0)
        ll = np.zeros_like(xz)
        r = self.real
        if r.any():
            z = (xz[:, r] - self.mean[r]) ** 2 / self.var[r]
            ll[:, r] = -0.5 * (z + np.log(2 * np.pi * self.var[r]))
        for j in np.flatnonzero(~r):
            k = self.n_categories[j]
            v = xz[:, j].astype(np.int64)
            bad = (v < 0) | (v >= k) | (xz[:, j] != v)
            ll[:, j] = np.where(bad, -np.inf, self.log_probs[j, np.clip(v, 0, k - 1)])
        return np.where(obs, ll, 0.0)

    def log_likelihood(self, x: Any) -> np.ndarray:
        """``log p(x)`` float64 ``(n,)`` nats; NaN entries marginalised."""
        return self.log_likelihood_numpy(x)

    def log_likelihood_numpy(self, x: Any) -> np.ndarray:
        """:meth:`log_likelihood` as a float64 ``(n,)`` numpy array, without importing torch."""
        return self._column_ll(_np(x)).sum(axis=1)

    def mpe(self, x: Any) -> np.ndarray:
        x = _np(x).copy()
        best = np.where(self.real, self.mean, np.argmax(self.log_probs, axis=1).astype(np.float64))
        miss = np.isnan(x)
        x[miss] = np.broadcast_to(best, x.shape)[miss]
        return x

    def sample(self, n: int, rng: np.random.Generator, evidence: Any = None) -> np.ndarray:
        d = len(self.meta_types)
        out = np.empty((n, d))
        for j in range(d):
            if self.real[j]:
                out[:, j] = rng.normal(self.mean[j], np.sqrt(self.var[j]), size=n)
            else:
                k = self.n_categories[j]
                out[:, j] = rng.choice(k, size=n, p=np.exp(self.log_probs[j, :k]))
        if evidence is not None:
            ev = _np(evidence)
            out = np.where(np.isnan(ev), out, ev)
        return out

    def num_parameters(self) -> int:
        return int(2 * self.real.sum() + self.n_categories[~self.real].sum())

    # -- persistence ---------------------------------------------------------------------------
    def save(self, group: Any) -> None:
        group.attrs["model_type"] = "factorized"
        group.attrs["meta_types"] = ",".join(self.meta_types)
        group.attrs["alpha"] = self.alpha
        group.create_dataset("scope", data=np.asarray(self.scope, dtype=np.int64))
        group.create_dataset("n_categories", data=self.n_categories)
        group.create_dataset("mean", data=self.mean)
        group.create_dataset("var", data=self.var)
        group.create_dataset("log_probs", data=self.log_probs)

    @classmethod
    def load(cls, group: Any) -> "FactorizedModel":
        mt = group.attrs["meta_types"]
        mt = mt.decode() if isinstance(mt, bytes) else str(mt)
        m = cls(mt.split(",") if mt else [], group["n_categories"][()], scope=group["scope"][()],
                alpha=float(group.attrs["alpha"]))
        m.mean = group["mean"][()]
        m.var = group["var"][()]
        m.log_probs = group["log_probs"][()]
        problem = m.parameter_problem()
        if problem is not None:
            raise UserError(f"{group.file.filename}:{group.name}: {problem}")
        return m

    def parameter_problem(self) -> str | None:
        """What is wrong with the parameters (shapes, finite means, variances > 0, each discrete
        column's log-probabilities finite and summing to 1), or None."""
        d = len(self.meta_types)
        if len(self.scope) != d or self.n_categories.shape != (d,):
            return f"'scope' or 'n_categories' do not match the {d} columns"
        if np.shape(self.mean) != (d,) or np.shape(self.var) != (d,) or np.ndim(self.log_probs) != 2 \
                or len(self.log_probs) != d or (d and np.shape(self.log_probs)[1] < int(self.n_categories.max())):
            return f"'mean', 'var' or 'log_probs' do not match the {d} columns"
        for j in range(d):
            if self.real[j]:
                if not np.isfinite(self.mean[j]):
                    return f"'mean'[{j}] = {float(self.mean[j])!r}: a mean must be finite"
                if not (np.isfinite(self.var[j]) and self.var[j] > 0):
                    return f"'var'[{j}] = {float(self.var[j])!r}: a variance must be finite and > 0"
                continue
            lp = np.asarray(self.log_probs[j, : self.n_categories[j]], dtype=np.float64)
            if not np.all(np.isfinite(lp)):
                return f"'log_probs'[{j}] holds a log-probability that is not finite"
            total = float(np.exp(lp).sum())
            if abs(total - 1.0) > 1e-6:
                return f"'log_probs'[{j}]: the probabilities sum to {total!r}, not 1"
        return None


def _np(x: Any) -> np.ndarray:
    torch = sys.modules.get("torch")  # not imported yet: x cannot be a tensor
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(1, -1) if x.ndim == 1 else x


register_model("factorized", FactorizedModel.load)
