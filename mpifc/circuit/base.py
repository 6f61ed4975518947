"""The contract every client-side density model fulfils.

The federated layer treats a client's PC as opaque: it only calls the methods below. LearnSPN,
RAT-SPN and EiNet circuits all implement :class:`DensityModel`, so any of them can be a leaf of a
federated circuit.

Shape and unit conventions (used everywhere in ``mpifc.circuit``):

* ``x`` is a 2-D array ``(batch, n_vars)`` of float64 (numpy or torch). Column ``j`` holds the
  variable ``scope[j]``. A NaN entry means "missing": that variable is marginalised out for that
  sample only, so any subset can be marginalised in one batch.
* Discrete/categorical values are encoded as integer-valued floats ``0, 1, ..., k-1``.
* Log-likelihoods are natural logs (nats), returned as a float64 torch tensor of shape
  ``(batch,)``. They are log-densities for continuous variables and log-masses for discrete ones.
* Randomness comes only from an explicit ``numpy.random.Generator`` or integer seed argument.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor


@runtime_checkable
class EMStatistics(Protocol):
    """Sufficient statistics of one E-step, addable across data shards.

    ``a + b`` gives exactly the statistics of the union of the two shards, so a sum over ranks
    (one MPI all-reduce of :meth:`to_arrays`) gives exactly centralised EM.
    """

    def __add__(self, other: "EMStatistics") -> "EMStatistics": ...

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat float64 arrays, for transport and all-reduce."""
        ...


@runtime_checkable
class DensityModel(Protocol):
    """A tractable density over ``scope`` (indices of the variables it models)."""

    scope: tuple[int, ...]

    def log_likelihood(self, x: ArrayLike) -> np.ndarray:
        """``log p(x)`` per sample, float64 ``(batch,)``, nats; NaN entries are marginalised."""
        ...

    def mpe(self, x: ArrayLike) -> np.ndarray:
        """Most probable completion: NaN entries filled by the max-product pass, shape of ``x``."""
        ...

    def sample(self, n: int, rng: np.random.Generator, evidence: ArrayLike | None = None) -> np.ndarray:
        """``n`` samples ``(n, n_vars)``; with ``evidence`` (``(n, n_vars)``, NaN = free) the
        non-NaN entries are kept and the rest sampled from the conditional."""
        ...

    def em_statistics(self, x: ArrayLike, sample_weight: ArrayLike | None = None) -> EMStatistics:
        """E-step statistics on ``x``; ``sample_weight`` (``(batch,)``, >= 0) scales each sample's
        contribution (the per-sample flows a federated parent sends down)."""
        ...

    def apply_em(self, stats: EMStatistics, step_size: float = 1.0) -> None:
        """M-step: move parameters to ``(1 - step_size) * old + step_size * new``."""
        ...

    def num_parameters(self) -> int: ...

    def save(self, group: Any) -> None:
        """Write structure and parameters into an open ``h5py.Group`` (no pickle)."""
        ...
