"""LearnSPN's fixed-bin leaf fits give bit-identical models.

``Histogram.fit_fixed`` / ``PiecewiseLinear.fit_fixed`` must return exactly the parameters of the
generic fits on the same edges, and a whole LearnSPN model must not change when the fast path is
switched off.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit import learnspn
from mpifc.circuit.graph import LeafNode, SumNode, topological_order
from mpifc.circuit.leaves import FixedBins, Histogram, Leaf, PiecewiseLinear


def _same_leaf(a: Leaf, b: Leaf) -> bool:
    pa, pb = a.params(), b.params()
    return type(a) is type(b) and pa.keys() == pb.keys() and all(
        pa[k].dtype == pb[k].dtype and pa[k].shape == pb[k].shape and pa[k].tobytes() == pb[k].tobytes()
        for k in pa)


def _random_edges(rng: np.random.Generator) -> np.ndarray:
    lo, hi = np.sort(rng.normal(size=2) * 10)
    inner = np.unique(np.concatenate([[lo, hi], rng.uniform(lo, hi, int(rng.integers(1, 70)))]))
    inner[-1] = np.nextafter(inner[-1], np.inf)
    return np.concatenate([[inner[0] - 3.0], inner, [inner[-1] + 3.0]])


def test_fixed_bin_fits_equal_generic_fits_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    for t in range(300):
        edges = _random_edges(rng)
        bins = FixedBins(edges)
        n = int(rng.integers(1, 300))
        v = rng.uniform(edges[0], edges[-1], n)
        if t % 3 == 0:
            v = edges[rng.integers(0, len(edges), n)]  # on the edges, the last one included
        if t % 5 == 0:
            v = np.full(n, v[0])  # a constant slice (piecewise: the generic fit ignores the edges)
        if t % 7 == 0:
            v = np.round(v)
        alpha = float(rng.choice([1.0, 0.1, 0.01]))
        tail = float(rng.choice([1e-6, 0.0, 1e-3]))
        for discrete in (False, True):
            want = Histogram.fit(v, breaks=edges.copy(), discrete=discrete, alpha=alpha, tail=tail)
            got = Histogram.fit_fixed(v, bins, discrete=discrete, alpha=alpha, tail=tail)
            assert _same_leaf(want, got), (t, discrete)
        want = PiecewiseLinear.fit(v, bins=edges.copy(), alpha=alpha, tail=tail)
        got = PiecewiseLinear.fit_fixed(v, bins, alpha=alpha, tail=tail)
        assert _same_leaf(want, got), t
    # the edges stay untouched by fits (leaves get their own copies)
    assert np.array_equal(bins.edges, edges)


def test_fixed_bin_fits_fall_back_on_nan() -> None:
    bins = FixedBins(np.linspace(0.0, 1.0, 6))
    v = np.array([0.1, np.nan, 0.7, 0.7])
    assert _same_leaf(PiecewiseLinear.fit(v, bins=bins.edges.copy()), PiecewiseLinear.fit_fixed(v, bins))
    assert _same_leaf(Histogram.fit(v, breaks=bins.edges.copy()), Histogram.fit_fixed(v, bins))


def test_fixed_bins_reject_bad_edges() -> None:
    from mpifc.errors import UserError

    with pytest.raises(UserError, match="FixedBins"):
        FixedBins([0.0, 0.0, 1.0])


def _fingerprint(spn) -> list:
    out = []
    order = topological_order(spn.root)
    idx = {id(n): i for i, n in enumerate(order)}
    for node in order:
        row = [type(node).__name__, tuple(node.scope)]
        if isinstance(node, LeafNode):
            row += [type(node.dist).__name__] + [(k, v.tobytes()) for k, v in sorted(node.dist.params().items())]
        else:
            row.append(tuple(idx[id(c)] for c in node.children))
            if isinstance(node, SumNode):
                row.append(np.asarray(node.weights, dtype=np.float64).tobytes())
        out.append(row)
    return out


@pytest.mark.parametrize("leaf", ["piecewise", "histogram"])
def test_learnspn_model_unchanged_without_fast_paths(leaf: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    n = 900
    z = rng.integers(0, 3, n)
    x = np.column_stack([
        rng.normal(size=n) + z,                       # real, depends on z
        np.round(rng.normal(size=n) * 2) / 3 + z,     # real with few distinct values
        z.astype(float),                              # discrete 0..2
        (rng.random(n) < 0.3).astype(float),          # binary
        rng.normal(size=n),                           # independent real
        np.where(rng.random(n) < 0.9, 0.0, 1.5),      # nearly constant real
    ])
    meta = ["real", "real", "discrete", "discrete", "real", "real"]
    hp = dict(threshold=0.3, min_instances_slice=60, leaf=leaf, rdc_ties="ordinal", rdc_k=20, seed=5)
    fast = _fingerprint(learnspn.learn_spn(x, meta, **hp))

    init = learnspn._LeafMaker.__init__

    def generic_leaves(self, *a, **k):  # the generic leaf fits, as before the fast path
        init(self, *a, **k)
        self._fixed = False

    monkeypatch.setattr(learnspn._LeafMaker, "__init__", generic_leaves)
    slow = _fingerprint(learnspn.learn_spn(x, meta, **hp))
    assert len(fast) > 20  # the data do split
    assert fast == slow
