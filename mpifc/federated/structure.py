"""The federated circuit as data: a rooted DAG with ψ (node → rank) and ω (node → operation).

A :class:`FederatedCircuit` knows nothing about MPI. Its nodes are stored in one list indexed by
node id; children always have smaller ids than their parents (ids are a topological order), which
every pass below relies on.

Scopes are sets of *feature names* (strings from the data manifest), never column indices, so a
client's PC can be trained on its local columns and still be placed in the global circuit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from mpifc.circuit.leaves.base import weights_problem
from mpifc.errors import UserError

SUM = "sum"
PRODUCT = "product"
LEAF = "leaf"
AVERAGE = "average"  # FC[DT]: arithmetic mean of the children's class probabilities
OPERATIONS = (SUM, PRODUCT, LEAF, AVERAGE)


@dataclass
class LeafInfo:
    """What the server knows about a client-side PC.

    Attributes:
        client: index of the client (from the manifest) that trained and holds the PC.
        features: feature names the PC models, in the column order the PC was trained on.
        cluster: k-means cluster id the PC was trained on, or -1 for "all the client's rows".
        n_rows: training rows the PC saw (ρ of the leaf).
        learner: learner registry name used to fit it.
        subspace: index of the Algorithm-1 subspace ``S(j)`` the PC models (-1 if none).
        model: the fitted :class:`mpifc.circuit.base.DensityModel`; ``None`` on ranks that only
            know the structure (e.g. the server before the gather).
    """

    client: int
    features: tuple[str, ...]
    cluster: int
    n_rows: int
    learner: str = ""
    subspace: int = -1
    model: Any = None


@dataclass
class Node:
    """One node of the FC.

    Attributes:
        id: index into :attr:`FederatedCircuit.nodes`; children have smaller ids.
        op: ω(node), one of :data:`OPERATIONS`.
        scope: feature names under the node.
        children: child node ids.
        weights: ``(len(children),)`` mixture weights of a sum node (sum to 1), else empty.
        rank: ψ(node), the MPI rank that evaluates it (-1 = not assigned yet).
        leaf: leaf metadata for ``op == "leaf"``.
    """

    id: int
    op: str
    scope: frozenset[str]
    children: list[int] = field(default_factory=list)
    weights: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rank: int = -1
    leaf: LeafInfo | None = None


@dataclass
class ClientInfo:
    """A participating client: its manifest index, MPI rank and declared features."""

    index: int
    rank: int
    features: tuple[str, ...]


class FederatedCircuit:
    """A federated circuit (Definition 3 of the paper): graph, ψ and ω.

    Args:
        features: global feature order (the manifest's ``feature_order``).
        meta_types: ``{feature: meta_type}`` ("real", "categorical", "binary", ...).
        n_categories: ``{feature: k}`` for discrete features (0 or absent for real ones).
        clients: the participating clients.
        target: name of the class feature for conditionals, or ``None``.
        setting: "horizontal", "vertical" or "hybrid" (informational).
    """

    def __init__(self, features: Iterable[str], meta_types: dict[str, str],
                 n_categories: dict[str, int] | None = None, clients: Iterable[ClientInfo] = (),
                 target: str | None = None, setting: str = "") -> None:
        self.features: tuple[str, ...] = tuple(features)
        self.meta_types = dict(meta_types)
        self.n_categories = dict(n_categories or {})
        self.clients: dict[int, ClientInfo] = {c.index: c for c in clients}
        self.target = target
        self.setting = setting
        self.nodes: list[Node] = []
        self.root: int = -1
        self.meta: dict[str, Any] = {}

    # -- building ------------------------------------------------------------------------------
    def add_leaf(self, info: LeafInfo, rank: int = -1) -> int:
        """Append a leaf for a client PC; returns its id."""
        nid = len(self.nodes)
        self.nodes.append(Node(nid, LEAF, frozenset(info.features), rank=rank, leaf=info))
        return nid

    def add_inner(self, op: str, children: list[int], weights: Iterable[float] | None = None,
                  rank: int = -1) -> int:
        """Append a sum/product/average node over existing nodes; returns its id."""
        if op not in (SUM, PRODUCT, AVERAGE):
            raise ValueError(f"inner node operation must be sum, product or average, not {op!r}")
        if not children:
            raise ValueError(f"{op} node needs at least one child")
        nid = len(self.nodes)
        if any(c >= nid or c < 0 for c in children):
            raise ValueError(f"{op} node {nid}: children {children} must be existing nodes")
        scope = frozenset().union(*(self.nodes[c].scope for c in children))
        w = np.zeros(0) if weights is None else np.asarray(list(weights), dtype=np.float64)
        self.nodes.append(Node(nid, op, scope, list(children), w, rank=rank))
        return nid

    # -- views ---------------------------------------------------------------------------------
    @property
    def leaves(self) -> list[Node]:
        return [n for n in self.nodes if n.op == LEAF]

    def parents(self) -> list[list[int]]:
        """``parents[i]`` = ids of the nodes that have ``i`` as a child (reachable ones only)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for n in self.reachable():
            for c in self.nodes[n].children:
                out[c].append(n)
        return out

    def reachable(self) -> list[int]:
        """Ids reachable from the root, ascending (children before parents)."""
        seen = np.zeros(len(self.nodes), dtype=bool)
        stack = [self.root]
        while stack:
            n = stack.pop()
            if n < 0 or seen[n]:
                continue
            seen[n] = True
            stack.extend(self.nodes[n].children)
        return [int(i) for i in np.flatnonzero(seen)]

    def compact(self) -> "FederatedCircuit":
        """Drop nodes unreachable from the root and renumber; returns ``self``."""
        keep = self.reachable()
        new_id = {old: i for i, old in enumerate(keep)}
        nodes = []
        for old in keep:
            n = self.nodes[old]
            n.id = new_id[old]
            n.children = [new_id[c] for c in n.children]
            nodes.append(n)
        self.nodes = nodes
        self.root = new_id[self.root]
        return self

    def num_parameters(self) -> int:
        """Server-side weights plus every leaf model's parameters."""
        total = sum(len(n.weights) for n in self.nodes)
        for n in self.leaves:
            if n.leaf.model is not None:
                total += int(n.leaf.model.num_parameters())
        return total

    def ranks(self) -> list[int]:
        """Distinct ranks used by ψ, ascending."""
        return sorted({n.rank for n in self.nodes})

    def rank_edges(self) -> dict[tuple[int, int], list[int]]:
        """``(src_rank, dst_rank) -> node ids`` whose value crosses that link in an upward pass.

        A node's value is sent once to each distinct rank holding one of its parents; the ids of
        each link are ascending, which fixes the layout of the bundled message.
        """
        out: dict[tuple[int, int], list[int]] = {}
        for nid, pars in enumerate(self.parents()):
            src = self.nodes[nid].rank
            for dst in sorted({self.nodes[p].rank for p in pars}):
                if dst != src:
                    out.setdefault((src, dst), []).append(nid)
        return out

    def describe(self) -> str:
        """Multi-line human-readable dump, one node a line."""
        lines = []
        for n in self.nodes:
            extra = ""
            if n.op == LEAF:
                extra = f" client={n.leaf.client} cluster={n.leaf.cluster} rows={n.leaf.n_rows}"
            elif len(n.weights):
                extra = " w=" + ",".join(f"{w:.3f}" for w in n.weights)
            lines.append(f"{n.id:4d} {n.op:8s} rank={n.rank} ch={n.children} "
                         f"scope={sorted(n.scope)}{extra}")
        return "\n".join(lines)

    # -- validation ----------------------------------------------------------------------------
    def validate(self, require_models: bool = False) -> None:
        """Check the structure; raise :class:`UserError` naming the node and ranks at fault.

        Checks: a root spanning every feature; sums smooth with weights summing to 1; products
        decomposable; every leaf on the rank of a client that declared all of its features; every
        node assigned a rank; and the rank graph of the upward pass acyclic (so each rank can
        receive all its inputs, compute, then send, without deadlock).
        """
        if not 0 <= self.root < len(self.nodes):
            raise UserError("federated circuit has no root")
        root = self.nodes[self.root]
        if root.scope != frozenset(self.features):
            missing = sorted(set(self.features) - root.scope)
            raise UserError(f"root node {root.id} does not span all features; missing {missing}")
        rank_of_client = {c.index: c for c in self.clients.values()}
        for nid in self.reachable():
            n = self.nodes[nid]
            if n.rank < 0:
                raise UserError(f"node {nid} ({n.op}) has no rank assigned by ψ")
            if n.op == LEAF:
                info = n.leaf
                c = rank_of_client.get(info.client)
                if c is None:
                    raise UserError(f"leaf node {nid}: client {info.client} is not a participant")
                if n.rank != c.rank:
                    raise UserError(f"leaf node {nid} (client {info.client}) is placed on rank {n.rank}, "
                                    f"but its data lives on rank {c.rank}")
                extra = sorted(set(info.features) - set(c.features))
                if extra:
                    raise UserError(f"leaf node {nid} on rank {n.rank}: client {info.client} does not "
                                    f"hold features {extra}")
                if require_models and info.model is None:
                    raise UserError(f"leaf node {nid} (client {info.client}) has no model")
                continue
            scopes = [self.nodes[c].scope for c in n.children]
            ranks = sorted({self.nodes[c].rank for c in n.children})
            # AVERAGE (FC[DT] bagging) averages classifiers of the target, not densities: clients
            # may hold different features there, so it is exempt from smoothness.
            if n.op == SUM:
                for c, s in zip(n.children, scopes):
                    if s != n.scope:
                        raise UserError(f"sum node {nid} on rank {n.rank} is not smooth: child {c} "
                                        f"(rank {self.nodes[c].rank}) has scope {sorted(s)}, "
                                        f"expected {sorted(n.scope)}")
            if n.op == SUM:
                if len(n.weights) != len(n.children):
                    raise UserError(f"sum node {nid}: {len(n.weights)} weights for {len(n.children)} children")
                problem = weights_problem(n.weights, 1e-9)
                if problem is not None:
                    raise UserError(f"sum node {nid} on rank {n.rank}: {problem}")
            if n.op == PRODUCT:
                seen: set[str] = set()
                for c, s in zip(n.children, scopes):
                    overlap = seen & s
                    if overlap:
                        raise UserError(f"product node {nid} on rank {n.rank} is not decomposable: "
                                        f"child {c} (rank {self.nodes[c].rank}) repeats "
                                        f"{sorted(overlap)}; child ranks {ranks}")
                    seen |= s
        self._check_rank_graph_acyclic()

    def _check_rank_graph_acyclic(self) -> None:
        edges = self.rank_edges()
        succ: dict[int, set[int]] = {}
        for (a, b) in edges:
            succ.setdefault(a, set()).add(b)
        state: dict[int, int] = {}

        def visit(r: int, path: list[int]) -> None:
            state[r] = 1
            for s in succ.get(r, ()):
                if state.get(s) == 1:
                    cyc = path[path.index(s):] + [s] if s in path else [r, s]
                    raise UserError(f"ψ makes the ranks depend on each other in a cycle {cyc}; "
                                    f"the upward pass would deadlock")
                if s not in state:
                    visit(s, path + [s])
            state[r] = 2

        for r in sorted(succ):
            if r not in state:
                visit(r, [r])

    def rank_order(self) -> list[int]:
        """Ranks in an order where every rank comes after all ranks that send to it."""
        edges = self.rank_edges()
        ranks = self.ranks()
        indeg = {r: 0 for r in ranks}
        succ: dict[int, set[int]] = {r: set() for r in ranks}
        for (a, b) in edges:
            if b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
        order, ready = [], sorted(r for r in ranks if indeg[r] == 0)
        while ready:
            r = ready.pop(0)
            order.append(r)
            for s in sorted(succ[r]):
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        return order
