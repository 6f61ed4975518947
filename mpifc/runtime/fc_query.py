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


def exchange_evidence(transport: Any, rank: int, clients: list[Any], test: Any, own: Any, lo: int, hi: int,
                      target: str | None, from_querier: bool, blank_own_target: bool = False) -> Columns:
    """One batch's evidence columns for this rank's sub-circuits (empty on a rank with no client).

    With ``from_querier`` (horizontal inference) rank 0 sends each client the querier's own rows
    ``test.x[lo:hi]`` restricted to that client's features (built once per feature set, the
    ``target`` column blanked: the label never travels), and clients evaluate on what they got.
    Otherwise each client reads its own test rows (``blank_own_target`` blanks the target there).
    """
    if rank == 0 and from_querier:
        made: dict[tuple[str, ...], np.ndarray] = {}  # clients with the same features get one array
        for c in clients:
            ev = made.get(tuple(c.features))
            if ev is None:
                idx = [test.features.index(f) for f in c.features]
                ev = made[tuple(c.features)] = test.x[lo:hi][:, idx]  # fancy indexing: a copy
                if target in c.features:
                    ev[:, c.features.index(target)] = np.nan
            transport.send(ev, c.rank, P.EVIDENCE)
    mine = [c for c in clients if c.rank == rank]
    if not mine:
        return {}
    if from_querier:
        ev = transport.recv(0, P.EVIDENCE)
        return {f: ev[:, j] for j, f in enumerate(mine[0].features)}
    cols = {f: own.x_test[lo:hi, j] for j, f in enumerate(own.features)}
    if blank_own_target and target in cols:
        cols[target] = cols[target].copy()
        cols[target][:] = np.nan
    return cols


def node_width(fc: FederatedCircuit, nid: int, query: Query) -> int:
    """Columns of node ``nid``'s value in ``query``."""
    t = query.expand_target
    return query.n_classes if t is not None and t in fc.nodes[nid].scope else 1


def query_payload_bytes(fc: FederatedCircuit, batch: int, query: Query = Query()) -> int:
    """Closed form: payload bytes of one upward pass over ``batch`` samples (float64)."""
    return sum(8 * batch * node_width(fc, nid, query) for ids in fc.rank_edges().values() for nid in ids)


def upward_pass(transport: Any, fc: FederatedCircuit, rank: int, cols: Columns, batch: int,
                query: Query = Query(), values: dict[int, np.ndarray] | None = None) -> np.ndarray | None:
    """Run one upward pass; returns the root's ``(batch, m)`` log-values on the root's rank.

    Args:
        cols: this rank's evidence ``{feature: (batch,)}`` (only leaves on this rank read it).
        values: if given, filled with every value this rank computed or received (for EM).
    """
    edges = fc.rank_edges()
    values = {} if values is None else values
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


def downward_pass(transport: Any, fc: FederatedCircuit, rank: int, values: dict[int, np.ndarray],
                  batch: int) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """The EM flow pass, the upward pass reversed (one ``fc.em.flows`` bundle per link).

    A rank receives, from each rank it sent values to, the partial flows its parents there give
    to its nodes, adds them up, pushes its own flows down
    (:func:`mpifc.federated.em.downward`), and sends each child rank the partial flows of that
    rank's nodes. Payload per pass: ``8 · batch`` bytes per node crossing a link.

    Returns:
        ``(flows, sum_stats)``: flows ``{id: (batch,)}`` of this rank's nodes, and the summed
        child shares of this rank's sum nodes.
    """
    from mpifc.federated.em import downward

    edges = fc.rank_edges()
    flows: dict[int, np.ndarray] = {}
    if fc.nodes[fc.root].rank == rank:
        flows[fc.root] = np.ones(batch)
    for (src, dst), ids in sorted(edges.items()):
        if src != rank:
            continue
        flat = transport.recv(dst, P.FLOWS)
        for i, nid in enumerate(ids):
            part = flat[i * batch: (i + 1) * batch]
            flows[nid] = flows[nid] + part if nid in flows else part.copy()
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
    stats = downward(fc, values, flows, mine)
    for (src, dst), ids in sorted(edges.items()):
        if dst != rank:
            continue
        bundle = np.concatenate([flows.get(nid, np.zeros(batch)) for nid in ids])
        transport.send(bundle, src, P.FLOWS)
    return {nid: flows[nid] for nid in mine if nid in flows}, stats
