"""Compile a circuit graph into flat layers and evaluate it in one vectorised pass per layer.

Layout of the node-value buffer ``V`` ``(batch, n_nodes)`` (log-values, nats):

* leaves first, grouped by leaf type; each group is a contiguous slice evaluated by one call of
  the type's batched ``batch_log_prob`` on the gathered data columns;
* then, per topological layer (layer = 1 + deepest child layer), the layer's product nodes
  (contiguous; ``index_add`` of child log-values) followed by its sum nodes (contiguous; gather
  child values along a flat edge list, add log-weights, segment-reduce with the semiring).

Python loops run over layers and leaf types only, never over nodes. The same buffers drive the
downward passes: MPE backtracking, (conditional) sampling and EM flows.

Queries that need the root value only (likelihoods, marginals, conditionals, max-product values)
run on a :class:`RootPlan` when the circuit has many leaves of a finite domain (Bernoulli,
Categorical) under wide products, as LearnSPN builds on wide discrete tables: such a product's
leaf terms are one column of a one-hot matrix product, ``onehot(x) @ tables``, so neither the
``(batch, n_leaves)`` leaf values nor the gathers of their edges are formed, and the remaining
nodes are evaluated node-major. The leaf terms are summed in another order than the generic
pass (equal to rounding).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from mpifc.circuit.graph import LeafNode, Node, SumNode, inner_layers, topological_order, validate
from mpifc.circuit.leaves import LEAF_TYPES, LOG_ZERO, MIN_FLOW, Leaf, Params
from mpifc.circuit.semiring import MAX_PRODUCT, SUM_PRODUCT, Semiring, segment_argmax
from mpifc.errors import UserError

MAX_BUFFER_ELEMS = 1 << 21
"""Rows are processed in chunks so that ``batch * n_nodes`` stays near this (16 MB in float64):
large enough to amortise the per-layer Python overhead, small enough to stay cache-friendly."""

MIN_CHUNK_ROWS = 1024

FOLD_MIN_EDGES = 2048
"""A :class:`RootPlan` is used when at least this many leaf edges fold into one-hot products; on
smaller circuits the generic pass costs little and keeps its own summation order."""

FOLD_SHARE = 256
"""A product's finite-domain leaves fold when they number at least ``1 / FOLD_SHARE`` of the one-hot
features (``sum_v |domain_v|``): its column of the matrix product then costs at most
``FOLD_SHARE`` multiply-adds per leaf and row, against about as many element operations per
leaf and row in the generic pass. Leaves of narrower products stay on the generic pass."""


def _finite_domain(g: "LeafGroup") -> torch.Tensor | None:
    """Per leaf of ``g``, the size ``K`` of its domain ``{0, ..., K-1}`` (int64 ``(n,)``), or
    ``None`` if the type is not one whose leaves fold (values outside the domain are
    impossible for these types, and a missing value is marginalised by the type itself)."""
    name = g.cls.type_name
    if name == "bernoulli":
        return torch.full((g.stop - g.start,), 2, dtype=torch.int64)
    if name == "categorical":
        return g.P["len_probs"].to(torch.int64)
    return None


@dataclass
class LeafGroup:
    """All leaves of one type: stacked parameters and where their values live.

    Attributes:
        cls: the leaf class.
        P: stacked parameters (see :meth:`Leaf.stack`), leading dim ``n``.
        cols: ``(n,)`` data column of each leaf.
        start, stop: slice of the node buffer holding these leaves.
        nodes: the graph's leaf nodes (for writing EM results back).
    """

    cls: type[Leaf]
    P: Params
    cols: torch.Tensor
    start: int
    stop: int
    nodes: list[LeafNode]


@dataclass
class Layer:
    """One topological layer: products ``[p0, p1)`` then sums ``[s0, s1)`` of the node buffer.

    ``prod_child``/``prod_parent`` ``(Ep,)``: global child index and local parent index per edge.
    ``sum_child``/``sum_parent`` ``(Es,)`` likewise; the edges' log-weights are
    ``log_weights[e0:e1]`` of the circuit.
    """

    p0: int
    p1: int
    prod_child: torch.Tensor
    prod_parent: torch.Tensor
    s0: int
    s1: int
    sum_child: torch.Tensor
    sum_parent: torch.Tensor
    e0: int
    e1: int


@dataclass
class CircuitStats:
    """EM sufficient statistics of a compiled circuit; ``a + b`` == stats of both shards.

    Attributes:
        edge_counts: ``(E,)`` expected counts per sum edge (edge order of the circuit).
        leaf: per leaf group, the type's sufficient statistics ``{name: (n, ...)}``.
        log_likelihood: weighted sum of ``log p(x)`` over the samples (nats).
        n: sum of the sample weights.
    """

    edge_counts: np.ndarray
    leaf: list[dict[str, np.ndarray]]
    log_likelihood: float = 0.0
    n: float = 0.0

    def __add__(self, other: "CircuitStats") -> "CircuitStats":
        if self.edge_counts.shape != other.edge_counts.shape or len(self.leaf) != len(other.leaf):
            raise UserError("EM statistics: cannot add statistics of different circuits")
        return CircuitStats(
            self.edge_counts + other.edge_counts,
            [{k: a[k] + b[k] for k in a} for a, b in zip(self.leaf, other.leaf)],
            self.log_likelihood + other.log_likelihood,
            self.n + other.n,
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat float64 arrays (keys ``edges``, ``leaf{g}/{name}``, ``ll``, ``n``)."""
        out = {"edges": self.edge_counts.astype(np.float64),
               "ll": np.array([self.log_likelihood]), "n": np.array([self.n])}
        for g, d in enumerate(self.leaf):
            for k, v in d.items():
                out[f"leaf{g}/{k}"] = np.asarray(v, dtype=np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "CircuitStats":
        """Inverse of :meth:`to_arrays` (e.g. after an all-reduce)."""
        n_groups = 1 + max((int(k[4:].split("/")[0]) for k in arrays if k.startswith("leaf")), default=-1)
        leaf: list[dict[str, np.ndarray]] = [{} for _ in range(n_groups)]
        for k, v in arrays.items():
            if k.startswith("leaf"):
                g, name = k[4:].split("/", 1)
                leaf[int(g)][name] = np.asarray(v, dtype=np.float64)
        return cls(np.asarray(arrays["edges"], dtype=np.float64), leaf,
                   float(np.asarray(arrays["ll"])[0]), float(np.asarray(arrays["n"])[0]))


@dataclass
class OneHot:
    """One encoding of the folded variables' values as features (see :class:`LeafFold`).

    Value ``k`` of the ``v``-th folded variable is feature ``first[v] + k``, except values
    ``k < shift[v]`` and missing values, which have none (they go to the last, all-zero row of
    ``table``). ``shift[v] = 1`` makes value 0 a baseline: its log-values are summed into
    ``const`` and the other values' rows hold differences from it. ``binary``: every variable
    is binary with a baseline, so feature ``v`` is the value of variable ``v`` itself.

    Attributes:
        shift: ``(m,)`` 0 or 1.
        first: ``(m,)`` feature of value 0 (of value 1 minus one where ``shift`` is 1).
        table: ``(F + 1, P)`` leaf log-values (nats) per feature, summed per folded product.
        const: ``(P,)`` the baselines' sum per product, or ``None``.
    """

    shift: torch.Tensor
    first: torch.Tensor
    table: torch.Tensor
    const: torch.Tensor | None
    binary: bool = False

    @classmethod
    def build(cls, lp: torch.Tensor, v: torch.Tensor, q: torch.Tensor, size: torch.Tensor, shift: torch.Tensor,
              n_prods: int) -> "OneHot":
        """From the log-values ``lp`` ``(e, k_max)`` of ``e`` folded edges, each from a leaf of
        variable ``v[e]`` to product ``q[e]``; ``size`` and ``shift`` per variable."""
        rows = size - shift
        offset = torch.cumsum(rows, 0) - rows
        base = torch.where(shift[v] == 1, lp[:, 0], torch.zeros_like(lp[:, 0]))
        k_all = torch.arange(lp.shape[1])[None, :]
        e, k = torch.nonzero((k_all < size[v][:, None]) & (k_all >= shift[v][:, None]), as_tuple=True)
        table = torch.zeros(int(rows.sum()) + 1, n_prods, dtype=lp.dtype)
        table.index_put_((offset[v[e]] + k - shift[v[e]], q[e]), lp[e, k] - base[e], accumulate=True)
        const = torch.zeros(n_prods, dtype=lp.dtype).index_add_(0, q, base)
        # Only binary variables with a baseline: the features are the values themselves.
        binary = bool((size == 2).all() and (shift == 1).all())
        return cls(shift, offset - shift, table, const if bool(shift.any()) else None, binary)


@dataclass
class LeafFold:
    """Finite-domain leaves folded into their product parents (see :class:`RootPlan`).

    Attributes:
        cols: ``(m,)`` data column of each folded variable.
        all_columns: ``cols`` is every column in order.
        size: ``(m,)`` domain size ``K_v`` of each (the largest over its folded leaves), in the
            circuit's dtype.
        plain: one feature per value; used when a folded variable is missing in the batch.
        compact: value 0 as the baseline (one feature less per variable, half the features of
            binary ones) where no folded leaf of the variable has a log-value at or below
            :data:`_BASELINE_FLOOR` (an impossible value, ``LOG_ZERO``, would cancel
            catastrophically); used for batches without missing folded values.
        missing_sum, missing_max: ``(m, P)`` leaf log-values for a missing value, summed per
            product, under sum-product (the type's marginal) and max-product (the value at the
            leaf's mode); ``None`` when all zero.
        start, stop: the folded products' partial sums in the plan's node buffer.
    """

    cols: torch.Tensor
    all_columns: bool
    size: torch.Tensor
    plain: OneHot
    compact: OneHot
    missing_sum: torch.Tensor | None
    missing_max: torch.Tensor | None
    start: int
    stop: int


_BASELINE_FLOOR = -1e4
"""Leaf log-values (nats) at or below this keep a variable's values as plain features (see
:class:`LeafFold`)."""


@dataclass
class RootPlan:
    """A smaller node buffer for root-only queries.

    The circuit's layers, with the edges from wide products to their finite-domain leaves
    replaced by one edge per product to a partial sum, ``onehot(x) @ table`` (:class:`OneHot`): the
    product's leaf log-values, summed by the matrix product. Leaves left without an edge are not
    evaluated. Buffer layout, node-major ``(n_nodes, batch)``: the remaining leaves (``groups``,
    subsets of the circuit's groups), the partial sums, then the inner nodes in the circuit's
    order. Sum edges keep the circuit's order, so the circuit's ``log_weights[e0:e1]`` apply
    unchanged. ``pair_sums[i]``: every sum of layer ``i`` has two children (see
    :meth:`Semiring.plus_rows`).
    """

    groups: list[LeafGroup]
    fold: LeafFold
    layers: list[Layer]
    pair_sums: list[bool]
    n_nodes: int
    root_index: int

    @classmethod
    def build(cls, cc: "CompiledCircuit") -> "RootPlan | None":
        """The plan of ``cc``, or ``None`` when fewer than :data:`FOLD_MIN_EDGES` leaf edges fold."""
        n_leaves = cc.groups[-1].stop if cc.groups else 0
        if n_leaves == 0 or not cc.layers:
            return None
        size = torch.zeros(n_leaves, dtype=torch.int64)  # 0: not a finite-domain leaf
        col = torch.empty(n_leaves, dtype=torch.int64)
        for g in cc.groups:
            col[g.start:g.stop] = g.cols
            k = _finite_domain(g)
            if k is not None:
                size[g.start:g.stop] = k
        # A leaf folds only if all its parents are products: a sum or the root needs its value.
        foldable = size > 0
        sum_leaf_kids = torch.cat([L.sum_child[L.sum_child < n_leaves] for L in cc.layers])
        foldable[sum_leaf_kids] = False
        if cc.root_index < n_leaves:
            foldable[cc.root_index] = False
        if not bool(foldable.any()):
            return None
        n_edges = [len(L.prod_child) for L in cc.layers]
        prod_child = torch.cat([L.prod_child for L in cc.layers])
        prod_parent = torch.cat([L.p0 + L.prod_parent for L in cc.layers])
        leaf_edge = prod_child < n_leaves
        cand = torch.zeros(len(prod_child), dtype=torch.bool)
        cand[leaf_edge] = foldable[prod_child[leaf_edge]]
        widest = torch.zeros(len(cc.scope), dtype=torch.int64)
        widest.scatter_reduce_(0, col[foldable], size[foldable], reduce="amax")
        per_prod = torch.zeros(cc.n_nodes, dtype=torch.int64).index_add_(0, prod_parent, cand.to(torch.int64))
        wide = (per_prod > 0) & (per_prod * FOLD_SHARE >= int(widest.sum()))
        folded = cand & wide[prod_parent]
        if int(folded.sum()) < FOLD_MIN_EDGES:
            return None

        # The folded variables, and one partial sum (column) per wide product.
        f_leaf, f_prod = prod_child[folded], prod_parent[folded]
        var_size = torch.zeros(len(cc.scope), dtype=torch.int64)
        var_size.scatter_reduce_(0, col[f_leaf], size[f_leaf], reduce="amax")
        variables = torch.nonzero(var_size).reshape(-1)
        k_v = var_size[variables]
        slot = torch.full((len(cc.scope),), -1, dtype=torch.int64)
        slot[variables] = torch.arange(len(variables))
        prods = torch.nonzero(wide).reshape(-1)  # ascending, so grouped by layer
        fold_col = torch.full((cc.n_nodes,), -1, dtype=torch.int64)
        fold_col[prods] = torch.arange(len(prods))

        # Per folded edge, its leaf's log-value at every value of its variable, missing under
        # either semiring, from the type's own batch_log_prob (the generic pass's values).
        dt = cc.dtype
        k_all = int(k_v.max())
        edge_v, edge_q, lp_all, lp_nan, lp_mode = [], [], [], [], []
        for g in cc.groups:
            mine = (f_leaf >= g.start) & (f_leaf < g.stop)
            if not bool(mine.any()):
                continue
            n_g = g.stop - g.start
            j = f_leaf[mine] - g.start
            lp = g.cls.batch_log_prob(g.P, torch.arange(k_all, dtype=dt)[:, None].expand(k_all, n_g))
            lp_all.append(lp[:, j].T)  # (edges, k_all)
            lp_nan.append(g.cls.batch_log_prob(g.P, torch.full((1, n_g), float("nan"), dtype=dt))[0, j])
            lp_mode.append(g.cls.batch_log_prob(g.P, g.cls.batch_mode(g.P).to(dt)[None, :])[0, j])
            edge_v.append(slot[col[f_leaf[mine]]])
            edge_q.append(fold_col[f_prod[mine]])
        v, q = torch.cat(edge_v), torch.cat(edge_q)
        lp, nan, mode = torch.cat(lp_all), torch.cat(lp_nan), torch.cat(lp_mode)
        in_domain = torch.arange(k_all)[None, :] < k_v[v][:, None]  # (edges, k_all)
        lowest = torch.full((len(variables),), float("inf"), dtype=dt)
        lowest.scatter_reduce_(0, v, torch.where(in_domain, lp, torch.inf).amin(1), reduce="amin")
        plain = OneHot.build(lp, v, q, k_v, torch.zeros_like(k_v), len(prods))
        shift = (lowest > _BASELINE_FLOOR).to(torch.int64)
        compact = OneHot.build(lp, v, q, k_v, shift, len(prods)) if bool(shift.any()) else plain
        miss_sum = torch.zeros(len(variables), len(prods), dtype=dt).index_put_((v, q), nan, accumulate=True)
        miss_max = torch.zeros(len(variables), len(prods), dtype=dt).index_put_((v, q), mode, accumulate=True)

        # Buffer: the leaves still on an edge, the partial sums, the inner nodes.
        needed = torch.zeros(n_leaves, dtype=torch.bool)
        needed[prod_child[leaf_edge & ~folded]] = True
        needed[sum_leaf_kids] = True
        if cc.root_index < n_leaves:
            needed[cc.root_index] = True
        new_index = torch.full((cc.n_nodes,), -1, dtype=torch.int64)
        groups: list[LeafGroup] = []
        nxt = 0
        for g in cc.groups:
            keep = torch.nonzero(needed[g.start:g.stop]).reshape(-1)
            if len(keep) == 0:
                continue
            new_index[g.start + keep] = torch.arange(nxt, nxt + len(keep))
            groups.append(LeafGroup(g.cls, {name: t[keep] for name, t in g.P.items()}, g.cols[keep], nxt,
                                    nxt + len(keep), [g.nodes[i] for i in keep.tolist()]))
            nxt += len(keep)
        f_start = nxt
        moved = f_start + len(prods) - n_leaves
        new_index[n_leaves:] = torch.arange(n_leaves, cc.n_nodes) + moved
        layers: list[Layer] = []
        e0 = 0
        for L, ne in zip(cc.layers, n_edges):
            keep = ~folded[e0:e0 + ne]
            e0 += ne
            mine = prods[(prods >= L.p0) & (prods < L.p1)]
            # The partial sum first, then the product's other children in their order.
            pc = torch.cat([f_start + fold_col[mine], new_index[L.prod_child[keep]]])
            pp = torch.cat([mine - L.p0, L.prod_parent[keep]])
            layers.append(Layer(L.p0 + moved, L.p1 + moved, pc, pp, L.s0 + moved, L.s1 + moved,
                                new_index[L.sum_child], L.sum_parent, L.e0, L.e1))
        fold = LeafFold(variables, len(variables) == len(cc.scope), k_v.to(dt), plain, compact,
                        miss_sum if bool(miss_sum.any()) else None, miss_max if bool(miss_max.any()) else None,
                        f_start, f_start + len(prods))
        pair_sums = [len(L.sum_child) == 2 * (L.s1 - L.s0) and bool(
            torch.equal(L.sum_parent, torch.arange(L.s1 - L.s0).repeat_interleave(2))) for L in layers]
        return cls(groups, fold, layers, pair_sums, cc.n_nodes + moved, int(new_index[cc.root_index]))


def _idx(a: Sequence[int]) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.int64), dtype=torch.int64)


class CompiledCircuit:
    """Flat-layer form of a valid circuit, with every query.

    Args:
        root: root node of a valid circuit (checked with :func:`validate`).
        dtype: evaluation dtype (float64 default).
        check: run :func:`validate` first.

    Data ``x`` is ``(batch, len(scope))``; column ``j`` holds variable ``scope[j]``; NaN = missing.
    """

    def __init__(self, root: Node, dtype: torch.dtype = torch.float64, check: bool = True) -> None:
        if check:
            validate(root)
        self.root = root
        self.dtype = dtype
        self.scope: tuple[int, ...] = root.scope
        col_of = {v: j for j, v in enumerate(self.scope)}
        order = topological_order(root)
        pos: dict[int, int] = {}

        # Leaves, grouped by type in registry order (deterministic buffer layout).
        self.groups: list[LeafGroup] = []
        nxt = 0
        leaves = [n for n in order if isinstance(n, LeafNode)]
        for n in leaves:
            if type(n.dist) not in LEAF_TYPES.values():
                raise UserError(f"{n.name}: leaf type {type(n.dist).__name__} is not registered in "
                                f"mpifc.circuit.leaves.LEAF_TYPES")
        for cls in LEAF_TYPES.values():
            mine = [n for n in leaves if type(n.dist) is cls]
            if not mine:
                continue
            for n in mine:
                pos[id(n)] = nxt
                nxt += 1
            self.groups.append(LeafGroup(cls, cls.stack([n.dist for n in mine], dtype),
                                         _idx([col_of[n.var] for n in mine]), nxt - len(mine), nxt, mine))

        # Inner nodes by layer (mpifc.circuit.graph.inner_layers).
        self.layers: list[Layer] = []
        self.sum_nodes: list[SumNode] = []
        logw: list[np.ndarray] = []
        e = 0
        for prods, sums in inner_layers(order):
            p0 = nxt
            for n in prods:
                pos[id(n)] = nxt
                nxt += 1
            s0 = nxt
            for n in sums:
                pos[id(n)] = nxt
                nxt += 1
            pc = [pos[id(c)] for n in prods for c in n.children]
            pp = [i for i, n in enumerate(prods) for _ in n.children]
            sc = [pos[id(c)] for n in sums for c in n.children]
            sp = [i for i, n in enumerate(sums) for _ in n.children]
            self.sum_nodes.extend(sums)
            logw.extend(np.asarray(n.weights, dtype=np.float64) for n in sums)
            self.layers.append(Layer(p0, s0, _idx(pc), _idx(pp), s0, nxt, _idx(sc), _idx(sp), e, e + len(sc)))
            e += len(sc)
        self.n_nodes = nxt
        self.n_edges = e
        self.root_index = pos[id(root)]
        w = np.concatenate(logw) if logw else np.zeros(0)
        self.weights = torch.as_tensor(w, dtype=dtype)
        # Parent (global sum index) of each edge, for per-node weight normalisation.
        self.edge_sum = _idx(np.repeat(np.arange(len(self.sum_nodes)), [len(n.children) for n in self.sum_nodes]))
        self._refresh_log_weights()
        self._graph_synced = True
        # Root-only queries may use a RootPlan; False keeps them on the generic pass.
        self.fold_leaves = True
        self._plan_state: tuple[tuple[Params, ...], RootPlan | None] | None = None

    # ------------------------------------------------------------------ helpers

    def _refresh_log_weights(self) -> None:
        self.log_weights = torch.log(self.weights).clamp_min(LOG_ZERO)

    def as_input(self, x: Any) -> torch.Tensor:
        """Validate and convert ``x`` to a ``(batch, len(scope))`` tensor of :attr:`dtype`."""
        t = x.to(self.dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=self.dtype)
        if t.dim() != 2 or t.shape[1] != len(self.scope):
            raise UserError(f"circuit input: expected shape (batch, {len(self.scope)}) for scope "
                            f"{self.scope[:8]}{'...' if len(self.scope) > 8 else ''}, got {tuple(t.shape)}")
        return t

    def _chunks(self, B: int) -> list[slice]:
        step = max(MIN_CHUNK_ROWS, MAX_BUFFER_ELEMS // max(1, self.n_nodes))
        return [slice(i, min(B, i + step)) for i in range(0, max(B, 1), step)] if B else []

    # ------------------------------------------------------------------ upward pass

    def forward(self, x: torch.Tensor, semiring: Semiring = SUM_PRODUCT) -> torch.Tensor:
        """Log-values of every node ``(batch, n_nodes)`` under ``semiring`` (x already converted)."""
        B = x.shape[0]
        V = torch.empty(B, self.n_nodes, dtype=self.dtype)
        for g in self.groups:
            xs = x[:, g.cols]
            if semiring.is_max:
                # Max-product marginalises a missing variable by its most probable value.
                xs = torch.where(torch.isnan(xs), g.cls.batch_mode(g.P).to(self.dtype)[None, :], xs)
            V[:, g.start:g.stop] = g.cls.batch_log_prob(g.P, xs)
        for L in self.layers:
            if L.p1 > L.p0:
                V[:, L.p0:L.p1] = torch.zeros(B, L.p1 - L.p0, dtype=self.dtype).index_add_(
                    1, L.prod_parent, V[:, L.prod_child])
            if L.s1 > L.s0:
                vals = V[:, L.sum_child] + self.log_weights[L.e0:L.e1]
                V[:, L.s0:L.s1] = semiring.plus(vals, L.sum_parent, L.s1 - L.s0)
        return V

    def root_plan(self) -> RootPlan | None:
        """The :class:`RootPlan` of root-only queries (made on first use and again after the
        leaf parameters change), or ``None`` when they take the generic pass."""
        state = self._plan_state
        if state is None or len(state[0]) != len(self.groups) or any(
                a is not g.P for a, g in zip(state[0], self.groups)):
            # The parameter dicts themselves are kept: an id() could be reused by a later dict.
            state = self._plan_state = (tuple(g.P for g in self.groups), RootPlan.build(self))
        return state[1]

    def _root_values(self, t: torch.Tensor, semiring: Semiring) -> torch.Tensor:
        """Root log-value ``(batch,)`` of converted data ``t`` under ``semiring``, chunked."""
        plan = self.root_plan() if self.fold_leaves else None
        if plan is None:
            out = [self.forward(t[c], semiring)[:, self.root_index] for c in self._chunks(t.shape[0])]
            return torch.cat(out) if out else torch.zeros(0, dtype=self.dtype)
        f = plan.fold
        step = max(MIN_CHUNK_ROWS, MAX_BUFFER_ELEMS // max(1, plan.n_nodes, f.plain.table.shape[0]))
        out = []
        for lo in range(0, t.shape[0], step):
            x = t[lo:lo + step]
            root = self._plan_root(plan, x, semiring)
            if root is None:  # a value outside a folded leaf's domain: the generic pass
                root = torch.cat([self.forward(x[c], semiring)[:, self.root_index] for c in self._chunks(x.shape[0])])
            out.append(root)
        return torch.cat(out) if out else torch.zeros(0, dtype=self.dtype)

    def _plan_root(self, plan: RootPlan, x: torch.Tensor, semiring: Semiring) -> torch.Tensor | None:
        """Root log-values ``(batch,)`` by ``plan``; ``None`` if a folded variable holds a value
        outside its domain (neither ``0 .. K_v - 1`` nor missing).

        The buffer is node-major, ``(n_nodes, batch)``: the generic pass's operations per node
        along the other axis, so that gathers and scatters move whole rows of the batch (several
        times faster than the columns of a row-major buffer); each value is the same, sums still
        running in edge order.
        """
        f = plan.fold
        B = x.shape[0]
        xs = x if f.all_columns else x[:, f.cols]
        missing = torch.isnan(xs)
        incomplete = bool(missing.any())
        value = torch.where(missing, torch.zeros_like(xs), xs) if incomplete else xs
        # A missing value has no feature; its leaves' values come from the missing rows, which
        # the compact form would have to offset by the baseline (a difference of large sums).
        enc = f.plain if incomplete else f.compact
        if enc.binary:
            ok = ((value == 0) | (value == 1)).all()
        else:
            ok = ((value >= 0) & (value < f.size) & (value == torch.floor(value))).all()
        if not bool(ok):
            return None
        V = torch.empty(plan.n_nodes, B, dtype=self.dtype)
        part = V[f.start:f.stop]
        if enc.binary:
            torch.matmul(enc.table[:-1].T, value.T, out=part)
        else:
            sink = enc.table.shape[0] - 1
            code = value.long()
            feature = torch.where(missing | (code < enc.shift), sink, code + enc.first)
            onehot = torch.zeros(B, sink + 1, dtype=self.dtype).scatter_(1, feature, 1.0)
            torch.matmul(enc.table.T, onehot.T, out=part)
        if enc.const is not None:
            part += enc.const[:, None]
        extra = f.missing_max if semiring.is_max else f.missing_sum
        if incomplete and extra is not None:
            part.addmm_(extra.T, missing.T.to(self.dtype))
        for g in plan.groups:
            xg = x[:, g.cols]
            if semiring.is_max:
                xg = torch.where(torch.isnan(xg), g.cls.batch_mode(g.P).to(self.dtype)[None, :], xg)
            V[g.start:g.stop] = g.cls.batch_log_prob(g.P, xg).T
        for L, pairs in zip(plan.layers, plan.pair_sums):
            if L.p1 > L.p0:
                V[L.p0:L.p1] = torch.zeros(L.p1 - L.p0, B, dtype=self.dtype).index_add_(
                    0, L.prod_parent, V[L.prod_child])
            if L.s1 > L.s0:
                vals = V[L.sum_child] + self.log_weights[L.e0:L.e1, None]
                V[L.s0:L.s1] = semiring.plus_rows(vals, L.sum_parent, L.s1 - L.s0, pairs)
        return V[plan.root_index]

    @torch.no_grad()
    def log_likelihood(self, x: Any) -> torch.Tensor:
        """``log p(x)`` ``(batch,)`` in nats; NaN entries are marginalised per sample."""
        return self._root_values(self.as_input(x), SUM_PRODUCT)

    @torch.no_grad()
    def max_log_value(self, x: Any) -> torch.Tensor:
        """Max-product value at the root ``(batch,)``: ``max`` over completions and sum choices."""
        return self._root_values(self.as_input(x), MAX_PRODUCT)

    # ------------------------------------------------------------------ downward passes

    def _select(self, V: torch.Tensor, choose: Any) -> torch.Tensor:
        """Top-down induced-tree selection ``(batch, n_nodes)`` bool; ``choose(vals, L)`` returns
        the chosen local edge index per (sample, sum node) of layer ``L``."""
        B = V.shape[0]
        sel = torch.zeros(B, self.n_nodes, dtype=torch.bool)
        sel[:, self.root_index] = True
        for L in reversed(self.layers):
            if L.s1 > L.s0:
                vals = V[:, L.sum_child] + self.log_weights[L.e0:L.e1]
                arg = choose(vals, L).clamp_max(L.e1 - L.e0 - 1)
                active = sel[:, L.s0:L.s1]
                rows, s = torch.nonzero(active, as_tuple=True)
                sel[rows, L.sum_child[arg[rows, s]]] = True
            if L.p1 > L.p0:
                rows, e = torch.nonzero(sel[:, L.p0 + L.prod_parent], as_tuple=True)
                sel[rows, L.prod_child[e]] = True
        return sel

    @torch.no_grad()
    def mpe(self, x: Any) -> np.ndarray:
        """Max-product completion: NaN entries of ``x`` filled, observed ones kept. ``(batch, n_vars)``.

        Exact MPE for selective (deterministic) circuits; otherwise the usual Viterbi
        approximation (the assignment of the best induced tree).
        """
        t = self.as_input(x)
        out = t.clone()
        for c in self._chunks(t.shape[0]):
            V = self.forward(t[c], MAX_PRODUCT)
            sel = self._select(V, lambda vals, L: segment_argmax(
                vals, L.sum_parent, L.s1 - L.s0, V[:, L.s0:L.s1]))
            sub = out[c]
            for g in self.groups:
                rows, j = torch.nonzero(sel[:, g.start:g.stop], as_tuple=True)
                cols = g.cols[j]
                cur = sub[rows, cols]
                sub[rows, cols] = torch.where(torch.isnan(cur), g.cls.batch_mode(g.P).to(self.dtype)[j], cur)
            out[c] = sub
        return out.numpy().astype(np.float64)

    @torch.no_grad()
    def sample(self, n: int, rng: np.random.Generator, evidence: Any | None = None) -> np.ndarray:
        """``n`` samples ``(n, n_vars)``; with ``evidence`` (NaN = free) from ``p(free | evidence)``.

        Sum nodes pick a child with probability ``w_c p(e | c) / p(e | sum)`` (Gumbel-max with
        noise from ``rng``), so evidence is respected exactly; observed entries are copied.
        """
        if evidence is None:
            ev = torch.full((n, len(self.scope)), float("nan"), dtype=self.dtype)
        else:
            ev = self.as_input(evidence)
            if ev.shape[0] != n:
                raise UserError(f"sample: evidence has {ev.shape[0]} rows, n={n}")
        out = ev.clone()
        for c in self._chunks(n):
            V = self.forward(ev[c])
            B = V.shape[0]

            def choose(vals: torch.Tensor, L: Layer) -> torch.Tensor:
                u = torch.as_tensor(rng.random(vals.shape), dtype=self.dtype).clamp(1e-300, 1.0)
                noisy = vals - V[:, L.s0 + L.sum_parent] - torch.log(-torch.log(u))
                best = torch.full((B, L.s1 - L.s0), -torch.inf, dtype=self.dtype).scatter_reduce(
                    1, L.sum_parent.expand(B, -1), noisy, reduce="amax", include_self=True)
                return segment_argmax(noisy, L.sum_parent, L.s1 - L.s0, best)

            sel = self._select(V, choose)
            sub = out[c]
            for g in self.groups:
                rows, j = torch.nonzero(sel[:, g.start:g.stop], as_tuple=True)
                cols = g.cols[j]
                draw = torch.as_tensor(g.cls.batch_sample(g.P, j.numpy(), rng), dtype=self.dtype)
                cur = sub[rows, cols]
                sub[rows, cols] = torch.where(torch.isnan(cur), draw, cur)
            out[c] = sub
        return out.numpy().astype(np.float64)

    # ------------------------------------------------------------------ conditional queries

    @torch.no_grad()
    def conditional(self, x: Any, query_vars: Sequence[int]) -> torch.Tensor:
        """``log p(x_q | x_e)`` ``(batch,)``: joint minus the marginal with the query columns
        set to NaN. ``query_vars`` are variable ids (entries of :attr:`scope`)."""
        t = self.as_input(x)
        cols = self._cols(query_vars)
        m = t.clone()
        m[:, cols] = float("nan")
        return self.log_likelihood(t) - self.log_likelihood(m)

    def _cols(self, variables: Sequence[int]) -> list[int]:
        try:
            return [self.scope.index(int(v)) for v in variables]
        except ValueError:
            raise UserError(f"query variables {list(variables)} not all in scope {self.scope}") from None

    def support(self, var: int) -> np.ndarray:
        """Finite support of discrete variable ``var`` (union over its leaves)."""
        (col,) = self._cols([var])
        vals: set[float] = set()
        for g in self.groups:
            for i in torch.nonzero(g.cols == col).reshape(-1).tolist():
                P = {k: v[i:i + 1] for k, v in g.P.items()}
                name = g.cls.type_name
                if name == "bernoulli":
                    vals.update((0.0, 1.0))
                elif name == "categorical":
                    vals.update(float(k) for k in range(int(P["len_probs"][0])))
                elif name == "histogram" and float(P["discrete"][0]) > 0:
                    br = P["breaks"][0, : int(P["len_breaks"][0])].numpy()
                    vals.update(float(k) for k in br[:-1])
                elif name == "discretized_gaussian":
                    vals.update(float(k) for k in range(int(P["levels"][0])))
                else:
                    raise UserError(f"predict: variable {var} has a continuous {name} leaf")
        return np.array(sorted(vals))

    @torch.no_grad()
    def predict_proba(self, x: Any, target: int) -> tuple[np.ndarray, np.ndarray]:
        """``p(target = c | other observed entries)`` for every class ``c``.

        One batched pass over ``batch * n_classes`` rows. The target column of ``x`` is ignored.

        Returns:
            ``(classes (k,), probs (batch, k))``.
        """
        t = self.as_input(x)
        classes = self.support(target)
        (col,) = self._cols([target])
        B, k = t.shape[0], len(classes)
        rep = t.repeat_interleave(k, 0)
        rep[:, col] = torch.as_tensor(classes, dtype=self.dtype).repeat(B)
        ll = self.log_likelihood(rep).view(B, k)
        return classes, torch.softmax(ll, 1).numpy()

    def predict(self, x: Any, target: int) -> np.ndarray:
        """Most probable class of ``target`` per sample ``(batch,)``."""
        classes, p = self.predict_proba(x, target)
        return classes[p.argmax(1)]

    # ------------------------------------------------------------------ EM

    @torch.no_grad()
    def em_statistics(self, x: Any, sample_weight: Any | None = None) -> CircuitStats:
        """Expected counts by one upward and one downward (flow) pass; ``sample_weight`` ``(batch,)``."""
        t = self.as_input(x)
        B = t.shape[0]
        sw = torch.ones(B, dtype=self.dtype) if sample_weight is None else torch.as_tensor(
            np.asarray(sample_weight, dtype=np.float64), dtype=self.dtype).reshape(-1)
        if sw.shape[0] != B or not bool(torch.all(torch.isfinite(sw) & (sw >= 0))):
            raise UserError(f"em_statistics: sample_weight must be ({B},), finite and >= 0")
        edge = torch.zeros(self.n_edges, dtype=self.dtype)
        leaf: list[dict[str, torch.Tensor]] = []
        ll = 0.0
        for c in self._chunks(B):
            V = self.forward(t[c])
            w = sw[c]
            ll += float((w * V[:, self.root_index]).sum())
            F = torch.zeros_like(V)
            F[:, self.root_index] = w
            for L in reversed(self.layers):
                if L.s1 > L.s0:
                    vals = V[:, L.sum_child] + self.log_weights[L.e0:L.e1]
                    parent = L.s0 + L.sum_parent
                    # Posterior of each child given the sample; <= 1, clamp guards impossible rows.
                    ef = F[:, parent] * torch.exp((vals - V[:, parent]).clamp_max(0.0))
                    edge[L.e0:L.e1] += ef.sum(0)
                    F.index_add_(1, L.sum_child, ef)
                if L.p1 > L.p0:
                    F.index_add_(1, L.prod_child, F[:, L.p0 + L.prod_parent])
            for gi, g in enumerate(self.groups):
                st = g.cls.batch_em_stats(g.P, t[c][:, g.cols], F[:, g.start:g.stop])
                if gi >= len(leaf):
                    leaf.append(st)
                else:
                    leaf[gi] = {k: leaf[gi][k] + v for k, v in st.items()}
        if not leaf:
            leaf = [g.cls.batch_em_stats(g.P, t[:0][:, g.cols], torch.zeros(0, g.stop - g.start, dtype=self.dtype))
                    for g in self.groups]
        return CircuitStats(edge.double().numpy().copy(),
                            [{k: v.double().numpy().copy() for k, v in d.items()} for d in leaf],
                            ll, float(sw.sum()))

    @torch.no_grad()
    def apply_em(self, stats: CircuitStats, step_size: float = 1.0, sum_alpha: float = 0.0) -> None:
        """M-step: sum weights ``(counts + sum_alpha) / total`` and each leaf type's update,
        mixed as ``(1 - step_size) * old + step_size * new``. Empty nodes keep their parameters."""
        if not 0.0 < step_size <= 1.0:
            raise UserError(f"apply_em: step_size must be in (0, 1], got {step_size}")
        if stats.edge_counts.shape != (self.n_edges,) or len(stats.leaf) != len(self.groups):
            raise UserError("apply_em: statistics do not match this circuit")
        if self.n_edges:
            cnt = torch.as_tensor(stats.edge_counts, dtype=torch.float64) + sum_alpha
            tot = torch.zeros(len(self.sum_nodes), dtype=torch.float64).index_add_(0, self.edge_sum, cnt)
            ok = (tot > MIN_FLOW)[self.edge_sum]
            new = cnt / torch.where(tot > MIN_FLOW, tot, torch.ones_like(tot))[self.edge_sum]
            old = self.weights.double()
            w = torch.where(ok, old + step_size * (new - old), old)
            # Renormalise against rounding so validate() keeps passing after many steps.
            w = w / torch.zeros_like(tot).index_add_(0, self.edge_sum, w)[self.edge_sum]
            self.weights = w.to(self.dtype)
            self._refresh_log_weights()
        for g, st in zip(self.groups, stats.leaf):
            if g.cls.em_trainable:
                tst = {k: torch.as_tensor(v, dtype=self.dtype) for k, v in st.items()}
                g.P = g.cls.batch_m_step(g.P, tst, step_size)
        self._graph_synced = False
        self._plan_state = None

    # ------------------------------------------------------------------ graph sync

    def sync_graph(self) -> Node:
        """Write the current (possibly EM-updated) parameters back into the graph; return root."""
        if not self._graph_synced:
            w = self.weights.double().numpy()
            e = 0
            for n in self.sum_nodes:
                k = len(n.children)
                n.weights = w[e:e + k].copy()
                e += k
            for g in self.groups:
                for node, lf in zip(g.nodes, g.cls.unstack(g.P)):
                    node.dist = lf
            self._graph_synced = True
        return self.root

    def num_parameters(self) -> int:
        """Sum-edge weights plus learnable leaf scalars."""
        total = self.n_edges
        for g in self.groups:
            for k in g.cls.learnable:
                total += int(g.P["len_" + k].sum()) if k in g.cls.ragged else g.stop - g.start
        return total
