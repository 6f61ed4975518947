"""Distributed queries on a federated circuit: the upward pass over ψ's rank graph.

Each rank evaluates only the nodes ψ gives it. Per pass, a rank (1) receives ONE bundled
``fc.query.values`` message from each rank that sends to it, (2) evaluates its nodes in id order
(children first) with the same :func:`~mpifc.federated.evaluate.leaf_values` and
:func:`~mpifc.federated.evaluate.combine` as the single-process evaluator, and (3) sends ONE
bundle to each parent rank. The rank graph is acyclic (validated), so this cannot deadlock.

A bundle for link ``(src, dst)`` concatenates, in ascending node id, the ``(batch, m)`` values
of every node on ``src`` with a parent on ``dst`` (``m = n_classes`` if the node's scope holds the
expanded target, else 1). So the payload of one pass is exactly
``8 · batch · Σ_links Σ_nodes m`` bytes (:func:`query_payload_bytes`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.evaluate import Columns, Query, combine, leaf_values
from mpifc.federated.structure import LEAF, FederatedCircuit
from mpifc.runtime import fc_protocol as P


def node_width(fc: FederatedCircuit, nid: int, query: Query) -> int:
    """Columns of node ``nid``'s value in ``query``."""
    t = query.expand_target
    return query.n_classes if t is not None and t in fc.nodes[nid].scope else 1


def query_payload_bytes(fc: FederatedCircuit, batch: int, query: Query = Query()) -> int:
    """Closed form: payload bytes of one upward pass over ``batch`` samples (float64)."""
    return sum(8 * batch * node_width(fc, nid, query) for ids in fc.rank_edges().values() for nid in ids)


def upward_pass(transport: Any, fc: FederatedCircuit, rank: int, cols: Columns, batch: int,
                query: Query = Query()) -> np.ndarray | None:
    """Run one upward pass; returns the root's ``(batch, m)`` log-values on the root's rank.

    Args:
        cols: this rank's evidence ``{feature: (batch,)}`` (only leaves on this rank read it).
    """
    edges = fc.rank_edges()
    values: dict[int, np.ndarray] = {}
    for (src, dst), ids in sorted(edges.items()):
        if dst != rank:
            continue
        flat = transport.recv(src, P.VALUES)
        widths = [node_width(fc, nid, query) for nid in ids]
        if flat.size != batch * sum(widths):
            raise UserError(f"rank {rank}: bundle from rank {src} has {flat.size} values, expected "
                            f"{batch * sum(widths)} for nodes {ids}")
        off = 0
        for nid, m in zip(ids, widths):
            values[nid] = flat[off: off + batch * m].reshape(batch, m)
            off += batch * m
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
    for nid in mine:
        node = fc.nodes[nid]
        if node.op == LEAF:
            values[nid] = leaf_values(node, cols, query)
        else:
            values[nid] = combine(node, [values[c] for c in node.children])
    for (src, dst), ids in sorted(edges.items()):
        if src != rank:
            continue
        bundle = np.concatenate([np.ascontiguousarray(values[nid], dtype=np.float64).reshape(-1) for nid in ids])
        transport.send(bundle, dst, P.VALUES)
    root = fc.nodes[fc.root]
    return values[fc.root] if root.rank == rank else None
