"""The RDC's copula inputs, built without per-call overheads, are the same numbers as before.

* ``rdc.ecdf(..., "ordinal")`` ranks with numpy (stable argsort) instead of
  ``scipy.stats.rankdata``: the same int64 ranks, so the same ECDF bits; NaN goes to SciPy.
* ``rdc._projection_inputs`` writes the ``(d, n, width)`` projection layout directly; it must hold
  exactly ``rdc._copula_inputs``'s columns, zero-padded.

(The whole ``rdc_matrix`` against the plain formula: ``test_fixed_cost_fast_paths.py``.)
"""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from mpifc.circuit import rdc


def _table(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)) * rng.choice([1e-3, 1.0, 1e3])
    for j in range(d):
        r = rng.random()
        if r < 0.3:
            x[:, j] = np.round(x[:, j])  # ties
        elif r < 0.4:
            x[:, j] = 2.0  # constant
        elif r < 0.5:
            x[:, j] = rng.integers(0, 2, n)  # binary
    return x


def test_ordinal_ecdf_equals_scipy_rankdata_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    for t in range(200):
        n, d = int(rng.integers(1, 700)), int(rng.integers(1, 12))
        x = _table(rng, n, d)
        if t % 7 == 0:
            x = np.round(x).astype(np.int64)
        elif t % 5 == 0:
            x[rng.integers(0, n), 0] = np.inf if t % 2 else -np.inf  # infinities are ordinary values
        if t % 11 == 0:
            x = np.asfortranarray(x)
        want = rankdata(x, method="ordinal", axis=0) / float(n)
        got = rdc.ecdf(x, "ordinal")
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes(order="C") == np.ascontiguousarray(want).tobytes(), t
    # NaN: SciPy's behaviour (the whole column propagates NaN), via SciPy itself.
    x = _table(rng, 30, 3)
    x[4, 1] = np.nan
    got = rdc.ecdf(x, "ordinal")
    assert np.isnan(got[:, 1]).all() and not np.isnan(got[:, [0, 2]]).any()


def test_ordinal_ecdf_of_two_valued_tables_equals_scipy_rankdata() -> None:
    """Tables whose every column holds at most two values take running counts instead of a
    sort: the same ranks as SciPy's, whatever the two values, the dtype or the layout."""
    rng = np.random.default_rng(9)
    for t in range(120):
        n, d = int(rng.integers(1, 500)), int(rng.integers(1, 9))
        lo, hi = sorted(rng.choice([-np.inf, -3.5, 0.0, 1.0, 2.0, np.inf], size=2, replace=False))
        x = np.where(rng.random((n, d)) < rng.random(d), hi, lo)
        if t % 4 == 0:
            x[:, 0] = lo  # constant column
        if t % 5 == 0:
            x = (x == hi).astype(np.int64) if t % 2 else x == hi
        if t % 3 == 0:
            x = np.asfortranarray(x)
        want = rankdata(x, method="ordinal", axis=0) / float(n)
        got = rdc.ecdf(x, "ordinal")
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes(order="C") == np.ascontiguousarray(want).tobytes(), t


def test_projection_inputs_hold_the_copula_inputs_zero_padded() -> None:
    rng = np.random.default_rng(8)
    for t in range(60):
        n, d = int(rng.integers(2, 300)), int(rng.integers(1, 9))
        x = _table(rng, n, d)
        categorical = [bool(rng.random() < 0.3) for _ in range(d)] if t % 2 else [False] * d
        cards = [int(rng.integers(1, 6)) for _ in range(d)]
        for j in range(d):
            if categorical[j]:
                x[:, j] = rng.integers(0, max(cards[j], 1), n)
        ties = ("max", "ordinal")[t % 2]
        inputs = rdc._copula_inputs(x, categorical, cards, ties)
        with rdc.reuse_work_arrays():
            rdc._work("xt", (d, n, 9)).fill(np.nan)  # a dirty reused buffer must not leak through
            xt, widths = rdc._projection_inputs(x, categorical, cards, ties)
            assert widths == [u.shape[1] for u in inputs]
            assert xt.shape == (d, n, max(widths))
            for j, u in enumerate(inputs):
                assert xt[j, :, : u.shape[1]].tobytes() == np.ascontiguousarray(u).tobytes(), (t, j)
                assert not xt[j, :, u.shape[1]:].any()
