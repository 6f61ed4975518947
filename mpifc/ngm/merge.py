"""The master's merge of client graphs and schemas (paper section 2.1).

Nodes are the features every client has (knowledge about the others cannot be pooled); edges are
the union of the clients' edges on those nodes (the conservative choice: no dependency any client
saw is dropped).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.schema import Feature, Schema


def _labels(n: int, client_names: Sequence[str] | None) -> list[str]:
    if client_names is None:
        return [f"client {i}" for i in range(n)]
    if len(client_names) != n:
        raise UserError(f"merge: {len(client_names)} client names for {n} inputs")
    return [str(c) for c in client_names]


def common_features(name_lists: Sequence[Sequence[str]], client_names: Sequence[str] | None = None) -> tuple[str, ...]:
    """Features present at every client, in the first client's order.

    Raises:
        UserError: no clients, or no feature shared by all of them.
    """
    labels = _labels(len(name_lists), client_names)
    if not name_lists:
        raise UserError("merge: no client contributed a feature list")
    shared = set(name_lists[0]).intersection(*map(set, name_lists[1:]))
    if not shared:
        raise UserError(f"merge: the clients {labels} share no feature")
    return tuple(n for n in name_lists[0] if n in shared)


def merge_graphs(graphs: Sequence[DependencyGraph], client_names: Sequence[str] | None = None) -> DependencyGraph:
    """Consensus graph: intersection of the nodes, union of the edges among them.

    Args:
        graphs: one graph per client (any node order).
        client_names: labels for error messages.

    Returns:
        Graph over the common features, in the first client's order.
    """
    nodes = common_features([g.names for g in graphs], client_names)
    adj = np.zeros((len(nodes), len(nodes)), dtype=bool)
    for g in graphs:
        adj |= g.restrict(nodes).adjacency
    return DependencyGraph(nodes, adj)


def merge_schemas(schemas: Sequence[Schema], client_names: Sequence[str] | None = None) -> Schema:
    """Common features with one type each.

    Categoricals are assumed to share one global coding (value ``c`` means the same at every
    client), so the merged cardinality is the largest any client declares: value sets may
    differ or even be disjoint between clients.

    Raises:
        UserError: a shared feature is real at one client and categorical at another.
    """
    labels = _labels(len(schemas), client_names)
    nodes = common_features([s.names for s in schemas], client_names)
    merged = []
    for name in nodes:
        kinds = {s[name].kind for s in schemas}
        if len(kinds) > 1:
            who = {labels[i]: s[name].kind for i, s in enumerate(schemas)}
            raise UserError(f"merge: feature {name!r} has conflicting types across clients: {who}")
        f0 = schemas[0][name]
        merged.append(Feature(name, f0.kind, max(s[name].n_categories for s in schemas)))
    return Schema(tuple(merged))
