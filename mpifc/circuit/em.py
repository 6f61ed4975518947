"""EM drivers for any model with ``em_statistics`` / ``apply_em`` (SPN, RatSPN).

The E-step statistics are explicit addable objects (:class:`~mpifc.circuit.compiled.CircuitStats`,
:class:`~mpifc.circuit.ratspn.RatStats`): summing the statistics of shards gives exactly the
statistics of the union, which is what makes distributed EM exact (one all-reduce of
``to_arrays()``). These drivers are the single-process loops.

Parameters updated by EM: sum weights, and Gaussian (mean, var), Bernoulli p, Categorical probs,
Histogram densities (bins fixed), PiecewiseLinear knot heights (knots fixed; exact EM as
mixture weights of hat densities) and DiscretizedGaussian (mean, var; censored-data EM).
"""
from __future__ import annotations

from functools import reduce
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from mpifc.errors import UserError


def sum_statistics(stats: Iterable[Any]) -> Any:
    """Sum of E-step statistics (e.g. one per data shard)."""
    items = list(stats)
    if not items:
        raise UserError("sum_statistics: no statistics given")
    return reduce(lambda a, b: a + b, items)


def shard_statistics(model: Any, x: np.ndarray, n_shards: int, sample_weight: np.ndarray | None = None) -> Any:
    """E-step over ``n_shards`` contiguous row blocks, summed (bounds memory; equals one pass)."""
    blocks = np.array_split(np.arange(len(x)), max(1, n_shards))
    return sum_statistics(
        model.em_statistics(x[b], None if sample_weight is None else sample_weight[b]) for b in blocks if len(b)
    )


def batch_em(model: Any, x: np.ndarray, n_iter: int = 10, sample_weight: np.ndarray | None = None,
             tol: float = 0.0, chunk: int = 10_000) -> list[float]:
    """Full-batch EM.

    Args:
        model: SPN or RatSPN.
        x: ``(n, n_vars)`` training data, NaN = missing.
        n_iter: maximum number of EM iterations.
        sample_weight: optional ``(n,)`` non-negative weights.
        tol: stop when the mean log-likelihood improves by less than ``tol`` nats.
        chunk: rows per E-step block (memory bound only; results are identical).

    Returns:
        Mean training log-likelihood (nats per unit weight) *before* each M-step; a final entry
        is the value after the last step. Non-decreasing (EM's monotonicity).
    """
    x = np.asarray(x, dtype=np.float64)
    hist: list[float] = []
    n_shards = max(1, -(-len(x) // chunk))
    for _ in range(n_iter):
        st = shard_statistics(model, x, n_shards, sample_weight)
        hist.append(st.log_likelihood / max(st.n, 1e-300))
        if len(hist) > 1 and hist[-1] - hist[-2] < tol:
            return hist
        model.apply_em(st)
    st = shard_statistics(model, x, n_shards, sample_weight)
    hist.append(st.log_likelihood / max(st.n, 1e-300))
    return hist


def robbins_monro(t0: float = 2.0, kappa: float = 0.6) -> Callable[[int], float]:
    """Step-size schedule ``(t + t0) ** -kappa`` (``0.5 < kappa <= 1`` for convergence)."""
    return lambda t: float((t + t0) ** -kappa)


def online_em(model: Any, x: np.ndarray, batch_size: int = 256, n_epochs: int = 1,
              step_size: float | Callable[[int], float] = 0.1, rng: np.random.Generator | int = 0,
              sample_weight: np.ndarray | None = None) -> list[float]:
    """Stochastic (mini-batch) EM: per batch, ``params = (1 - eta) * old + eta * M(batch stats)``.

    Args:
        step_size: constant ``eta`` in ``(0, 1]`` or a schedule ``t -> eta`` (see
            :func:`robbins_monro`), ``t`` counting batches from 0.
        rng: shuffles the rows each epoch.

    Returns:
        Mean log-likelihood of each mini-batch before its update (nats).
    """
    if batch_size < 1:
        raise UserError(f"online_em: batch_size must be >= 1, got {batch_size}")
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(rng)
    sched = step_size if callable(step_size) else (lambda t: float(step_size))
    hist: list[float] = []
    t = 0
    for _ in range(n_epochs):
        perm = rng.permutation(len(x))
        for i in range(0, len(x), batch_size):
            b = perm[i:i + batch_size]
            st = model.em_statistics(x[b], None if sample_weight is None else sample_weight[b])
            hist.append(st.log_likelihood / max(st.n, 1e-300))
            model.apply_em(st, step_size=min(1.0, sched(t)))
            t += 1
    return hist


def train_test_ll(model: Any, splits: Sequence[np.ndarray]) -> list[float]:
    """Mean log-likelihood (nats) of ``model`` on each array in ``splits``."""
    return [float(model.log_likelihood(s).mean()) for s in splits]
