"""An undirected dependency graph over named features (what clients send to the master)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mpifc.errors import UserError


@dataclass(frozen=True, eq=False)
class DependencyGraph:
    """Feature names plus a symmetric boolean adjacency without self loops.

    Attributes:
        names: ``(d,)`` unique feature names; node ``i`` is ``names[i]``.
        adjacency: ``(d, d)`` bool, symmetric, zero diagonal.
    """

    names: tuple[str, ...]
    adjacency: np.ndarray

    def __post_init__(self) -> None:
        names = tuple(str(n) for n in self.names)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise UserError(f"dependency graph: duplicate feature names {dup}")
        a = np.asarray(self.adjacency)
        if a.shape != (len(names), len(names)):
            raise UserError(f"dependency graph: adjacency must be {len(names)}x{len(names)} "
                            f"to match the names, got shape {a.shape}")
        if a.dtype != bool:
            if not np.isin(a, (0, 1)).all():
                raise UserError("dependency graph: adjacency entries must be 0/1 or boolean")
            a = a.astype(bool)
        if not np.array_equal(a, a.T):
            i, j = np.argwhere(a != a.T)[0]
            raise UserError(f"dependency graph: adjacency is not symmetric at ({names[i]!r}, {names[j]!r})")
        if a.diagonal().any():
            i = int(np.flatnonzero(a.diagonal())[0])
            raise UserError(f"dependency graph: self loop on feature {names[i]!r}")
        a = a.copy()
        a.setflags(write=False)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "adjacency", a)

    @staticmethod
    def from_edges(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> "DependencyGraph":
        """Graph on ``names`` with the undirected ``edges`` (pairs of names)."""
        names = tuple(names)
        idx = {n: i for i, n in enumerate(names)}
        a = np.zeros((len(names), len(names)), dtype=bool)
        for u, v in edges:
            if u not in idx or v not in idx:
                raise UserError(f"dependency graph: edge ({u!r}, {v!r}) names a feature not in {list(names)}")
            a[idx[u], idx[v]] = a[idx[v], idx[u]] = True
        return DependencyGraph(names, a)

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    def edges(self) -> set[frozenset[str]]:
        """The undirected edges as a set of name pairs."""
        i, j = np.nonzero(np.triu(self.adjacency, 1))
        return {frozenset((self.names[a], self.names[b])) for a, b in zip(i, j)}

    def neighbours(self, name: str) -> tuple[str, ...]:
        i = self.names.index(name)
        return tuple(self.names[j] for j in np.flatnonzero(self.adjacency[i]))

    def restrict(self, names: Sequence[str]) -> "DependencyGraph":
        """Induced subgraph on ``names`` (in that order)."""
        missing = [n for n in names if n not in self.names]
        if missing:
            raise UserError(f"dependency graph: features {missing} are not in the graph")
        idx = [self.names.index(n) for n in names]
        return DependencyGraph(tuple(names), self.adjacency[np.ix_(idx, idx)])

    def reorder(self, names: Sequence[str]) -> "DependencyGraph":
        """The same graph with its nodes listed in the order ``names`` (a permutation)."""
        if sorted(names) != sorted(self.names):
            raise UserError(f"dependency graph: {list(names)} is not a permutation of {list(self.names)}")
        return self.restrict(names)

    def bfs_order(self, start: int | None = None) -> list[int]:
        """Breadth-first order over all nodes, component by component.

        Each component starts at ``start`` (first component only) or else at its node of largest
        degree (ties: lowest index), so the order is deterministic. Neighbours are visited in
        index order.
        """
        d = self.n_nodes
        deg = self.adjacency.sum(1)
        seen = np.zeros(d, dtype=bool)
        order: list[int] = []
        while len(order) < d:
            if start is not None and not seen[start]:
                root = start
            else:
                free = np.flatnonzero(~seen)
                root = int(free[np.argmax(deg[free])])
            seen[root] = True
            queue = deque([root])
            while queue:
                u = queue.popleft()
                order.append(u)
                for v in np.flatnonzero(self.adjacency[u] & ~seen):
                    seen[v] = True
                    queue.append(int(v))
        return order

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DependencyGraph) and self.names == other.names
                and np.array_equal(self.adjacency, other.adjacency))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """For transport: names as a unicode array and the adjacency as uint8."""
        return {"names": np.array(self.names, dtype=np.str_), "adjacency": self.adjacency.astype(np.uint8)}

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray]) -> "DependencyGraph":
        return DependencyGraph(tuple(str(n) for n in arrays["names"]), np.asarray(arrays["adjacency"]).astype(bool))
