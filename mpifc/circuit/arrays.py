"""Small array helpers for a training rank's hot path.

:func:`distinct_ints` is ``np.unique`` for integer (or raw-bits) arrays without its first-call
cost: for a plain call NumPy's ``unique`` asks ``np.ma.is_masked``, which imports ``numpy.ma``
(some 20 ms of CPU per process), a cost every one of a job's ranks pays once.
"""
from __future__ import annotations

import numpy as np


def distinct_ints(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of the integer (or unsigned raw-bits) array ``values``,
    flattened: what ``np.unique(values)`` returns. Not for floats (NaN is never equal to itself)."""
    a = np.sort(np.asarray(values).reshape(-1))
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]
