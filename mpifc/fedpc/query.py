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

Waiting. A rank that waits for values or evidence polls with short sleeps
(:func:`await_messages`, :func:`await_sends`) instead of busy-waiting inside MPI: jobs often
run more ranks than cores, and a spinning rank would take the core from the very rank it waits
for. Bundles are taken in arrival order, so a fast child never waits behind a slow one.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.evaluate import Columns, Query, combine, leaf_values
from mpifc.federated.structure import LEAF, FederatedCircuit
from mpifc.fedpc import protocol as P
from mpifc.runtime.watchdog import backoff


def batches(n: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, n)) for lo in range(0, n, max(size, 1))]


def evidence_arrays(clients: list[Any], test: Any, lo: int, hi: int, target: str | None) -> list[np.ndarray]:
    """The querier's rows ``test.x[lo:hi]`` restricted to each client's features (one array per
    client, in ``clients`` order; clients with the same features share one array), with the
    ``target`` column blanked: the label never travels."""
    made: dict[tuple[str, ...], np.ndarray] = {}
    out = []
    for c in clients:
        ev = made.get(tuple(c.features))
        if ev is None:
            idx = [test.features.index(f) for f in c.features]
            ev = made[tuple(c.features)] = test.x[lo:hi][:, idx]  # fancy indexing: a copy
            if target in c.features:
                ev[:, c.features.index(target)] = np.nan
        out.append(ev)
    return out


def post_evidence(transport: Any, clients: list[Any], test: Any, lo: int, hi: int,
                  target: str | None) -> list[Any]:
    """Querier: start sending one batch's evidence to every client at once (non-blocking).

    Returns the pending sends to other ranks (each keeps its array alive until done). MPI keeps
    messages of one kind from one sender in order, so several batches may be in flight
    (:func:`mpifc.fedpc.evaluate.evaluate_rank` posts evidence a few batches ahead).
    """
    pending = []
    for c, ev in zip(clients, evidence_arrays(clients, test, lo, hi, target)):
        if c.rank == transport.rank:  # the transport keeps a send to oneself alive until received
            transport.send(ev, c.rank, P.EVIDENCE)
        else:
            pending.append(transport.isend(ev, c.rank, P.EVIDENCE))
    return pending


def receive_evidence(transport: Any, client: Any) -> Columns:
    """Client: the next evidence batch from the querier (rank 0), as columns."""
    ev = await_messages(transport, [0], P.EVIDENCE)[0][1]
    return {f: ev[:, j] for j, f in enumerate(client.features)}


def exchange_evidence(transport: Any, rank: int, clients: list[Any], test: Any, own: Any, lo: int, hi: int,
                      target: str | None, from_querier: bool, blank_own_target: bool = False) -> Columns:
    """One batch's evidence columns for this rank's sub-circuits (empty on a rank with no client).

    With ``from_querier`` (horizontal inference) rank 0 sends each client the querier's own rows
    ``test.x[lo:hi]`` restricted to that client's features (:func:`evidence_arrays`), and clients
    evaluate on what they got. Otherwise each client reads its own test rows
    (``blank_own_target`` blanks the target there).
    """
    if rank == 0 and from_querier:
        await_sends(transport, post_evidence(transport, clients, test, lo, hi, target))
    mine = [c for c in clients if c.rank == rank]
    if not mine:
        return {}
    if from_querier:
        return receive_evidence(transport, mine[0])
    return own_evidence(own, lo, hi, target if blank_own_target else None)


def own_evidence(own: Any, lo: int, hi: int, blank: str | None = None) -> Columns:
    """A client's own test rows ``lo:hi`` as columns (the ``blank`` column set to NaN)."""
    cols = {f: own.x_test[lo:hi, j] for j, f in enumerate(own.features)}
    if blank is not None and blank in cols:
        cols[blank] = np.full(hi - lo, np.nan)
    return cols


# Waiting for a peer that computes: sleep between polls, from POLL_MIN_S doubling to POLL_MAX_S,
# then longer as the wait lasts (mpifc.runtime.watchdog.backoff). On an oversubscribed node (more
# ranks than cores) a busy-waiting rank takes CPU time from the very ranks it waits for; a poll
# every <= 1 ms costs little latency beside a batch's pass.
POLL_MIN_S = 20e-6
POLL_MAX_S = 1e-3


def await_messages(transport: Any, sources: list[int], kind: Any) -> list[tuple[int, np.ndarray]]:
    """One ``kind`` array from each of ``sources``, taken in arrival order (polling with short
    sleeps, see :data:`POLL_MAX_S`); returns ``[(source, array)]`` in arrival order.

    Raises:
        DeadlineExceeded: when the transport's deadline passes first (names the missing ranks).
    """
    left = list(sources)
    got: list[tuple[int, np.ndarray]] = []
    start = time.perf_counter()
    sleep = POLL_MIN_S
    try:
        while left:
            for src in list(left):
                ok, value = transport.try_recv(src, kind)
                if ok:
                    if not isinstance(value, np.ndarray):
                        raise UserError(f"rank {transport.rank}: {kind.name!r} from rank {src} is not an array")
                    left.remove(src)
                    got.append((src, value))
                    sleep = POLL_MIN_S
            if not left:
                break
            if time.perf_counter() - start > transport.deadline:
                from mpifc.runtime.transport import DeadlineExceeded

                raise DeadlineExceeded(f"deadline of {transport.deadline:g} s passed waiting for a {kind.name!r} "
                                       f"message from rank(s) {left} (rank {transport.rank})")
            # what this rank waits for, carried by its heartbeats (mpifc.runtime.liveness)
            transport.awaiting = (left[0] if len(left) == 1 else -1, kind.kind_id)
            time.sleep(sleep)
            sleep = backoff(sleep, time.perf_counter() - start, POLL_MAX_S)
    finally:
        transport.awaiting = None
    return got


def node_width(fc: FederatedCircuit, nid: int, query: Query) -> int:
    """Columns of node ``nid``'s value in ``query``."""
    t = query.expand_target
    return query.n_classes if t is not None and t in fc.nodes[nid].scope else 1


def query_payload_bytes(fc: FederatedCircuit, batch: int, query: Query = Query()) -> int:
    """Closed form: payload bytes of one upward pass over ``batch`` samples (float64)."""
    return sum(8 * batch * node_width(fc, nid, query) for ids in fc.rank_edges().values() for nid in ids)


def await_sends(transport: Any, pending: list[Any]) -> None:
    """Wait until every pending send is delivered, polling with short sleeps like
    :func:`await_messages` (not busy-waiting inside MPI: a rank that is a batch ahead must not
    take the core from the rank its receiver still waits for).

    Raises:
        DeadlineExceeded: when the transport's deadline passes first.
    """
    start = time.perf_counter()
    sleep = POLL_MIN_S
    try:
        for p in pending:
            while not p.done() and time.perf_counter() - start <= transport.deadline:
                kind = getattr(p, "kind", None)  # what this rank waits for, carried by its heartbeats
                transport.awaiting = (getattr(p, "dest", -1), kind.kind_id if kind is not None else 0)
                time.sleep(sleep)
                sleep = backoff(sleep, time.perf_counter() - start, POLL_MAX_S)
            p.wait()  # at once when complete; past the deadline the transport's wait raises, naming the peer
    finally:
        transport.awaiting = None
    pending.clear()


def upward_pass(transport: Any, fc: FederatedCircuit, rank: int, cols: Columns, batch: int,
                query: Query = Query(), values: dict[int, np.ndarray] | None = None,
                sends: list[Any] | None = None, terms: Any = None) -> np.ndarray | None:
    """Run one upward pass; returns the root's ``(batch, m)`` log-values on the root's rank.

    Args:
        cols: this rank's evidence ``{feature: (batch,)}`` (only leaves on this rank read it).
        values: if given, filled with every value this rank computed or received (for EM).
        sends: if given, the bundles to parent ranks are sent without waiting and their pending
            sends appended here (the caller waits on them; a pipelined query loop does so after
            starting its next batch). Otherwise each send completes before returning.
        terms: a class query's :class:`~mpifc.fedpc.class_terms.ClassTerms` after its set-up
            pass: the nodes it holds terms of are carried as row terms.
    """
    edges = fc.rank_edges()
    values = {} if values is None else values
    incoming = {src: ids for (src, dst), ids in edges.items() if dst == rank}
    # Bundles are taken in arrival order (a fast child is not kept waiting behind a slow one).
    for src, flat in await_messages(transport, sorted(incoming), P.VALUES) if incoming else []:
        ids = incoming[src]
        widths = [node_width(fc, nid, query) if terms is None else terms.width(nid) for nid in ids]
        if flat.size != batch * sum(widths):
            raise UserError(f"rank {rank}: bundle from rank {src} has {flat.size} values, expected "
                            f"{batch * sum(widths)} for nodes {ids}")
        off = 0
        for nid, m in zip(ids, widths):
            values[nid] = flat[off: off + batch * m].reshape(batch, m)
            off += batch * m
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
    rows = terms.leaf_rows(cols, batch) if terms is not None else {}
    for nid in mine:
        node = fc.nodes[nid]
        if nid in rows:
            values[nid] = rows[nid]
        elif node.op == LEAF:
            values[nid] = leaf_values(node, cols, query)
        elif terms is not None and nid in terms.logt:
            values[nid] = terms.combine(nid, [values[c] for c in node.children])
        elif terms is not None:
            values[nid] = combine(node, [terms.dense(c, values[c]) if c in terms.logt else values[c]
                                         for c in node.children])
        else:
            values[nid] = combine(node, [values[c] for c in node.children])
    for (src, dst), ids in sorted(edges.items()):
        if src != rank:
            continue
        bundle = np.concatenate([np.ascontiguousarray(values[nid], dtype=np.float64).reshape(-1) for nid in ids])
        if sends is None:
            transport.send(bundle, dst, P.VALUES)
        else:
            sends.append(transport.isend(bundle, dst, P.VALUES))
    root = fc.nodes[fc.root]
    if root.rank != rank:
        return None
    if terms is not None and fc.root in terms.logt:
        return terms.dense(fc.root, values[fc.root])
    return values[fc.root]


def warm_up(fc: FederatedCircuit, rank: int, query: Query = Query(), rows: int = 2, terms: Any = None) -> None:
    """Evaluate this rank's nodes once on ``rows`` all-missing rows, without messages (values of
    children on other ranks are zeros), so that lazy imports and first-call set-up (scipy's
    logsumexp, torch kernels) happen before a timed query loop, as they have in a process that
    evaluated before. With class ``terms``: their leaves' program once, the nodes unexpanded."""
    if terms is not None:
        terms.leaf_rows({}, rows)
        query = Query()
    values: dict[int, np.ndarray] = {}
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
    features = {f for nid in mine if fc.nodes[nid].op == LEAF for f in fc.nodes[nid].leaf.features}
    cols = {f: np.full(rows, np.nan) for f in features}
    with np.errstate(all="ignore"):
        for nid in mine:
            node = fc.nodes[nid]
            if node.op == LEAF:
                values[nid] = leaf_values(node, cols, query)
            else:
                kids = [values[c] if c in values else np.zeros((rows, node_width(fc, c, query)))
                        for c in node.children]
                values[nid] = combine(node, kids)


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
