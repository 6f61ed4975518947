"""ψ strategies: which rank evaluates each inner node.

Leaves always stay on their client's rank. Two strategies for the inner nodes:

* ``flat``: every inner node on the server rank (0). Simplest; the root's fan-in is every rank.
* ``tree``: the root's children are split into S contiguous blocks; each block gets a sum (or
  product, if the root is a product) node on its own intermediate server rank, and the root on
  rank 0 combines S vectors (one, with S = 1: the intermediate server then reduces every client
  and rank 0 receives a single vector). Sum weights are re-associated exactly (``w_g = Σ_{i∈g} w_i`` above,
  ``w_i / w_g`` below), so the distribution is unchanged. Every other inner node goes to the lowest
  server among its parents' ranks, so server→server messages only go from lower to higher server
  index and the rank graph stays acyclic (no deadlock in the upward pass).

Either way the root ends on rank 0, the querier that answers queries: where the circuit's root
would sit elsewhere (a one-client federation whose only PC is the root, or a tree with one
block), a pass-through root on rank 0 takes it as its single child (a sum with weight 1, or an
average for FC[DT]), so the distribution is unchanged.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.structure import AVERAGE, LEAF, SUM, FederatedCircuit

ASSIGN_STRATEGIES = ("flat", "tree")


def client_rank_map(clients: Sequence[int], n_servers: int) -> dict[int, int]:
    """Client index → rank: servers take ranks ``0..n_servers``, clients follow in index order."""
    return {c: 1 + n_servers + i for i, c in enumerate(sorted(clients))}


def required_ranks(n_clients: int, strategy: str, n_servers: int) -> int:
    """Ranks a job needs: the root server, the intermediate servers (tree) and one per client."""
    return 1 + (n_servers if strategy == "tree" else 0) + n_clients


def assign_flat(fc: FederatedCircuit, server: int = 0) -> FederatedCircuit:
    """Every inner node on ``server``."""
    for n in fc.nodes:
        if n.op != LEAF:
            n.rank = server
    return fc


def assign_tree(fc: FederatedCircuit, servers: Sequence[int], root_rank: int = 0) -> FederatedCircuit:
    """Reduction-tree ψ over intermediate ``servers`` (see module doc); restructures the root."""
    servers = list(servers)
    if not servers:
        raise UserError("--assign tree needs --servers >= 1")
    root = fc.nodes[fc.root]
    if root.op == LEAF:  # nothing to reduce: assign() puts a pass-through root on rank 0
        fc.meta["assign"] = "tree"
        fc.meta["servers"] = servers
        return fc
    if root.op == AVERAGE:
        raise UserError("--assign tree is not supported for FC[DT] (an average of averages over "
                        "unequal groups is not the average); use --assign flat")
    children = list(root.children)
    blocks = np.array_split(np.arange(len(children)), min(len(servers), len(children)))
    new_children, new_w = [], []
    for b in blocks:
        ch = [children[i] for i in b]
        tot = float(root.weights[b].sum()) if root.op == SUM else 0.0
        if len(ch) == 1:
            nid = ch[0]
        else:
            w = root.weights[b] / tot if root.op == SUM else None
            nid = fc.add_inner(root.op, ch, w)
        new_children.append(nid)
        new_w.append(tot)
    # Also with one block: the root stays on root_rank and combines that block's single vector.
    fc.root = fc.add_inner(root.op, new_children, new_w if root.op == SUM else None)
    fc.compact()
    # compact() renumbers; map block membership through the surviving nodes' identity.
    root = fc.nodes[fc.root]
    block_of_new = {c: g for g, c in enumerate(root.children)}
    parents = fc.parents()
    for nid in reversed(fc.reachable()):
        n = fc.nodes[nid]
        if n.op == LEAF:
            continue
        if nid == fc.root:
            n.rank = root_rank
        elif nid in block_of_new:
            n.rank = servers[block_of_new[nid]]
        else:
            n.rank = min(fc.nodes[p].rank for p in parents[nid])
    fc.meta["assign"] = "tree"
    fc.meta["servers"] = servers
    return fc


def root_on_rank(fc: FederatedCircuit, rank: int = 0) -> FederatedCircuit:
    """Put the root on ``rank``: if it sits elsewhere (a leaf on its client's rank, say), a
    pass-through root on ``rank`` takes it as its only child: a sum with weight 1, or an average
    for FC[DT] (the mean of one classifier). The distribution is unchanged."""
    root = fc.nodes[fc.root]
    if root.rank != rank:
        if fc.meta.get("kind") == "fcdt":
            fc.root = fc.add_inner(AVERAGE, [fc.root], rank=rank)
        else:
            fc.root = fc.add_inner(SUM, [fc.root], [1.0], rank=rank)
    return fc


def assign(fc: FederatedCircuit, strategy: str = "flat", n_servers: int = 0) -> FederatedCircuit:
    """Apply ψ strategy ``strategy`` (servers are ranks ``1..n_servers``), put the root on rank 0
    (:func:`root_on_rank`) and validate."""
    if strategy == "flat":
        assign_flat(fc)
        fc.meta["assign"] = "flat"
    elif strategy == "tree":
        assign_tree(fc, list(range(1, n_servers + 1)))
    else:
        raise UserError(f"unknown --assign {strategy!r}; expected one of {', '.join(ASSIGN_STRATEGIES)}")
    root_on_rank(fc, 0)
    fc.validate()
    return fc
