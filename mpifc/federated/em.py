"""Exact EM on a federated circuit's structure: upward values, downward per-sample flows.

The flow of a node is the posterior expected count of each sample passing through it:
``f_root = 1``; a sum ``s`` gives child ``c`` the share ``f_s · w_c · exp(v_c - v_s)``; a product
passes its flow to every child. The M-step sets each sum's weights proportional to the summed
shares, and each leaf PC runs its own M-step on its rows weighted by its flow
(``em_statistics(x, sample_weight=flow)``). Every quantity is a sum over samples, so computing
it where the data lives (leaves on their clients, sums where ψ puts them) is exactly centralized
EM on the same structure. That needs every leaf to see the same rows: vertical data (aligned ids).

Horizontal and hybrid data (clients hold different rows) use pooled statistics instead
(:func:`local_statistics`, :func:`pooled_em_step`, the runtime's :mod:`mpifc.fedpc.em`):
every client evaluates the whole model on its own rows and computes the addable E-step
statistics of every node; their sum over clients is the statistics of the pooled rows.

:func:`downward` is shared by the single-process reference (:func:`em_step`) and the runtime's
distributed pass, so both do the same arithmetic.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.evaluate import Columns, leaf_input, upward
from mpifc.federated.structure import LEAF, PRODUCT, SUM, FederatedCircuit


def downward(fc: FederatedCircuit, values: dict[int, np.ndarray], flows: dict[int, np.ndarray],
             nodes: Iterable[int]) -> dict[int, np.ndarray]:
    """Push flows from ``nodes`` (processed parents first) into their children.

    Args:
        values: ``{id: (batch, 1)}`` log-values of ``nodes`` and of their children.
        flows: ``{id: (batch,)}`` flows already known (the root's ones, contributions received
            from other ranks); children's entries are created or added to in place.
        nodes: ids whose flows are complete and must be pushed down.

    Returns:
        ``{sum id: (n_children,)}`` summed child shares (the sums' M-step statistics).
    """
    stats: dict[int, np.ndarray] = {}
    for nid in sorted(nodes, reverse=True):
        node = fc.nodes[nid]
        if node.op == LEAF:
            continue
        f = flows.get(nid)
        if f is None:
            continue
        if node.op == PRODUCT:
            for c in node.children:
                flows[c] = flows[c] + f if c in flows else f.copy()
        elif node.op == SUM:
            vs = values[nid][:, 0]
            shares = np.zeros(len(node.children))
            for i, c in enumerate(node.children):
                with np.errstate(divide="ignore", invalid="ignore"):
                    share = f * node.weights[i] * np.exp(values[c][:, 0] - vs)
                share = np.nan_to_num(share, nan=0.0)
                shares[i] = share.sum()
                flows[c] = flows[c] + share if c in flows else share
            stats[nid] = shares
        else:
            raise UserError(f"EM is not defined for {node.op} node {nid}")
    return stats


def update_sums(fc: FederatedCircuit, stats: dict[int, np.ndarray]) -> None:
    """M-step of the sum nodes: weights ∝ summed shares (unchanged if a sum got no flow)."""
    for nid, s in stats.items():
        tot = s.sum()
        if tot > 0:
            fc.nodes[nid].weights = s / tot


def update_leaf(fc: FederatedCircuit, nid: int, cols: Columns, flow: np.ndarray) -> None:
    """M-step of one leaf PC on its rows weighted by ``flow`` ``(n_rows,)``."""
    node = fc.nodes[nid]
    model = node.leaf.model
    stats = model.em_statistics(leaf_input(node, cols), sample_weight=flow)
    model.apply_em(stats, step_size=1.0)


def em_step(fc: FederatedCircuit, cols: Columns) -> float:
    """One centralized EM iteration on rows ``cols``; returns the mean log-likelihood before it (nats)."""
    n = len(next(iter(cols.values())))
    values = upward(fc, cols)
    flows = {fc.root: np.ones(n)}
    nodes = fc.reachable()
    stats = downward(fc, values, flows, nodes)
    update_sums(fc, stats)
    for nid in nodes:
        if fc.nodes[nid].op == LEAF:
            update_leaf(fc, nid, cols, flows[nid])
    return float(values[fc.root][:, 0].mean())


# -- pooled-statistics EM (horizontal and hybrid data) -------------------------------------------
# In horizontal and hybrid FL each client holds *different rows*, so no per-sample flow can pass
# between ranks: a root sum mixing the clients' PCs must weigh every component on every row.
# Instead, every client evaluates the whole (small) model on its own rows and computes the
# E-step statistics of every component; those are sums over rows, so adding them over clients
# gives exactly the statistics of the pooled rows (features a client does not hold are NaN,
# i.e. marginalised, exactly as in centralized EM on the pooled table). What they reveal: per
# component, aggregates over one client's rows (expected counts per sum edge, and the leaf
# learner's weighted sufficient statistics, e.g. weighted counts, sums and sums of squares).


@dataclass
class LocalStatistics:
    """E-step statistics of one shard of rows (addable over shards).

    Attributes:
        sums: ``{sum id: (n_children,)}`` expected counts per sum edge.
        leaves: ``{leaf id: stats}`` the leaf model's own addable statistics (``em_statistics``
            with the leaf's flow as sample weight).
        log_likelihood: ``Σ_rows log p(row)`` before the M-step (nats).
        n: rows in the shard.
    """

    sums: dict[int, np.ndarray]
    leaves: dict[int, Any]
    log_likelihood: float
    n: float

    def __add__(self, other: "LocalStatistics") -> "LocalStatistics":
        return LocalStatistics({k: v + other.sums[k] for k, v in self.sums.items()},
                               {k: v + other.leaves[k] for k, v in self.leaves.items()},
                               self.log_likelihood + other.log_likelihood, self.n + other.n)


def check_em_supported(fc: FederatedCircuit) -> None:
    """Raise :class:`UserError` naming the node unless every reachable node supports EM."""
    for nid in fc.reachable():
        node = fc.nodes[nid]
        if node.op not in (SUM, PRODUCT, LEAF):
            raise UserError(f"--refine em: EM is not defined for {node.op} node {nid} "
                            f"(FC[DT] averages classifiers; it has no likelihood to maximise)")
        if node.op == LEAF:
            model = node.leaf.model
            if model is None:
                raise UserError(f"--refine em: leaf node {nid} (client {node.leaf.client}) has no model")
            # a model received and not rebuilt answers from its class (rebuilding a wide PC costs
            # seconds, and the server of a training job may not need it rebuilt at all)
            asked = getattr(model, "model_class", None)
            target = (asked() or model) if callable(asked) else model
            if not (callable(getattr(target, "em_statistics", None)) and callable(getattr(target, "apply_em", None))):
                raise UserError(f"--refine em: leaf node {nid} (client {node.leaf.client}, learner "
                                f"{node.leaf.learner or type(model).__name__!r}) has no addable EM statistics "
                                f"(em_statistics/apply_em); use learnspn, ratspn, einet or factorized")


def local_statistics(fc: FederatedCircuit, cols: Columns) -> LocalStatistics:
    """E-step on one shard of rows: statistics of EVERY node (features absent from ``cols`` are
    marginalised)."""
    n = len(next(iter(cols.values())))
    values = upward(fc, cols)
    flows = {fc.root: np.ones(n)}
    nodes = fc.reachable()
    sums = downward(fc, values, flows, nodes)
    leaves = {}
    for nid in nodes:
        node = fc.nodes[nid]
        if node.op == LEAF:
            stats = node.leaf.model.em_statistics(leaf_input(node, cols), sample_weight=flows.get(nid, np.zeros(n)))
            if not callable(getattr(stats, "to_arrays", None)):
                raise UserError(f"--refine em: the statistics of leaf node {nid} ({type(stats).__name__}) "
                                f"are not addable arrays (no to_arrays)")
            leaves[nid] = stats
    return LocalStatistics(sums, leaves, float(values[fc.root][:, 0].sum()), float(n))


def apply_statistics(fc: FederatedCircuit, stats: LocalStatistics) -> None:
    """M-step of every node from (pooled) statistics."""
    update_sums(fc, stats.sums)
    for nid, st in stats.leaves.items():
        fc.nodes[nid].leaf.model.apply_em(st, step_size=1.0)


def pooled_em_step(fc: FederatedCircuit, shards: list[Columns]) -> float:
    """One EM iteration from per-shard statistics summed in shard order (the single-process
    mirror of the distributed horizontal/hybrid EM); returns the pooled mean log-likelihood
    before the step. Equals :func:`em_step` on the concatenated rows."""
    total = None
    for cols in shards:
        st = local_statistics(fc, cols)
        total = st if total is None else total + st
    apply_statistics(fc, total)
    return total.log_likelihood / total.n


def stats_to_vector(stats: Any) -> np.ndarray:
    """A leaf's statistics as one flat float64 vector (keys of ``to_arrays`` sorted)."""
    arrays = stats.to_arrays()
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).reshape(-1) for k in sorted(arrays)]) \
        if arrays else np.zeros(0)


def stats_size(stats: Any) -> int:
    return int(sum(np.asarray(v).size for v in stats.to_arrays().values()))


def stats_from_vector(template: Any, vec: np.ndarray) -> Any:
    """Inverse of :func:`stats_to_vector`, shaped like ``template`` (same model's statistics)."""
    arrays = template.to_arrays()
    out, off = {}, 0
    for k in sorted(arrays):
        shape = np.asarray(arrays[k]).shape
        size = int(np.prod(shape, dtype=np.int64))
        out[k] = np.asarray(vec[off: off + size], dtype=np.float64).reshape(shape)
        off += size
    if off != len(vec):
        raise UserError(f"EM statistics: got {len(vec)} values, expected {off} for {type(template).__name__}")
    cls = type(template)
    if callable(getattr(cls, "from_arrays", None)):
        return cls.from_arrays(out)
    if dataclasses.is_dataclass(cls) and {f.name for f in dataclasses.fields(cls)} == set(out):
        return cls(**out)
    raise UserError(f"EM statistics {cls.__name__} cannot be rebuilt from arrays (no from_arrays)")


def sum_ids(fc: FederatedCircuit) -> list[int]:
    return [nid for nid in fc.reachable() if fc.nodes[nid].op == SUM]


def pack_sums(fc: FederatedCircuit, stats: LocalStatistics) -> np.ndarray:
    """Sum-edge counts of every reachable sum (ascending id), then ``[log_likelihood, n]``."""
    parts = [stats.sums[nid] for nid in sum_ids(fc)]
    return np.concatenate(parts + [np.array([stats.log_likelihood, stats.n])])


def unpack_sums(fc: FederatedCircuit, vec: np.ndarray) -> tuple[dict[int, np.ndarray], float, float]:
    out, off = {}, 0
    for nid in sum_ids(fc):
        k = len(fc.nodes[nid].children)
        out[nid] = vec[off: off + k].copy()
        off += k
    if off + 2 != len(vec):
        raise UserError(f"EM sum statistics: got {len(vec)} values, expected {off + 2}")
    return out, float(vec[off]), float(vec[off + 1])


def sum_statistics_in_order(items: list[Any]) -> Any:
    """``items[0] + items[1] + ...`` left to right (a fixed order keeps results bitwise stable)."""
    total = items[0]
    for it in items[1:]:
        total = total + it
    return total
