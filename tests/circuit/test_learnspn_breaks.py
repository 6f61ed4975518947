"""Global histogram edges of LearnSPN's histogram/piecewise leaves (``_global_breaks``)."""
from __future__ import annotations

import numpy as np

from mpifc.circuit.learnspn import _global_breaks


def test_many_distinct_values_keep_bounded_bins() -> None:
    col = np.random.default_rng(0).standard_normal(20000)
    br = _global_breaks(col, "real", 0)
    assert np.all(np.diff(br) > 0)
    assert len(br) <= 64 + 1 + 2
    assert br[1] == col.min() and br[-2] > col.max()
    assert br[0] < col.min() and br[-1] > br[-2]


def test_integer_codes_keep_unit_bins() -> None:
    assert np.array_equal(_global_breaks(np.array([0.0, 2.0, 1.0]), "categorical", 3),
                          np.arange(0.0, 4.0))
