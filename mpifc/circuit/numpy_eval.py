"""Likelihoods of a circuit graph in numpy: the CPU path of LearnSPN/MSPN models without torch.

:class:`NumpyCircuit` lays the graph out as :class:`~mpifc.circuit.compiled.CompiledCircuit`
does (leaves grouped by type in registry order, then per topological layer its products and
its sums) and runs the same upward pass with the same operations per node: each leaf type's
:meth:`~mpifc.circuit.leaves.Leaf.np_log_prob`, products as sums of child log-values in edge
order, sums as a max-shifted ``logsumexp`` of child log-values plus log-weights. Values equal
the torch evaluator's up to rounding (tests hold them to 1e-9; the torch evaluator's
:class:`~mpifc.circuit.compiled.RootPlan` itself sums leaves in another order).

Only the sum-product root value is computed here (likelihoods, marginals, conditionals and class
posteriors, which are ratios of them); EM, MPE and sampling stay on the torch evaluator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpifc.circuit.graph import LeafNode, Node, inner_layers, topological_order
from mpifc.circuit.leaves import LEAF_TYPES, LOG_ZERO, Leaf, Params
from mpifc.errors import UserError

MAX_BUFFER_ELEMS = 1 << 21
"""Rows are evaluated in chunks of about this many node values (16 MB in float64), as the torch
evaluator's are."""

MIN_CHUNK_ROWS = 1024


@dataclass
class _Group:
    cls: type[Leaf]
    P: Params
    cols: np.ndarray
    start: int
    stop: int


@dataclass
class _Layer:
    p0: int
    p1: int
    prod_child: np.ndarray
    prod_start: np.ndarray  # first edge of each product (edges are grouped by parent)
    s0: int
    s1: int
    sum_child: np.ndarray
    sum_start: np.ndarray
    sum_parent: np.ndarray
    log_weights: np.ndarray


class NumpyCircuit:
    """The upward sum-product pass of a (validated) circuit graph, in numpy.

    Args:
        root: root node; the graph is read once (later changes to it are not seen).

    Data ``x`` is ``(batch, len(scope))``; column ``j`` holds variable ``scope[j]``; NaN = missing.
    """

    def __init__(self, root: Node) -> None:
        self.scope: tuple[int, ...] = root.scope
        col_of = {v: j for j, v in enumerate(self.scope)}
        order = topological_order(root)
        pos: dict[int, int] = {}
        leaves = [n for n in order if isinstance(n, LeafNode)]
        self.groups: list[_Group] = []
        nxt = 0
        for cls in LEAF_TYPES.values():
            mine = [n for n in leaves if type(n.dist) is cls]
            if not mine:
                continue
            for n in mine:
                pos[id(n)] = nxt
                nxt += 1
            self.groups.append(_Group(cls, cls.stack_numpy([n.dist for n in mine]),
                                      np.array([col_of[n.var] for n in mine], dtype=np.int64), nxt - len(mine), nxt))
        if nxt != len(leaves):
            bad = next(n for n in leaves if type(n.dist) not in LEAF_TYPES.values())
            raise UserError(f"{bad.name}: leaf type {type(bad.dist).__name__} is not registered in "
                            f"mpifc.circuit.leaves.LEAF_TYPES")
        self.layers: list[_Layer] = []
        for prods, sums in inner_layers(order):
            p0 = nxt
            for n in prods:
                pos[id(n)] = nxt
                nxt += 1
            s0 = nxt
            for n in sums:
                pos[id(n)] = nxt
                nxt += 1
            pc = np.array([pos[id(c)] for n in prods for c in n.children], dtype=np.int64)
            sc = np.array([pos[id(c)] for n in sums for c in n.children], dtype=np.int64)
            p_len = np.array([len(n.children) for n in prods], dtype=np.int64)
            s_len = np.array([len(n.children) for n in sums], dtype=np.int64)
            w = (np.concatenate([np.asarray(n.weights, dtype=np.float64) for n in sums]) if sums
                 else np.zeros(0))
            with np.errstate(divide="ignore"):
                logw = np.maximum(np.log(w), LOG_ZERO)
            self.layers.append(_Layer(p0, s0, pc, np.cumsum(p_len) - p_len, s0, nxt, sc,
                                      np.cumsum(s_len) - s_len, np.repeat(np.arange(len(sums)), s_len), logw))
        self.n_nodes = nxt
        self.root_index = pos[id(root)]

    def as_input(self, x: Any) -> np.ndarray:
        """``x`` as float64 ``(batch, len(scope))``; UserError on another shape."""
        a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != len(self.scope):
            raise UserError(f"circuit input: expected shape (batch, {len(self.scope)}) for scope "
                            f"{self.scope[:8]}{'...' if len(self.scope) > 8 else ''}, got {tuple(a.shape)}")
        return a

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Log-values of every node ``(batch, n_nodes)`` under sum-product (``x`` converted)."""
        B = x.shape[0]
        V = np.empty((B, self.n_nodes))
        for g in self.groups:
            V[:, g.start:g.stop] = g.cls.np_log_prob(g.P, x[:, g.cols])
        for L in self.layers:
            if L.p1 > L.p0:
                V[:, L.p0:L.p1] = np.add.reduceat(V[:, L.prod_child], L.prod_start, axis=1)
            if L.s1 > L.s0:
                vals = V[:, L.sum_child] + L.log_weights
                m = np.maximum.reduceat(vals, L.sum_start, axis=1)
                m = np.where(np.isfinite(m), m, 0.0)
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    s = np.add.reduceat(np.exp(vals - m[:, L.sum_parent]), L.sum_start, axis=1)
                    V[:, L.s0:L.s1] = np.log(s) + m
        return V

    def log_likelihood(self, x: Any) -> np.ndarray:
        """``log p(x)`` float64 ``(batch,)`` in nats; NaN entries are marginalised per sample."""
        a = self.as_input(x)
        step = max(MIN_CHUNK_ROWS, MAX_BUFFER_ELEMS // max(1, self.n_nodes))
        out = [self.forward(a[i:i + step])[:, self.root_index] for i in range(0, a.shape[0], step)]
        return np.concatenate(out) if out else np.zeros(0)
