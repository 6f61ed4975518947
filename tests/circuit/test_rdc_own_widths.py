"""The RDC column split with per-column feature widths (``widths="own"``).

A categorical column of many values (a target of hundreds of classes) takes as many random
features as the values it holds, and every other column keeps ``k``: the pair blocks are then
rectangular. Their decisions must be those of the largest canonical correlation (the largest
singular value of the whitened cross-covariance), and the column groups those of a clear-cut
dependence structure.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit import rdc
from mpifc.circuit.learnspn import learn_spn
from mpifc.errors import UserError


def _block(rng: np.random.Generator, n: int, d: int, kk: int, base: np.ndarray) -> tuple:
    """Features ``(d, n, kk)`` mixing a shared signal ``base`` with noise, with their means and
    whitening as :func:`rdc._whitening` forms them."""
    feats = np.sin(base[None, :, :1] * rng.normal(size=(d, 1, kk)) + rng.normal(size=(d, n, kk)) * rng.uniform(0.2, 3, (d, 1, 1)))
    feats[0, :, -1] = feats[0, :, 0]  # a numerically absent direction
    sums = np.add.reduce(feats, axis=1)
    diag = np.matmul(feats.transpose(0, 2, 1), feats)
    return (feats, *rdc._whitening(sums, diag, n, np.zeros(d, dtype=bool)))


@pytest.mark.parametrize("kl,kr", [(10, 37), (37, 10)])
def test_rectangular_pair_decisions_equal_the_largest_singular_value(kl: int, kr: int) -> None:
    rng = np.random.default_rng(5)
    n = 300
    base = rng.normal(size=(n, 1))
    left, right = _block(rng, n, 4, kl, base), _block(rng, n, 5, kr, base)
    tops = np.empty((4, 5))
    for a in range(4):
        for b in range(5):
            fa, fb = left[0][a], right[0][b]
            cov = (fa - fa.mean(0)).T @ (fb - fb.mean(0)) / n
            tops[a, b] = np.linalg.svd(left[2][a].T @ cov @ right[2][b], compute_uv=False)[0]
    assert 0.05 < tops.min() and tops.max() < 0.999  # a spread of dependences, none degenerate
    cuts = np.sort(tops.ravel())
    for t in np.concatenate([(cuts[:-1] + cuts[1:]) / 2, [cuts[0] / 2, (1 + cuts[-1]) / 2]]):
        got = rdc._pair_decisions(*left, np.arange(4), np.arange(5), n, float(t), right=right)
        assert np.array_equal(got, tops >= t)


def test_own_widths_group_a_many_valued_column_with_what_it_depends_on() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    x0 = rng.normal(size=n)
    c1 = np.searchsorted(np.quantile(x0, np.linspace(0, 1, 41)[1:-1]), x0)  # 40 values, a function of x0
    x2 = rng.normal(size=n)
    x3 = x2 + 0.3 * rng.normal(size=n)
    x4 = rng.normal(size=n)
    data = np.column_stack([x0, c1, x2, x3, x4]).astype(float)
    cat = [False, True, False, False, False]
    cards = [0, 60, 0, 0, 0]  # 20 declared values absent from the slice
    groups = rdc.rdc_groups(data, cat, cards, 0.3, rng=np.random.default_rng(1), widths="own")
    assert [g.tolist() for g in groups] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="widths"):
        rdc.rdc_groups(data, cat, cards, 0.3, rng=np.random.default_rng(1), widths="wide")
    with pytest.raises(UserError, match="rdc_widths"):
        learn_spn(data, ["real", "categorical", "real", "real", "real"], rdc_widths="wide")
