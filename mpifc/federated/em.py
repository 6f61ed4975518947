"""Exact EM on a federated circuit's structure: upward values, downward per-sample flows.

The flow of a node is the posterior expected count of each sample passing through it:
``f_root = 1``; a sum ``s`` gives child ``c`` the share ``f_s · w_c · exp(v_c - v_s)``; a product
passes its flow to every child. The M-step sets each sum's weights proportional to the summed
shares, and each leaf PC runs its own M-step on its rows weighted by its flow
(``em_statistics(x, sample_weight=flow)``). Every quantity is a sum over samples, so computing
it where the data lives (leaves on their clients, sums where ψ puts them) is exactly centralized
EM on the same structure. That needs every leaf to see the same rows: vertical data (aligned ids).

:func:`downward` is shared by the single-process reference (:func:`em_step`) and the runtime's
distributed pass, so both do the same arithmetic.
"""
from __future__ import annotations

from typing import Iterable

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
