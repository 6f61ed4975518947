"""Circuit graph: sum, product and leaf nodes, validity checks and structural helpers.

A circuit is a rooted DAG of :class:`Node` objects. Builders (LearnSPN, RAT-SPN, hand-made test
circuits) create nodes; :mod:`mpifc.circuit.compiled` turns a graph into flat tensor layers for
evaluation. Nothing here evaluates a density.

Conventions:

* ``node.scope`` is a sorted tuple of variable indices (ints >= 0).
* ``node.children`` is a list; ``SumNode.weights`` is a float64 numpy array of the same length.
* Nodes may be shared (DAG); every helper visits a shared node once.
* Every traversal is iterative (explicit stack), so circuits thousands of levels deep are fine.
* ``node.id`` is unique within the process; it is only used to name nodes in error messages.
  Serialisation uses positions in :func:`topological_order`, which is deterministic.

Top-down builders that know a node's scope before its children may pass ``scope=`` and add
children later with :meth:`SumNode.add_child` / :meth:`ProductNode.add_child`; :func:`validate`
then checks that the declared scope matches the children.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Sequence

import numpy as np

from mpifc.errors import UserError

_ids = itertools.count()

WEIGHT_TOL = 1e-6
"""Tolerance on ``|sum(weights) - 1|`` accepted by :func:`validate`."""


class Node:
    """Base class of circuit nodes; use the subclasses."""

    kind: str = "node"

    def __init__(self, children: Iterable["Node"] = (), scope: Iterable[int] | None = None) -> None:
        # LeafNode.__init__ sets these three attributes itself (a fast path): keep the two in step.
        self.id: int = next(_ids)
        self.children: list[Node] = list(children)
        for c in self.children:
            if not isinstance(c, Node):
                raise UserError(f"{self.kind} node {self.id}: child {c!r} is not a Node")
        if scope is None:
            scope = set().union(*(c.scope for c in self.children)) if self.children else ()
        self.scope: tuple[int, ...] = tuple(sorted(int(v) for v in set(scope)))

    @property
    def name(self) -> str:
        """Readable name used in error messages, e.g. ``"sum node 17 (scope (0, 3))"``."""
        return f"{self.kind} node {self.id} (scope {self.scope})"

    def __repr__(self) -> str:
        return f"<{self.name}, {len(self.children)} children>"


class SumNode(Node):
    """Mixture ``sum_i w_i * child_i``; children must share one scope (smoothness).

    Args:
        children: child nodes.
        weights: non-negative mixture weights, one per child, summing to 1.
        scope: optional declared scope (for top-down builders); default is the union of the
            children's scopes.
    """

    kind = "sum"

    def __init__(
        self,
        children: Sequence[Node] = (),
        weights: Sequence[float] | np.ndarray = (),
        scope: Iterable[int] | None = None,
    ) -> None:
        super().__init__(children, scope)
        self.weights: np.ndarray = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(self.weights) != len(self.children):
            raise UserError(
                f"{self.name}: {len(self.weights)} weights for {len(self.children)} children"
            )

    def add_child(self, child: Node, weight: float) -> None:
        """Append ``child`` with mixture weight ``weight`` (normalise before use)."""
        self.children.append(child)
        self.weights = np.append(self.weights, float(weight))


class ProductNode(Node):
    """Factorisation ``prod_i child_i``; children must have disjoint scopes (decomposability)."""

    kind = "product"

    def __init__(self, children: Sequence[Node] = (), scope: Iterable[int] | None = None) -> None:
        super().__init__(children, scope)

    def add_child(self, child: Node) -> None:
        """Append ``child``."""
        self.children.append(child)


class LeafNode(Node):
    """Univariate input node: distribution ``dist`` over variable ``scope_var``.

    Args:
        scope_var: index of the modelled variable (column ``scope_var`` of the data).
        dist: a :class:`mpifc.circuit.leaves.Leaf` instance.
    """

    kind = "leaf"

    def __init__(self, scope_var: int, dist: object) -> None:
        if isinstance(scope_var, bool) or not isinstance(scope_var, (int, np.integer)) or scope_var < 0:
            raise UserError(f"leaf node: scope_var must be an int >= 0, got {scope_var!r}")
        # What Node.__init__((), (var,)) sets, without its generic scope handling (LearnSPN
        # makes one leaf per column of every factorised slice).
        var = int(scope_var)
        self.id = next(_ids)
        self.children = []
        self.scope = (var,)
        self.var: int = var
        self.dist = dist

    @property
    def name(self) -> str:
        return f"leaf node {self.id} ({type(self.dist).__name__} on var {self.var})"


# ----------------------------------------------------------------------------- traversal


def topological_order(root: Node) -> list[Node]:
    """All nodes reachable from ``root``, children before parents, each once; root last.

    Deterministic (depends only on the graph and child order). Raises UserError on a cycle.
    """
    order: list[Node] = []
    state: dict[int, int] = {}  # id(node) -> 1 on stack, 2 done
    stack: list[tuple[Node, Iterator[Node]]] = [(root, iter(root.children))]
    state[id(root)] = 1
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is None:
            stack.pop()
            state[id(node)] = 2
            order.append(node)
            continue
        s = state.get(id(child))
        if s == 1:
            raise UserError(f"{child.name}: cycle in circuit graph")
        if s is None:
            state[id(child)] = 1
            stack.append((child, iter(child.children)))
    return order


def inner_layers(order: list[Node]) -> list[tuple[list[Node], list[Node]]]:
    """The inner nodes of a topological ``order`` by height (leaves 0, a node 1 + its highest
    child), lowest first: per height ``(products, sums)`` in ``order``'s order. Every node's
    children lie in lower layers, so evaluating the layers in turn is an upward pass."""
    level: dict[int, int] = {}
    for n in order:
        level[id(n)] = 0 if isinstance(n, LeafNode) else 1 + max(level[id(c)] for c in n.children)
    by_layer: list[tuple[list[Node], list[Node]]] = [([], []) for _ in range(max(level.values()) + 1)]
    for n in order:
        if not isinstance(n, LeafNode):
            by_layer[level[id(n)]][0 if isinstance(n, ProductNode) else 1].append(n)
    return by_layer[1:]


def leaves_of(root: Node) -> list[LeafNode]:
    """The leaf nodes under ``root`` in topological order."""
    return [n for n in topological_order(root) if isinstance(n, LeafNode)]


def count_nodes(root: Node) -> dict[str, int]:
    """Node counts ``{"sum": .., "product": .., "leaf": .., "edges": ..}``."""
    out = {"sum": 0, "product": 0, "leaf": 0, "edges": 0}
    for n in topological_order(root):
        out[n.kind] += 1
        out["edges"] += len(n.children)
    return out


def num_parameters(root: Node) -> int:
    """Stored learnable parameters: one per sum edge plus each leaf's ``num_parameters()``."""
    total = 0
    for n in topological_order(root):
        if isinstance(n, SumNode):
            total += len(n.weights)
        elif isinstance(n, LeafNode):
            total += int(n.dist.num_parameters())
    return total


def depth(root: Node) -> int:
    """Longest root-to-leaf path, counted in edges."""
    d: dict[int, int] = {}
    for n in topological_order(root):
        d[id(n)] = 1 + max((d[id(c)] for c in n.children), default=-1)
    return d[id(root)]


# ----------------------------------------------------------------------------- validity


def validate(root: Node, tol: float = WEIGHT_TOL) -> None:
    """Check that ``root`` is a valid (smooth, decomposable, normalised) circuit.

    Raises:
        UserError: naming the first offending node: empty inner node, declared scope that does not
            match the children, non-smooth sum, non-decomposable product, bad weights
            (wrong count, non-finite, negative, not summing to 1 within ``tol``), or a leaf whose
            ``dist`` is not a :class:`~mpifc.circuit.leaves.Leaf`.
    """
    from mpifc.circuit.leaves import Leaf  # local: leaves imports nothing from here

    for n in topological_order(root):
        if isinstance(n, LeafNode):
            if not isinstance(n.dist, Leaf):
                raise UserError(f"{n.name}: dist {n.dist!r} is not a Leaf")
            if n.scope != (n.var,):
                raise UserError(f"{n.name}: scope {n.scope} != ({n.var},)")
            continue
        if not isinstance(n, (SumNode, ProductNode)):
            raise UserError(f"{n!r}: unknown node type {type(n).__name__}")
        if not n.children:
            raise UserError(f"{n.name}: has no children")
        union = set().union(*(c.scope for c in n.children))
        if tuple(sorted(union)) != n.scope:
            raise UserError(
                f"{n.name}: declared scope differs from the union of its children's scopes "
                f"{tuple(sorted(union))}"
            )
        if isinstance(n, SumNode):
            for c in n.children:
                if c.scope != n.scope:
                    raise UserError(f"{n.name}: not smooth, child {c.name} has a different scope")
            w = n.weights
            if len(w) != len(n.children):
                raise UserError(f"{n.name}: {len(w)} weights for {len(n.children)} children")
            if not np.all(np.isfinite(w)):
                raise UserError(f"{n.name}: non-finite weight in {w}")
            if np.any(w < 0):
                raise UserError(f"{n.name}: negative weight in {w}")
            if abs(float(w.sum()) - 1.0) > tol:
                raise UserError(f"{n.name}: weights sum to {w.sum():.9g}, not 1")
        else:
            if sum(len(c.scope) for c in n.children) != len(union):
                seen: set[int] = set()
                for c in n.children:
                    both = seen.intersection(c.scope)
                    if both:
                        raise UserError(
                            f"{n.name}: not decomposable, child {c.name} repeats variables "
                            f"{sorted(both)}"
                        )
                    seen.update(c.scope)


def normalize_weights(root: Node) -> None:
    """Rescale every sum node's weights to sum to 1 (in place); an all-zero node gets uniform."""
    for n in topological_order(root):
        if isinstance(n, SumNode) and len(n.weights):
            s = float(n.weights.sum())
            n.weights = n.weights / s if s > 0 else np.full(len(n.weights), 1.0 / len(n.weights))


def refresh_scopes(root: Node) -> None:
    """Recompute every inner node's scope bottom-up as the union of its children's (in place)."""
    for n in topological_order(root):
        if n.children:
            n.scope = tuple(sorted(set().union(*(c.scope for c in n.children))))


# ----------------------------------------------------------------------------- simplification


def collapse(root: Node) -> Node:
    """Equivalent circuit without trivial nodes; the input graph is not modified.

    Removes single-child sums and products, merges a product child into its product parent,
    and a sum child into its sum parent (the child's weights are multiplied by the edge weight).
    Leaves are shared with the input; inner nodes are new. Shared sub-circuits stay shared.
    """
    new: dict[int, Node] = {}
    for n in topological_order(root):
        if isinstance(n, LeafNode):
            new[id(n)] = n
            continue
        kids = [new[id(c)] for c in n.children]
        if isinstance(n, ProductNode):
            flat: list[Node] = []
            for k in kids:
                flat.extend(k.children if isinstance(k, ProductNode) else [k])
            out: Node = flat[0] if len(flat) == 1 else ProductNode(flat, scope=n.scope)
        else:
            assert isinstance(n, SumNode)
            fk: list[Node] = []
            fw: list[float] = []
            for k, w in zip(kids, n.weights):
                if isinstance(k, SumNode):
                    fk.extend(k.children)
                    fw.extend(float(w) * k.weights)
                else:
                    fk.append(k)
                    fw.append(float(w))
            out = fk[0] if len(fk) == 1 else SumNode(fk, fw, scope=n.scope)
        new[id(n)] = out
    return new[id(root)]
