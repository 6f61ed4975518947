"""Fixed per-fit costs of small LearnSPN fits, trimmed without changing a single bit.

* ``FixedBins.many`` must build exactly the geometry of one ``FixedBins`` per edge array;
* ``piecewise_fit_fixed_columns`` must give, column by column, exactly the leaves of
  ``PiecewiseLinear.fit_fixed`` (or leave the column to it);
* ``_LeafMaker.columns`` (LearnSPN's fully factorised slices) must give exactly the leaves of one
  ``_LeafMaker`` call per column;
* ``spn.save_graph`` (which reads leaf parameters in place) must write exactly what the writer that
  copied them through ``Leaf.params()`` wrote (reference below).
"""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit import graph as G
from mpifc.circuit import learnspn
from mpifc.circuit.leaves import LEAF_TYPES, FixedBins, Leaf, PiecewiseLinear, piecewise_fit_fixed_columns
from mpifc.circuit.spn import _small_uint, save_graph
from mpifc.errors import UserError
from mpifc.federated.wire_format import WireGroup, model_to_bytes

_GEOMETRY = ("edges", "widths", "pw_edges", "pw_widths", "knots", "knot_steps")


def _bits(a: np.ndarray) -> tuple:
    a = np.asarray(a)
    return a.dtype.str, a.shape, a.tobytes()


def _same_leaf(a: Leaf, b: Leaf) -> bool:
    pa, pb = a.params(), b.params()
    return type(a) is type(b) and pa.keys() == pb.keys() and all(_bits(pa[k]) == _bits(pb[k]) for k in pa)


def _random_edges(rng: np.random.Generator) -> np.ndarray:
    scale, shift = rng.choice([1e-6, 1.0, 1e4]), rng.choice([0.0, -50.0, 1e6])
    n = int(rng.integers(2, 70))
    e = np.linspace(0.0, 1.0, n) if rng.random() < 0.3 else rng.normal(size=n)
    e = np.unique(e * scale + shift)  # strictly increasing after rounding
    return e if e.size >= 2 else np.array([shift, shift + 1.0])


def test_fixed_bins_many_equals_one_by_one() -> None:
    rng = np.random.default_rng(11)
    for _ in range(60):
        edges = [_random_edges(rng) for _ in range(int(rng.integers(1, 35)))]
        edges = [e for e in edges if e.size >= 2]
        for got, e in zip(FixedBins.many(edges), edges):
            want = FixedBins(e)
            for name in _GEOMETRY:
                assert _bits(getattr(got, name)) == _bits(getattr(want, name)), name
            assert got.constant(float(e[0])).edges.tobytes() == want.constant(float(e[0])).edges.tobytes()
    assert FixedBins.many([]) == []
    with pytest.raises(UserError, match="FixedBins"):
        FixedBins.many([np.array([0.0, 1.0]), np.array([0.0, 0.0, 1.0])])


def test_piecewise_columns_equal_single_fits() -> None:
    rng = np.random.default_rng(5)
    batched = 0
    for t in range(150):
        m, n = int(rng.integers(1, 14)), int(rng.integers(1, 250))
        edges = [_random_edges(rng) for _ in range(m)]
        bins = FixedBins.many(edges)
        block = np.empty((n, m))
        for j, e in enumerate(edges):
            lo, hi = e[0], e[-1]
            r = rng.random()
            if r < 0.15:
                block[:, j] = rng.choice(e)  # constant (the single fit's one-bin path)
            elif r < 0.3:
                block[:, j] = rng.choice(e, n)  # on the edges, the last one included
            elif r < 0.4:
                block[:, j] = rng.uniform(lo - (hi - lo), hi + (hi - lo), n)  # some outside
            else:
                block[:, j] = rng.uniform(lo, hi, n)
        alpha = float(rng.choice([1.0, 0.1, 0.01, 0.0]))
        tail = float(rng.choice([1e-6, 0.0, 1e-3]))
        got = piecewise_fit_fixed_columns(block, bins, alpha=alpha, tail=tail)
        assert len(got) == m
        for j in range(m):
            want = PiecewiseLinear.fit_fixed(block[:, j].copy(), bins[j], alpha=alpha, tail=tail)
            if got[j] is None:
                continue
            batched += 1
            assert _same_leaf(got[j], want), (t, j)
            assert got[j]._p["ys"].base is None or got[j]._p["ys"].base.size == got[j]._p["ys"].size
    assert batched > 500  # the batched path did the work
    # non-finite values or a bad tail: every column left to the single fit
    bad = np.array([[0.1, 0.2], [np.nan, 0.3]])
    two = FixedBins.many([np.linspace(0, 1, 5)] * 2)
    assert piecewise_fit_fixed_columns(bad, two) == [None, None]
    assert piecewise_fit_fixed_columns(np.array([[0.1, 0.2], [0.5, 0.3]]), two, tail=1.5) == [None, None]


@pytest.mark.parametrize("leaf", ["piecewise", "histogram", "auto"])
def test_leaf_maker_columns_equal_one_call_per_column(leaf: str) -> None:
    rng = np.random.default_rng(3)
    n = 300
    x = np.column_stack([rng.normal(size=n), rng.exponential(size=n), rng.integers(0, 5, n),
                         rng.integers(0, 2, n), rng.integers(0, 4, n), np.round(rng.normal(size=n), 1),
                         rng.uniform(size=n)]).astype(np.float64)
    meta = ["real", "real", "discrete", "discrete", "categorical", "real", "real"]
    params = learnspn.LearnSPNParams(leaf=leaf)
    xx, info = learnspn._check_inputs(x, meta, params)
    maker = learnspn._LeafMaker(xx, info, params)
    for _ in range(40):
        rows = np.sort(rng.choice(n, int(rng.integers(1, 60)), replace=False))
        cols = np.sort(rng.choice(x.shape[1], int(rng.integers(1, x.shape[1] + 1)), replace=False))
        if rng.random() < 0.2:
            rows = np.repeat(rows[:1], len(rows))  # every column constant
        got = maker.columns(xx, rows, cols)
        for node, v in zip(got, cols):
            want = maker(int(v), xx[rows, v])
            assert isinstance(node, G.LeafNode) and node.var == int(v) and node.scope == (int(v),)
            assert node.n_fit == want.n_fit and _same_leaf(node.dist, want.dist)


def _reference_save_graph(root: G.Node, group: WireGroup) -> None:
    """The writer before parameters were read in place (copies through ``Leaf.params()``)."""
    kinds = {"leaf": 0, "product": 1, "sum": 2}
    order = G.topological_order(root)
    pos = {id(n): i for i, n in enumerate(order)}
    leaves = [n for n in order if isinstance(n, G.LeafNode)]
    names = sorted({n.dist.type_name for n in leaves}, key=list(LEAF_TYPES).index)
    sums = [n for n in order if isinstance(n, G.SumNode)]
    group.create_dataset("kind", data=np.array([kinds[n.kind] for n in order], dtype=np.int8))
    group.create_dataset("n_children", data=_small_uint(np.array([len(n.children) for n in order])))
    group.create_dataset("child_idx", data=_small_uint(np.array([pos[id(c)] for n in order for c in n.children])))
    group.create_dataset("sum_weights", data=np.concatenate([n.weights for n in sums]) if sums else np.zeros(0))
    group.create_dataset("leaf_var", data=_small_uint(np.array([n.var for n in leaves])))
    ltype = np.array([names.index(n.dist.type_name) for n in leaves], dtype=np.int8)
    if len(names) > 1:
        group.create_dataset("leaf_type", data=ltype)
    if any(tuple(sorted(set().union(*(c.scope for c in n.children)))) != tuple(sorted(n.scope))
           for n in order if not isinstance(n, G.LeafNode)):
        declared = [tuple(n.scope) for n in order]
        group.create_dataset("scope_ptr", data=_small_uint(np.cumsum([0] + [len(s) for s in declared])))
        group.create_dataset("scope_vars", data=_small_uint(np.array([v for s in declared for v in s])))
    group.attrs["leaf_types"] = names
    group.attrs["layout"] = 2
    lg = group.create_group("leaves")
    for t, name in enumerate(names):
        mine = [n.dist for n, lt in zip(leaves, ltype) if lt == t]
        sub, cls = lg.create_group(name), LEAF_TYPES[name]
        for p in cls.param_names:
            arrs = [lf.params()[p] for lf in mine]
            flat = np.concatenate([a.reshape(-1) for a in arrs])
            if p in cls.ragged:
                sub.create_dataset(p, data=flat)
                sub.create_dataset(p + ".len", data=_small_uint(np.array([a.size for a in arrs])))
                continue
            same = flat.size > 1 and bool(np.all(flat.view(np.uint64) == flat[:1].view(np.uint64)))
            sub.create_dataset(p, data=flat[:1] if same else flat)


def _wire(write, root: G.Node) -> bytes:
    class Holder:
        def save(self, group: WireGroup) -> None:
            write(root, group)

    return model_to_bytes(Holder()).tobytes()


@pytest.mark.parametrize("leaf", ["piecewise", "histogram", "auto"])
def test_save_graph_writes_what_the_copying_writer_wrote(leaf: str) -> None:
    rng = np.random.default_rng(9)
    for seed in range(3):
        n = 400
        x = np.column_stack([rng.normal(size=n), rng.normal(size=n) * 3, rng.integers(0, 6, n),
                             rng.integers(0, 2, n), rng.integers(0, 3, n)]).astype(np.float64)
        x[:, 1] += x[:, 0]
        spn = learnspn.learn_spn(x, ["real", "real", "discrete", "discrete", "categorical"], leaf=leaf,
                                 min_instances_slice=60, seed=seed)
        root = spn.root
        before = {id(n): n.dist.params() for n in G.topological_order(root) if isinstance(n, G.LeafNode)}
        assert _wire(save_graph, root) == _wire(_reference_save_graph, root)
        for n in G.topological_order(root):  # the leaves are left untouched
            if isinstance(n, G.LeafNode):
                assert all(_bits(v) == _bits(n.dist.params()[k]) for k, v in before[id(n)].items())
    # a hand-built graph: a declared scope wider than the children's, several leaf types
    a = G.LeafNode(0, LEAF_TYPES["gaussian"](0.5, 2.0))
    b = G.LeafNode(3, LEAF_TYPES["bernoulli"](0.25))
    c = G.LeafNode(3, LEAF_TYPES["bernoulli"](0.75))
    s = G.SumNode([b, c], [0.4, 0.6])
    p = G.ProductNode([a, s], scope=[0, 3])
    assert _wire(save_graph, p) == _wire(_reference_save_graph, p)


def test_leaf_node_sets_what_the_generic_node_sets() -> None:
    dist = LEAF_TYPES["bernoulli"](0.5)
    for var in (0, 3, np.int64(7), np.uint8(2)):
        leaf = G.LeafNode(var, dist)
        ref = G.Node((), (int(var),))
        assert leaf.scope == ref.scope and type(leaf.scope[0]) is int and leaf.var == int(var)
        assert leaf.children == [] and isinstance(leaf.id, int) and leaf.dist is dist
    for bad in (-1, True, 1.0, "2"):
        with pytest.raises(UserError, match="scope_var"):
            G.LeafNode(bad, dist)


def test_wire_reader_rejects_every_truncated_header() -> None:
    """The header reader's inlined varint/byte reads stop at the header's end like before: every
    cut of a blob inside its header (or data) is a clean UserError, the whole blob decodes."""
    from mpifc.federated.wire_format import model_from_bytes, wire_overhead

    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(size=200), rng.integers(0, 2, 200)]).astype(np.float64)
    blob = model_to_bytes(learnspn.learn_spn(x, ["real", "discrete"], min_instances_slice=50, seed=0))
    head = wire_overhead(blob)
    for cut in list(range(head + 2)) + [len(blob) - 1]:
        with pytest.raises(UserError, match="malformed model blob"):
            model_from_bytes(blob[:cut], lazy=True)
    assert np.array_equal(model_to_bytes(model_from_bytes(blob, lazy=True)), blob)
