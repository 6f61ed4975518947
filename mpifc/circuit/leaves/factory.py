"""The registry of leaf types (``type_name`` -> class; its order fixes the HDF5 type codes) and :func:`fit_leaf`."""
from __future__ import annotations

from typing import Any

from mpifc.circuit.leaves.base import Leaf
from mpifc.circuit.leaves.gaussian import DiscretizedGaussian, Gaussian
from mpifc.circuit.leaves.discrete import Bernoulli, Categorical
from mpifc.circuit.leaves.binned import Histogram, PiecewiseLinear
from mpifc.errors import UserError


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
