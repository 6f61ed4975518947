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

Modules: :mod:`~mpifc.circuit.leaves.base` (the interface), :mod:`~mpifc.circuit.leaves.gaussian`,
:mod:`~mpifc.circuit.leaves.discrete`, :mod:`~mpifc.circuit.leaves.binned` and
:mod:`~mpifc.circuit.leaves.factory` (the registry and :func:`fit_leaf`).
"""
from mpifc.circuit.leaves.base import LOG_ZERO, MIN_FLOW, Leaf, Params
from mpifc.circuit.leaves.binned import TAIL_MASS, FixedBins, Histogram, PiecewiseLinear, piecewise_fit_fixed_columns
from mpifc.circuit.leaves.discrete import Bernoulli, Categorical
from mpifc.circuit.leaves.factory import LEAF_TYPES, fit_leaf
from mpifc.circuit.leaves.gaussian import DiscretizedGaussian, Gaussian, tie_variance_floors

__all__ = ["LEAF_TYPES", "LOG_ZERO", "MIN_FLOW", "TAIL_MASS", "Bernoulli", "Categorical", "DiscretizedGaussian",
           "FixedBins", "Gaussian", "Histogram", "Leaf", "Params", "PiecewiseLinear", "fit_leaf",
           "piecewise_fit_fixed_columns", "tie_variance_floors"]
