"""Root-only queries of a whole federated circuit as one flat numpy program.

:mod:`mpifc.federated.evaluate` walks the federated circuit node by node and asks each client PC
for its likelihoods. For the questions that need the root's value only -- ``log p(x)``, marginals
and the class log-joints of a prediction -- :class:`FlatCircuit` lays the server's nodes and the
graphs of the client PCs that are circuits (:class:`~mpifc.circuit.spn.SPN`) out as one circuit
and evaluates it over a node-major buffer ``V`` ``(n_nodes, batch)``, one group of same-arity
nodes of one height at a time (Python loops over groups, never over nodes or rows):

* other client models (factorized PCs, decision trees, einets) are evaluated by their own
  ``log_likelihood``, as the reference does;
* a class query (``p(target = c, evidence)`` for every class ``c``) unrolls the nodes whose scope
  holds the target once per class, the target's leaves becoming constants; nodes without the
  target are evaluated once, as the reference's broadcast does.

**Coded columns.** A discrete column of ``k`` values has ``k + 1`` codes (the last: missing); a
real column whose leaves are all continuous histograms has one code per interval between
consecutive breaks of theirs that lies inside every body, plus missing (their values are
constant on each). A node whose scope holds coded columns only, of at most :data:`TABLE_LIMIT`
joint codes, is a table: its log-values at every joint code, computed once from its children's
tables with the node's own operation, so the rows of a batch read it with one ``take``. A row
holding a value without a code (outside a discrete column's domain, in a histogram's tail) is
evaluated by the log-space program below instead.

**Two programs.** The *linear* program reads the largest tables and evaluates the rest in linear
space: products multiply, sums add their weighted children (a sum's weight is folded into a
product child of which it is the only parent), and no ``exp``/``log`` is spent on inner nodes.
Leaves on other columns run their type's maths, once per distinct value of the batch when values
repeat. Linear space is exact to rounding where nothing underflows, which the pass checks per
row. Every node has an upper bound of its value (from :meth:`~mpifc.circuit.leaves.Leaf.np_log_bound`
and the tables). A product at or above :data:`TINY` times its bound has every factor and partial
product above the subnormal range; one below that floor is below it in truth too, so its error
is at most its floor; and a sum's underflowing terms cost at most ``2**-1074`` each. A row is
trusted when every root is at least :data:`TINY` and no product fell below its floor, or when
every root is at least its ``trust``: ``2**40`` times :data:`TINY` times its bound times its
number of paths to the nodes below it, so that all those errors together are below ``2**-40`` of
it. Any other row (and one holding a value without a code) is evaluated by the *log-space*
program: tables for single leaves only (a value without a code is passed to the leaf's type),
and per node the reference's operations (products add log-values, sums take a max-shifted
``logsumexp``). Either way the answers equal :func:`mpifc.federated.evaluate.log_likelihood`
and :func:`~mpifc.federated.evaluate.class_log_joint` up to floating-point rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpifc.circuit.graph import LeafNode, ProductNode, SumNode
from mpifc.circuit.leaves import LEAF_TYPES, LOG_ZERO, Gaussian, Histogram, Leaf
from mpifc.errors import UserError
from mpifc.federated.defaults import SEPARABLE_CLASSES  # noqa: F401 - also read here by callers
from mpifc.federated.evaluate import _model_ll
from mpifc.federated.structure import AVERAGE, LEAF, PRODUCT, SUM, FederatedCircuit

TINY = 2.0 ** -1000
"""The least trusted value of the linear program, per unit of a node's bound (see the module
docstring): 2**22 times the smallest normal float64."""

TABLE_LIMIT = 1 << 17
"""Most joint codes of a node evaluated as a table (1 MB of float64 per node)."""

TABLE_BUDGET = 1 << 21
"""Most table entries of a program (32 MB with their values and log-values); past it the limit
per node is lowered."""

CHUNK_ELEMS = 1 << 21
"""Rows are evaluated in chunks of about this many node values (16 MB in float64)."""

_REGISTERED = frozenset(LEAF_TYPES.values())

MIN_CHUNK_ROWS = 256
MAX_CHUNK_ROWS = 2048


MAX_TERMS = 1 << 16
"""Most terms of :class:`_Terms`; a circuit with more is unrolled per class."""


# ------------------------------------------------------------------------ the circuit as a program
@dataclass
class _Leaf:
    """A univariate leaf of a client PC on global column ``col``."""

    dist: Leaf
    col: int


@dataclass
class _Model:
    """A client model evaluated by its own ``log_likelihood``: ``cols[j]`` is the global column of
    its column ``j`` (-1: never given); ``target`` its column of the expanded target (or -1);
    ``rows`` the program node of each class (one without expansion)."""

    model: Any
    cols: list[int]
    target: int
    rows: list[int] = field(default_factory=list)


@dataclass
class _Inner:
    """A product (``logw`` None; log-constant ``const`` added) or a sum (``logw`` per child)."""

    children: list[int]
    logw: np.ndarray | None = None
    const: float = 0.0


@dataclass
class _Coding:
    """A coded column: code ``c`` stands for the value ``at[c]`` (the last code: missing, NaN).
    Discrete: ``at`` is ``0 .. k-1``. Binned: code ``c`` is the interval
    ``[edges[first + c], edges[first + c + 1])``."""

    col: int
    at: np.ndarray
    edges: np.ndarray | None = None
    first: int = 0

    def codes(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per value its code, and whether it has one (``(b,)`` intp and bool)."""
        m = len(self.at) - 1
        missing = np.isnan(v)
        if self.edges is None:
            w = np.where(missing, m, v)
            with np.errstate(invalid="ignore"):
                code = w.astype(np.intp)
            ok = (code == w) & (code >= 0) & (code <= m)  # integers of the domain, or missing
            ok &= missing | (code < m)
            code[~ok] = 0
        else:
            code = np.searchsorted(self.edges, v, side="right") - 1 - self.first
            ok = missing | ((code >= 0) & (code < m))
            code = np.where(missing, m, np.where(ok, code, 0)).astype(np.intp)
        return code, ok


@dataclass
class _Table:
    """Program nodes over one coded scope ``cols`` (ascending), rows ``[start, stop)``: ``log``
    ``(n, size)`` their log-values per joint code ``sum(code[col] * stride)`` (``lin``: values);
    ``types`` ``(cls, params, start, stop)`` of single leaves, for values without a code."""

    cols: tuple[int, ...]
    strides: np.ndarray
    start: int
    stop: int
    log: np.ndarray
    lin: np.ndarray
    types: list[tuple[type[Leaf], dict, int, int]] = field(default_factory=list)


@dataclass
class _Group:
    """Leaves of one type on one column ``col`` read by their type's maths, rows
    ``[start, stop)``."""

    cls: type[Leaf]
    P: dict
    col: int
    start: int
    stop: int

    def values(self, v: np.ndarray, linear: bool) -> np.ndarray:
        """The leaves' log-values (``linear``: values) at ``v`` ``(m,)``, ``(n, m)``."""
        if linear and self.cls is Gaussian:  # exp of the log-density, as one product
            out = v[None, :] - self.P["mean"][:, None]
            out *= out
            out *= (-0.5 / self.P["var"])[:, None]
            np.exp(out, out=out)
            out *= np.exp(-0.5 * (np.log(2.0 * np.pi) + np.log(self.P["var"])))[:, None]
            out[:, np.isnan(v)] = 1.0  # a missing value is marginalised
            return out
        lp = self.cls.np_log_prob(self.P, np.repeat(v[:, None], self.stop - self.start, axis=1)).T
        return np.exp(lp) if linear else lp

    def read(self, v: np.ndarray, V: np.ndarray, linear: bool) -> None:
        """Their values at the batch's column ``v`` into their rows, each distinct value once
        when values repeat (a count, an age)."""
        u, inv = np.unique(v, return_inverse=True)
        if 4 * len(u) <= len(v):
            np.take(self.values(u, linear), inv, axis=1, out=V[self.start:self.stop], mode="clip")
        else:
            V[self.start:self.stop] = self.values(v, linear)


@dataclass
class _Op:
    """Nodes of one kind, height and arity, rows ``[start, stop)``: children ``idx`` ``(n, a)``.

    Products: log-constants ``const`` ``(n, 1)`` (``scale``: their values) or None; ``floor``:
    the least value the linear program trusts in the group. Sums: ``logw``/``w`` ``(n, a)``
    (``w`` None where every weight is folded into its child).
    """

    product: bool
    start: int
    stop: int
    idx: np.ndarray
    const: np.ndarray | None = None
    scale: np.ndarray | None = None
    floor: float = 0.0
    logw: np.ndarray | None = None
    w: np.ndarray | None = None


@dataclass
class _Program:
    """One layout of the program (see :func:`_compile`)."""

    tables: list[_Table]
    groups: list[_Group]
    const_start: int
    consts: np.ndarray
    models: list[tuple[_Model, int]]
    model_stop: int
    ops: list[_Op]
    roots: np.ndarray
    n_nodes: int
    trust: np.ndarray
    coded: tuple[int, ...]

    def chunk_rows(self) -> int:
        return int(min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, CHUNK_ELEMS // max(1, self.n_nodes))))


class FlatCircuit:
    """Root values of a federated circuit (with its client models) for a batch of rows.

    Args:
        fc: a validated federated circuit whose leaves hold their models.
        target: unroll the nodes whose scope holds this discrete feature over its classes
            (class log-joints); None: one root value per row.

    Rows ``x`` are ``(batch, len(fc.features))`` in model units and ``fc.features`` order; NaN =
    missing (marginalised). The target's column is ignored when ``target`` is set.
    """

    def __init__(self, fc: FederatedCircuit, target: str | None = None,
                 terms_of: list[int] | None = None) -> None:
        self.features = tuple(fc.features)
        self.target = target
        col_of = {f: j for j, f in enumerate(self.features)}
        self.n_classes = 1
        if target is not None:
            if target not in col_of:
                raise UserError(f"target {target!r} is not a feature of the circuit")
            self.n_classes = int(fc.n_categories.get(target, 0) or 0)
            if self.n_classes < 2:
                raise UserError(f"target {target!r} is not discrete (n_categories={self.n_classes}); "
                                f"conditionals need classes")
        self.node_terms: dict[int, _Terms] = {}
        if terms_of is None:
            nodes, roots, models, self._terms = _unroll(fc, col_of, target, self.n_classes,
                                                        separable=self.n_classes >= SEPARABLE_CLASSES)
        else:  # the program's roots: the factors of the given nodes' terms (row_terms)
            if target is None:
                raise UserError("class terms need a target")
            nodes, _, models, found = _unroll(fc, col_of, target, self.n_classes, terms_of=terms_of)
            ids = [nid for nid in terms_of if found[nid] is not None]
            roots, made = _Terms.of_many([found[nid] for nid in ids], nodes, self.n_classes)
            self.node_terms = dict(zip(ids, made))
            self._terms = None
        if (self._terms is not None or terms_of is not None) and not roots:  # every term a constant: one root of log 1
            nodes.append(0.0)
            roots = [len(nodes) - 1]
        self.codings = _codings(nodes, {col_of[f]: int(k) for f, k in fc.n_categories.items()
                                        if f in col_of and k and fc.meta_types.get(f) != "real"})
        self._parts = (nodes, roots, models, _leaf_tables(nodes, self.codings))
        self._linear = _compile(*self._parts[:3], self.codings, self._parts[3], tabulate=True)
        self._log_program: _Program | None = None

    @property
    def _log(self) -> _Program:
        """The log-space program, compiled when a row first needs it."""
        if self._log_program is None:
            nodes, roots, models, leaf_tables = self._parts
            self._log_program = _compile(nodes, roots, models, self.codings, leaf_tables, tabulate=False)
        return self._log_program

    def root_values(self, x: np.ndarray) -> np.ndarray:
        """Root log-values ``(batch, n_classes)`` (``(batch, 1)`` without a target), nats."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise UserError(f"input has shape {x.shape}, expected (batch, {len(self.features)}) over "
                            f"{list(self.features)}")
        B = x.shape[0]
        out = np.empty((B, self.n_classes if self._terms is not None else len(self._linear.roots)))
        step = self._linear.chunk_rows()
        V = np.empty((self._linear.n_nodes, min(step, max(B, 1))))
        W = None
        linear = True
        for lo in range(0, B, step):
            xt = np.ascontiguousarray(x[lo:lo + step].T)
            b = xt.shape[1]
            codes = {c.col: c.codes(xt[c.col]) for c in self.codings.values()}
            vals = np.empty((b, len(self._linear.roots)))
            if linear:
                root, ok = _linear_pass(self._linear, xt, codes, V[:, :b])
                with np.errstate(divide="ignore"):
                    vals[:] = np.log(root).T
                bad = np.flatnonzero(~ok)
                linear = len(bad) <= b // 2  # mostly underflowing rows: log space from here on
            else:
                bad = np.arange(b)
            if len(bad):
                if W is None:
                    W = np.empty((self._log.n_nodes, step))
                sub = np.ascontiguousarray(xt[:, bad])
                sub_codes = {c: (code[bad], ok[bad]) for c, (code, ok) in codes.items()}
                vals[bad] = _log_pass(self._log, sub, sub_codes, W[:, :len(bad)]).T
            out[lo:lo + b] = vals if self._terms is None else self._terms.joint(vals)
        return out

    def row_terms(self, x: np.ndarray) -> dict[int, np.ndarray]:
        """With ``terms_of``: per node given there whose class query has the form of
        :class:`_Terms` (:attr:`node_terms`), its row terms ``a_i(x)`` ``(batch, n_terms)``;
        ``logsumexp_i (a_i(x) + node_terms[nid].logt[i, c])`` is its ``log p(target = c, x)``."""
        values = self.root_values(x)
        padded = np.concatenate([values, np.zeros((len(values), 1))], axis=1)  # the last column: no factor
        return {nid: t.padded_rows(padded) for nid, t in self.node_terms.items()}


@dataclass
class _Terms:
    """A class query's root as a sum of terms, each a function of the row times one of the
    class: ``log p(target = c, x) = logsumexp_i (a_i(x) + t_i(c))``, with ``a_i`` the constant
    ``const[i]`` plus the log-values of the program roots ``idx[i]`` (index ``n_roots``: none)
    and ``t_i(c)`` = ``logt[i, c]``. A circuit whose target sits in one child of every product
    and in every child of every sum over it has this form: each term is one path from the root
    to a leaf of the target, ``a_i`` the weights on it and the other children of its products,
    ``t_i`` that leaf's log-probability of each class. So one upward pass over the nodes without
    the target and one matrix product give every class at once (the class glue: one term per
    class PC), where unrolling per class costs classes times the nodes over the target.

    The matrix product runs in linear space, each row shifted by its largest ``a_i`` and each
    class by its largest ``t_i``; an entry below :attr:`floor` (where terms lost to underflow
    could matter: each loses at most ``2**-1074``) is computed again in log space over the terms
    whose ``t_i(c)`` is not ``-inf``, so every entry equals the per-class unrolling up to
    floating-point rounding."""

    const: np.ndarray
    idx: np.ndarray
    logt: np.ndarray
    n_roots: int
    scale: np.ndarray = field(init=False)
    shift: np.ndarray = field(init=False)
    ptr: np.ndarray = field(init=False)
    ind: np.ndarray = field(init=False)
    floor: float = field(init=False)

    def __post_init__(self) -> None:
        top = self.logt.max(axis=0)
        self.shift = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(under="ignore"):
            self.scale = np.exp(self.logt - self.shift)
        self.floor = len(self.const) * 2.0 ** -960
        live = self.logt.T > -np.inf  # per class, its terms
        self.ptr = np.concatenate([[0], np.cumsum(live.sum(axis=1))])
        self.ind = np.nonzero(live)[1]

    @classmethod
    def of(cls, found: list[tuple[float, list[int], np.ndarray]], nodes: list[Any],
           n_classes: int) -> tuple[list[int], _Terms]:
        """The program roots (the terms' non-constant factors, distinct) and the terms."""
        roots, (terms,) = cls.of_many([found], nodes, n_classes)
        return roots, terms

    @classmethod
    def of_many(cls, founds: list[list[tuple[float, list[int], np.ndarray]]], nodes: list[Any],
                n_classes: int) -> tuple[list[int], list[_Terms]]:
        """:meth:`of` for several roots' terms over one program: its roots are the distinct
        non-constant factors of them all."""
        roots: dict[int, int] = {}
        parts = []
        for found in founds:
            const, rows = [], []
            for k, factors, _ in found:
                k += sum(nodes[f] for f in factors if isinstance(nodes[f], float))
                rows.append([roots.setdefault(f, len(roots)) for f in factors if not isinstance(nodes[f], float)])
                const.append(k)
            parts.append((found, const, rows))
        out = []
        for found, const, rows in parts:
            width = max([len(r) for r in rows] + [1])
            idx = np.full((len(rows), width), len(roots), dtype=np.intp)
            for i, r in enumerate(rows):
                idx[i, :len(r)] = r
            logt = np.stack([t for _, _, t in found]).reshape(len(found), n_classes)
            out.append(cls(np.asarray(const, dtype=np.float64), idx, logt, len(roots)))
        return list(roots), out

    @classmethod
    def given(cls, logt: np.ndarray) -> _Terms:
        """Terms whose row terms are given as they are (:meth:`joint` of ``a`` ``(b, n_terms)``)."""
        n = logt.shape[0]
        return cls(np.zeros(n), np.arange(n, dtype=np.intp)[:, None], logt, n)

    def rows(self, values: np.ndarray) -> np.ndarray:
        """The row terms ``a_i`` ``(b, n_terms)`` from the roots' log-values ``(b, n_roots)``."""
        return self.padded_rows(np.concatenate([values, np.zeros((len(values), 1))], axis=1))

    def padded_rows(self, padded: np.ndarray) -> np.ndarray:
        """:meth:`rows` from the roots' log-values followed by a column of zeros."""
        if self.idx.shape[1] == 1:
            return padded[:, self.idx[:, 0]] + self.const
        return padded[:, self.idx].sum(axis=2) + self.const

    def joint(self, values: np.ndarray) -> np.ndarray:
        """``(b, n_classes)`` log-joints from the roots' log-values ``values`` ``(b, n_roots)``."""
        b = values.shape[0]
        out = np.empty((b, self.logt.shape[1]))
        step = max(1, CHUNK_ELEMS // max(1, self.idx.size))
        for lo in range(0, b, step):
            v = values[lo:lo + step]
            a = self.rows(v)
            top = a.max(axis=1, keepdims=True)
            top[~np.isfinite(top)] = 0.0
            with np.errstate(under="ignore", divide="ignore", invalid="ignore"):
                lin = np.exp(a - top) @ self.scale
                part = np.log(lin) + top + self.shift
            r, c = np.nonzero(~(lin >= self.floor))
            if len(r):
                part[r, c] = self._exact(a, r, c)
            out[lo:lo + len(v)] = part
        return out

    def _exact(self, a: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Entries ``(r, c)`` in log space: ``logsumexp`` over class ``c``'s terms."""
        out = np.full(len(r), -np.inf)
        lens = self.ptr[c + 1] - self.ptr[c]
        step = max(1, CHUNK_ELEMS // max(1, int(lens.max(initial=1))))
        for lo in range(0, len(r), step):
            rr, cc, ll = r[lo:lo + step], c[lo:lo + step], lens[lo:lo + step]
            has = ll > 0
            if not has.any():
                continue
            seg = np.repeat(np.arange(len(rr)), ll)
            first = np.cumsum(ll) - ll
            ti = self.ind[np.repeat(self.ptr[cc], ll) + np.arange(int(ll.sum())) - np.repeat(first, ll)]
            v = a[rr[seg], ti] + self.logt[ti, cc[seg]]
            top = np.maximum.reduceat(v, first[has])
            top[~np.isfinite(top)] = 0.0
            with np.errstate(under="ignore", divide="ignore"):
                total = np.add.reduceat(np.exp(v - np.repeat(top, ll[has])), first[has])
                out[lo + np.flatnonzero(has)] = np.log(total) + top
        return out


# ------------------------------------------------------------------------------------ building
def _unroll(fc: FederatedCircuit, col_of: dict[str, int], target: str | None,
            n_classes: int, separable: bool = False, terms_of: list[int] | None = None
            ) -> tuple[list[Any], list[int], list[_Model], Any]:
    """The program's nodes (children first), the root of each class and the client models that
    are not circuits. Constant children of a product are folded into its ``const``.

    ``separable``: instead of a root per class, the root as :class:`_Terms` over the program's
    roots (its factors), or ``None`` for the terms when the circuit is not of that form (a client
    model holding the target that is not a circuit, a product with the target in two children,
    more than :data:`MAX_TERMS` terms).

    ``terms_of``: no roots; the last item is, per node id given, its terms (the found list of
    :meth:`_Terms.of_many`) or None where it has not that form."""
    tcol = -1 if target is None else col_of[target]
    classes: list[int | None] = list(range(n_classes)) if target is not None else [None]
    nodes: list[Any] = []
    memo: dict[tuple, int] = {}
    models: list[_Model] = []

    def emit(node: Any) -> int:
        nodes.append(node)
        return len(nodes) - 1

    def const(value: float) -> int:
        if ("const", value) not in memo:
            memo[("const", value)] = emit(value)
        return memo[("const", value)]

    def product(kids: list[int]) -> int:
        consts = [ch for ch in kids if isinstance(nodes[ch], float)]
        if consts and len(consts) < len(kids):
            return emit(_Inner([ch for ch in kids if ch not in consts], const=float(sum(nodes[ch] for ch in consts))))
        return emit(_Inner(kids))

    def graph_node(fid: int, g: Any, cols: dict[int, int], c: int | None) -> int:
        if c is not None and not any(cols[v] == tcol for v in g.scope):
            c = None
        key = (fid, id(g), c)
        if key in memo:
            return memo[key]
        if isinstance(g, LeafNode):
            if type(g.dist) not in _REGISTERED:
                raise UserError(f"{g.name}: leaf type {type(g.dist).__name__} is not registered in "
                                f"mpifc.circuit.leaves.LEAF_TYPES")
            col = cols[g.var]
            if c is not None or col < 0:  # the target's leaf at class c, or a column never given
                cls = type(g.dist)
                value = np.nan if c is None else float(c)
                out = const(float(cls.np_log_prob(cls.stack_numpy([g.dist]), np.array([[value]]))[0, 0]))
            else:
                out = emit(_Leaf(g.dist, col))
        elif isinstance(g, ProductNode):
            out = product([graph_node(fid, ch, cols, c) for ch in g.children])
        elif isinstance(g, SumNode):
            with np.errstate(divide="ignore"):  # as the client PC's own evaluator
                logw = np.maximum(np.log(np.asarray(g.weights, dtype=np.float64)), LOG_ZERO)
            out = emit(_Inner([graph_node(fid, ch, cols, c) for ch in g.children], logw))
        else:
            raise UserError(f"{g.name}: unknown circuit node type {type(g).__name__}")
        memo[key] = out
        return out

    def fc_node(nid: int, c: int | None) -> int:
        n = fc.nodes[nid]
        if c is not None and target not in n.scope:
            c = None
        key = ("fc", nid, c)
        if key in memo:
            return memo[key]
        if n.op == LEAF:
            model = n.leaf.model
            if model is None:
                raise UserError(f"leaf node {nid} (client {n.leaf.client}) has no model on this rank")
            lcols = [col_of.get(f, -1) for f in n.leaf.features]
            root = _circuit_root(model)
            if root is not None:
                out = graph_node(nid, root, {v: lcols[j] for j, v in enumerate(model.scope)}, c)
            else:
                if ("model", nid) not in memo:
                    m = _Model(model, lcols, lcols.index(tcol) if c is not None else -1)
                    m.rows = [emit(m) for _ in (classes if c is not None else [None])]
                    models.append(m)
                    memo[("model", nid)] = len(models) - 1
                out = models[memo[("model", nid)]].rows[0 if c is None else c]
        elif n.op in (PRODUCT, SUM, AVERAGE):
            kids = [fc_node(ch, c) for ch in n.children]
            if n.op == PRODUCT:
                out = product(kids)
            else:
                with np.errstate(divide="ignore"):  # as the reference's logsumexp
                    logw = (np.log(np.asarray(n.weights, dtype=np.float64)) if n.op == SUM
                            else np.full(len(kids), -np.log(len(kids))))
                out = emit(_Inner(kids, logw))
        else:
            raise UserError(f"node {nid}: cannot evaluate op {n.op!r}")
        memo[key] = out
        return out

    def graph_terms(fid: int, g: Any, cols: dict[int, int]) -> list[tuple[float, list[int], np.ndarray]] | None:
        if isinstance(g, LeafNode):  # the target's own leaf: its log-probability of every class
            cls = type(g.dist)
            at = np.arange(n_classes, dtype=np.float64)[:, None]
            return [(0.0, [], np.asarray(cls.np_log_prob(cls.stack_numpy([g.dist]), at), dtype=np.float64)[:, 0])]
        holds = [ch for ch in g.children if any(cols[v] == tcol for v in ch.scope)]
        if isinstance(g, ProductNode):
            if len(holds) != 1:
                return None
            rest = [graph_node(fid, ch, cols, None) for ch in g.children if ch is not holds[0]]
            inner = graph_terms(fid, holds[0], cols)
            return None if inner is None else [(k, f + rest, t) for k, f, t in inner]
        if isinstance(g, SumNode) and len(holds) == len(g.children):
            with np.errstate(divide="ignore"):  # as the client PC's own evaluator
                logw = np.maximum(np.log(np.asarray(g.weights, dtype=np.float64)), LOG_ZERO)
            return mix([graph_terms(fid, ch, cols) for ch in g.children], logw)
        return None

    def mix(parts: list[Any], logw: np.ndarray) -> list[tuple[float, list[int], np.ndarray]] | None:
        if any(p is None for p in parts) or sum(len(p) for p in parts) > MAX_TERMS:
            return None
        return [(k + float(w), f, t) for p, w in zip(parts, logw) if w > -np.inf for k, f, t in p]

    def fc_terms(nid: int) -> list[tuple[float, list[int], np.ndarray]] | None:
        n = fc.nodes[nid]
        if n.op == LEAF:
            root = _circuit_root(n.leaf.model)
            if root is None:
                return None
            lcols = [col_of.get(f, -1) for f in n.leaf.features]
            return graph_terms(nid, root, {v: lcols[j] for j, v in enumerate(n.leaf.model.scope)})
        holds = [ch for ch in n.children if target in fc.nodes[ch].scope]
        if n.op == PRODUCT:
            if len(holds) != 1:
                return None
            rest = [fc_node(ch, None) for ch in n.children if ch != holds[0]]
            inner = fc_terms(holds[0])
            return None if inner is None else [(k, f + rest, t) for k, f, t in inner]
        if n.op in (SUM, AVERAGE) and len(holds) == len(n.children):
            with np.errstate(divide="ignore"):
                logw = (np.log(np.asarray(n.weights, dtype=np.float64)) if n.op == SUM
                        else np.full(len(n.children), -np.log(len(n.children))))
            return mix([fc_terms(ch) for ch in n.children], logw)
        return None

    if terms_of is not None:
        return nodes, [], models, {nid: fc_terms(nid) if target in fc.nodes[nid].scope else None
                                   for nid in terms_of}
    if separable and target is not None and target in fc.nodes[fc.root].scope:
        found = fc_terms(fc.root)
        if found is not None:
            roots, terms = _Terms.of(found, nodes, n_classes)
            return nodes, roots, models, terms
        nodes.clear(), memo.clear(), models.clear()
    roots = [fc_node(fc.root, c) for c in classes]
    return nodes, roots, models, None


def _circuit_root(model: Any) -> Any:
    """The graph of a client PC that is a circuit, else None."""
    from mpifc.circuit.spn import SPN

    return model.root if isinstance(model, SPN) else None


def _binned_leaf(n: Any) -> bool:
    return isinstance(n, _Leaf) and type(n.dist) is Histogram and not float(n.dist._p["discrete"])


def _finite_domain(dist: Leaf) -> int:
    """The number of values ``0 .. k-1`` a leaf of a finite domain puts its mass on, else 0."""
    name = dist.type_name
    if name == "bernoulli":
        return 2
    if name == "categorical":
        return int(dist._p["probs"].size)
    return 0


def _codings(nodes: list[Any], domain: dict[int, int]) -> dict[int, _Coding]:
    """The coded columns: discrete ones (``domain``: their number of values), columns whose
    leaves all have a finite domain, and real ones whose leaves are all continuous histograms
    with an interval inside every body."""
    leaves: dict[int, list[Leaf]] = {}
    for n in nodes:
        if isinstance(n, _Leaf):
            leaves.setdefault(n.col, []).append(n)
    domain = dict(domain)
    for col, mine in leaves.items():
        sizes = [_finite_domain(n.dist) for n in mine]
        if col not in domain and min(sizes) > 0:
            domain[col] = max(sizes)
    out = {col: _Coding(col, np.append(np.arange(k, dtype=np.float64), np.nan)) for col, k in domain.items()}
    for col, mine in leaves.items():
        if col in domain or not all(_binned_leaf(n) for n in mine):
            continue
        breaks = [n.dist._p["breaks"] for n in mine]
        edges = np.unique(np.concatenate(breaks))
        first = int(max(np.searchsorted(edges, b[0]) for b in breaks))
        last = int(min(np.searchsorted(edges, b[-1]) for b in breaks))
        if last > first:
            out[col] = _Coding(col, np.append(edges[first:last], np.nan), edges, first)
    return out


def _coded(n: Any, codings: dict[int, _Coding]) -> bool:
    """Whether a leaf's value is a function of its column's code."""
    c = codings.get(n.col)
    return c is not None and (c.edges is None or _binned_leaf(n))


def _leaf_tables(nodes: list[Any], codings: dict[int, _Coding]) -> dict[int, np.ndarray]:
    """Each coded leaf's log-values at its column's codes, by its type's maths (per column and
    type in one call)."""
    out: dict[int, np.ndarray] = {}
    by: dict[tuple[int, type], list[int]] = {}
    for i, n in enumerate(nodes):
        if isinstance(n, _Leaf) and _coded(n, codings):
            by.setdefault((n.col, type(n.dist)), []).append(i)
    for (col, cls), mine in by.items():
        at = codings[col].at
        lp = cls.np_log_prob(cls.stack_numpy([nodes[i].dist for i in mine]), np.repeat(at[:, None], len(mine), axis=1))
        for j, i in enumerate(mine):
            out[i] = np.ascontiguousarray(lp[:, j])
    return out


def _scopes(nodes: list[Any], codings: dict[int, _Coding],
            order: list[int] | None = None) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """Per node (visited in ``order``, children first): its columns (ascending), its number of
    joint codes (inf if not coded) and whether its value is a function of its columns' codes."""
    N = len(nodes)
    scope: list[tuple[int, ...]] = [()] * N
    size = np.ones(N)
    codable = np.zeros(N, dtype=bool)
    for i in order if order is not None else range(N):
        n = nodes[i]
        if isinstance(n, _Leaf):
            scope[i] = (n.col,)
            codable[i] = _coded(n, codings)
            size[i] = len(codings[n.col].at) if codable[i] else math.inf
        elif isinstance(n, float):
            codable[i] = True
        elif isinstance(n, _Model):
            size[i] = math.inf
        else:
            scope[i] = tuple(sorted(set().union(*(scope[ch] for ch in n.children))))
            codable[i] = all(codable[ch] for ch in n.children)
            size[i] = math.prod(len(codings[c].at) for c in scope[i]) if codable[i] else math.inf
    return scope, size, codable


def _pack_tables(nodes: list[Any], scope: list[tuple[int, ...]], size: np.ndarray,
                 codable: np.ndarray, limit: int) -> tuple[list[Any], list[int]]:
    """The nodes with the table-sized children of every larger product packed into
    sub-products of at most ``limit`` joint codes (first fit, largest first), which become
    tables; and an order that visits children first. The given nodes are not changed."""
    small = codable & (size <= limit) & np.array([len(s) > 0 for s in scope])
    out = list(nodes)
    order: list[int] = []
    for i, n in enumerate(nodes):
        if isinstance(n, _Inner) and n.logw is None and not small[i]:
            kids = sorted((ch for ch in n.children if small[ch]), key=lambda ch: -size[ch])
            packs: list[list[int]] = []
            room: list[float] = []
            for ch in kids:
                for k, r in enumerate(room):
                    if size[ch] <= r:
                        packs[k].append(ch)
                        room[k] = r / size[ch]
                        break
                else:
                    packs.append([ch])
                    room.append(limit / size[ch])
            packs = [sorted(p) for p in packs if len(p) > 1]
            if packs:
                packed = {ch for p in packs for ch in p}
                new = []
                for p in packs:
                    out.append(_Inner(p))
                    new.append(len(out) - 1)
                    order.append(len(out) - 1)
                out[i] = _Inner([ch for ch in n.children if ch not in packed] + new, const=n.const)
        order.append(i)
    return out, order


def _plan(nodes: list[Any], roots: list[int], codings: dict[int, _Coding], limit: int) -> tuple[
        list[Any], list[int], list[tuple[int, ...]], np.ndarray, np.ndarray, list[int]]:
    """Which nodes are tables (``limit`` joint codes at most; 0: single coded leaves only), with
    table-sized children of larger products packed (:func:`_pack_tables`); and which nodes the
    program evaluates (from the roots down to the first table on each path), with their number
    of parents among them. Returns ``(nodes, order, scope, table, live, parents)``."""
    scope, size, codable = _scopes(nodes, codings)
    order = list(range(len(nodes)))
    if limit:
        nodes, order = _pack_tables(nodes, scope, size, codable, limit)
        scope, size, codable = _scopes(nodes, codings, order)
        table = codable & (size <= limit) & np.array([len(s) > 0 for s in scope])
    else:
        table = np.array([isinstance(n, _Leaf) and bool(codable[i]) for i, n in enumerate(nodes)], dtype=bool)
    N = len(nodes)
    live = np.zeros(N, dtype=bool)
    parents = [0] * N
    stack = list(roots)
    while stack:
        i = stack.pop()
        if live[i]:
            continue
        live[i] = True
        if isinstance(nodes[i], _Inner) and not table[i]:
            for ch in nodes[i].children:
                parents[ch] += 1
                stack.append(ch)
    for r in roots:
        parents[r] += 1
    return nodes, order, scope, table, live, parents


def _compile(nodes: list[Any], roots: list[int], models: list[_Model], codings: dict[int, _Coding],
             leaf_tables: dict[int, np.ndarray], tabulate: bool) -> _Program:
    """The buffer layout and the operations of one program.

    ``tabulate``: the linear program (tables as large as :data:`TABLE_LIMIT` allows, sums'
    weights folded into products, floors); else the log-space one (tables of single leaves).
    Rows: tables, leaf groups, constants, models, then per height the products and the sums,
    grouped by arity.
    """
    limit = TABLE_LIMIT if tabulate else 0
    while True:  # the largest tables within the budget
        planned = _plan(nodes, roots, codings, limit)
        scope, table, live = planned[2], planned[3], planned[4]
        if limit <= 64 or sum(math.prod(len(codings[c].at) for c in scope[i])
                              for i in np.flatnonzero(live & table)) <= TABLE_BUDGET:
            break
        limit //= 8
    nodes, order, scope, table, live, parents = planned
    N = len(nodes)

    pos = np.full(N, -1, dtype=np.int64)
    bound = np.zeros(N)  # per node, an upper bound of its log-value as held in V, at least 0
    nxt = 0

    def place(items: list[int]) -> int:
        nonlocal nxt
        start = nxt
        pos[items] = np.arange(nxt, nxt + len(items))
        nxt += len(items)
        return start

    # Tables, by scope.
    arrays: dict[int, np.ndarray] = dict(leaf_tables)
    by_scope: dict[tuple[int, ...], list[int]] = {}
    for i in np.flatnonzero(live & table):
        by_scope.setdefault(scope[i], []).append(int(i))
    tables = []
    type_rank = {cls: r for r, cls in enumerate(LEAF_TYPES.values())}
    for cols in sorted(by_scope):
        mine = by_scope[cols]
        single = len(cols) == 1 and not tabulate  # leaves, grouped by type for values without a code
        if single:
            mine.sort(key=lambda i: type_rank[type(nodes[i].dist)])
        sizes = [len(codings[c].at) for c in cols]
        strides = np.cumprod([1] + sizes[:0:-1])[::-1].astype(np.intp)
        rows = []
        for i in mine:
            rows.append(_table(i, nodes, scope, codings, arrays).reshape(-1))
            arrays = dict(leaf_tables)  # a table's sub-tables are not kept
        log = np.stack(rows)
        start = place(mine)
        types = []
        if single:
            for cls in LEAF_TYPES.values():
                of = [i for i in mine if type(nodes[i].dist) is cls]
                if of:
                    types.append((cls, cls.stack_numpy([nodes[i].dist for i in of]), int(pos[of[0]]),
                                  int(pos[of[0]]) + len(of)))
        tables.append(_Table(cols, strides, start, nxt, np.ascontiguousarray(log), np.exp(log), types))
        bound[mine] = np.maximum(log.max(axis=1), 0.0)

    # Leaves read by their type's maths.
    groups = []
    rest = [i for i in np.flatnonzero(live & ~table) if isinstance(nodes[i], _Leaf)]
    for cls in LEAF_TYPES.values():
        for col in sorted({nodes[i].col for i in rest}):
            of = [int(i) for i in rest if type(nodes[i].dist) is cls and nodes[i].col == col]
            if of:
                P = cls.stack_numpy([nodes[i].dist for i in of])
                s = place(of)
                groups.append(_Group(cls, P, col, s, nxt))
                bound[of] = cls.np_log_bound(P)
    consts = [int(i) for i in np.flatnonzero(live & ~table) if isinstance(nodes[i], float)]
    const_start = place(consts)
    const_values = np.array([nodes[i] for i in consts], dtype=np.float64)[:, None]
    bound[consts] = np.maximum(const_values[:, 0], 0.0)
    placed_models = []
    for m in models:
        if live[m.rows].any():
            placed_models.append((m, place(m.rows)))
            bound[m.rows] = np.inf  # no bound known: products over them take the log-space program
    model_stop = nxt

    # Inner nodes by height; in the linear program a sum's weight moves into a product child
    # that has no other parent.
    inner = [i for i in order if live[i] and not table[i] and isinstance(nodes[i], _Inner)]
    const = {i: nodes[i].const for i in inner if nodes[i].logw is None}
    folded: dict[int, np.ndarray] = {}
    if tabulate:
        for i in inner:
            n = nodes[i]
            if n.logw is not None:
                fold = np.array([ch in const and parents[ch] == 1 for ch in n.children])
                for ch, lw, f in zip(n.children, n.logw, fold):
                    if f:
                        const[ch] += lw
                folded[i] = fold
    height = np.zeros(N, dtype=np.int64)
    for i in inner:  # children come before parents
        n = nodes[i]
        height[i] = 1 + max(height[ch] for ch in n.children)
        kids = bound[n.children]
        if n.logw is None:
            bound[i] = max(const[i] + kids.sum(), 0.0)
        else:
            edge = kids + np.where(folded.get(i, np.zeros(len(kids), dtype=bool)), 0.0, n.logw)
            top = edge.max()
            bound[i] = max(top + np.log(np.exp(edge - top).sum()), 0.0) if np.isfinite(top) else top
    ops = []
    by_kind: dict[tuple[int, bool, int], list[int]] = {}
    for i in inner:
        by_kind.setdefault((int(height[i]), nodes[i].logw is not None, len(nodes[i].children)), []).append(i)
    for (_, is_sum, _), group in sorted(by_kind.items()):
        start = place(group)
        idx = pos[np.array([nodes[i].children for i in group], dtype=np.int64)]
        if not is_sum:
            c = np.array([[const[i]] for i in group])
            has = bool(c.any())
            with np.errstate(over="ignore"):
                floor = float(TINY * np.exp(bound[group].max()))
            ops.append(_Op(True, start, nxt, idx, c if has else None, np.exp(c) if has else None, floor))
        else:
            logw = np.array([nodes[i].logw for i in group])
            w = np.exp(logw)
            if tabulate:
                fold = np.array([folded[i] for i in group])
                w = None if fold.all() else np.where(fold, 1.0, w)
            ops.append(_Op(False, start, nxt, idx, logw=logw, w=w))
    # The least root value trusted when some product fell below its floor (see _linear_pass):
    # 2**40 times TINY times the root's bound times the number of paths from it to every node.
    paths = np.zeros((len(roots), N))
    for r, root in enumerate(roots):
        paths[r, root] = 1.0
    for i in reversed(inner):
        np.add.at(paths.T, nodes[i].children, paths[:, i])  # a child twice among the children: twice
    with np.errstate(over="ignore"):
        trust = 2.0 ** 40 * TINY * np.exp(bound[roots]) * paths.sum(axis=1)
    return _Program(tables, groups, const_start, const_values, placed_models, model_stop, ops,
                    pos[np.array(roots, dtype=np.int64)], nxt, trust[:, None],
                    tuple(sorted({c for t in tables for c in t.cols})))


def _table(i: int, nodes: list[Any], scope: list[tuple[int, ...]], codings: dict[int, _Coding],
           arrays: dict[int, np.ndarray]) -> np.ndarray:
    """Node ``i``'s log-values at every joint code of its scope: an array with one axis per
    column of ``scope[i]`` (ascending), by the node's own operations on its children's tables."""
    if i in arrays:
        return arrays[i]
    n = nodes[i]
    if isinstance(n, float):
        out = np.array(n)
    else:
        cols = scope[i]

        def spread(ch: int) -> np.ndarray:
            a = _table(ch, nodes, scope, codings, arrays)
            return a.reshape([a.shape[scope[ch].index(c)] if c in scope[ch] else 1 for c in cols])

        if n.logw is None:
            out = spread(n.children[0])
            for ch in n.children[1:]:
                out = out + spread(ch)
            out = out + n.const
        else:
            shape = [len(codings[c].at) for c in cols]
            vals = np.stack([np.broadcast_to(spread(ch), shape) for ch in n.children]) \
                + n.logw.reshape([-1] + [1] * len(cols))
            m = vals.max(axis=0)
            m = np.where(np.isfinite(m), m, 0.0)
            with np.errstate(divide="ignore", under="ignore"):
                out = np.log(np.exp(vals - m).sum(axis=0)) + m
    arrays[i] = out
    return out


# ---------------------------------------------------------------------------------- evaluating
def _read_tables(p: _Program, codes: dict[int, tuple[np.ndarray, np.ndarray]], V: np.ndarray,
                 linear: bool) -> None:
    for t in p.tables:
        code = codes[t.cols[0]][0]
        if len(t.cols) > 1:
            code = code * t.strides[0]
            for c, s in zip(t.cols[1:], t.strides[1:]):
                code += codes[c][0] * s
        np.take(t.lin if linear else t.log, code, axis=1, out=V[t.start:t.stop], mode="clip")


def _read_models(p: _Program, xt: np.ndarray, V: np.ndarray) -> None:
    """The other client models' log-values into their rows."""
    b = xt.shape[1]
    for m, at in p.models:
        sub = np.full((b, len(m.cols)), np.nan)
        have = [j for j, c in enumerate(m.cols) if c >= 0]
        sub[:, have] = xt[[m.cols[j] for j in have]].T
        if m.target < 0:
            V[at] = _model_ll(m.model, sub)
        else:
            k = len(m.rows)
            rep = np.repeat(sub, k, axis=0)
            rep[:, m.target] = np.tile(np.arange(k, dtype=np.float64), b)
            V[at:at + k] = _model_ll(m.model, rep).reshape(b, k).T


def _linear_pass(p: _Program, xt: np.ndarray, codes: dict[int, tuple[np.ndarray, np.ndarray]],
                 V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Root values ``(n_roots, b)`` by the linear program and, per row, whether they hold."""
    b = xt.shape[1]
    ok = np.ones(b, dtype=bool)
    for c in p.coded:
        ok &= codes[c][1]
    low = np.zeros(b, dtype=bool)
    _read_tables(p, codes, V, linear=True)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        for g in p.groups:
            g.read(xt[g.col], V, linear=True)
        if len(p.consts):
            V[p.const_start:p.const_start + len(p.consts)] = np.exp(p.consts)
        if p.models:
            _read_models(p, xt, V)
            first = p.models[0][1]
            np.exp(V[first:p.model_stop], out=V[first:p.model_stop])
        for op in p.ops:
            out = V[op.start:op.stop]
            np.take(V, op.idx[:, 0], axis=0, out=out, mode="clip")
            if op.product:
                for j in range(1, op.idx.shape[1]):
                    out *= V[op.idx[:, j]]
                if op.scale is not None:
                    out *= op.scale
                low |= out.min(axis=0) < op.floor
            elif op.w is None:
                for j in range(1, op.idx.shape[1]):
                    out += V[op.idx[:, j]]
            else:
                out *= op.w[:, :1]
                for j in range(1, op.idx.shape[1]):
                    term = V[op.idx[:, j]]
                    term *= op.w[:, j:j + 1]
                    out += term
    root = V[p.roots]
    ok &= np.isfinite(root).all(axis=0) & (root >= np.where(low, p.trust, TINY)).all(axis=0)
    return root, ok


def _log_pass(p: _Program, xt: np.ndarray, codes: dict[int, tuple[np.ndarray, np.ndarray]],
              V: np.ndarray) -> np.ndarray:
    """Root log-values ``(n_roots, b)`` by the log-space program: the reference's operations."""
    _read_tables(p, codes, V, linear=False)
    for t in p.tables:  # values without a code: the leaf types themselves
        uncoded = np.flatnonzero(~codes[t.cols[0]][1])
        if len(uncoded):
            v = xt[t.cols[0], uncoded]
            for cls, P, s, e in t.types:
                V[s:e, uncoded] = cls.np_log_prob(P, np.repeat(v[:, None], e - s, axis=1)).T
    for g in p.groups:
        g.read(xt[g.col], V, linear=False)
    if len(p.consts):
        V[p.const_start:p.const_start + len(p.consts)] = p.consts
    _read_models(p, xt, V)
    with np.errstate(under="ignore", over="ignore", invalid="ignore", divide="ignore"):
        for op in p.ops:
            out = V[op.start:op.stop]
            if op.product:
                np.take(V, op.idx[:, 0], axis=0, out=out, mode="clip")
                for j in range(1, op.idx.shape[1]):
                    out += V[op.idx[:, j]]
                if op.const is not None:
                    out += op.const
            else:
                n, a = op.idx.shape
                vals = V[op.idx.reshape(-1)].reshape(n, a, -1)
                vals += op.logw[:, :, None]
                m = vals.max(axis=1)
                m[~np.isfinite(m)] = 0.0
                vals -= m[:, None, :]
                np.exp(vals, out=vals)
                np.log(vals.sum(axis=1), out=out)
                out += m
    return V[p.roots]
