"""Exact distributed EM for horizontal and hybrid FCs: pooled E-step statistics, no rows moved.

In horizontal and hybrid data every client holds *different rows* (data_prep's hybrid splits
rows as in horizontal and features into shared and private blocks), so the vertical EM of
:mod:`mpifc.fedpc.train` (per-sample flows between ranks holding the same rows) does not
apply. Instead, per iteration:

1. ``fc.em.params`` (server → every client): the whole FC with every leaf model's parameters
   (structure, ψ, weights and the leaf PCs as HDF5 bytes). Every client thus sees every other
   client's PC parameters, as the gathered model file does.
2. Each client evaluates ALL components on its OWN rows (features it does not hold are NaN,
   i.e. marginalised) and computes the E-step statistics of every node
   (:func:`mpifc.federated.em.local_statistics`).
3. ``fc.em.sum_stats`` (client → server): expected counts of every sum edge over the client's
   rows, plus its log-likelihood sum and row count (``8 · (Σ_sums n_children + 2)`` bytes).
4. ``fc.em.leaf_stats`` (client → owner client): for each leaf owned by another client, the
   leaf learner's addable statistics over this client's rows (flow-weighted counts, sums, sums
   of squares, edge counts of the leaf PC's own sums), one bundle per owner, leaves in ascending
   id (``8 · Σ stats_size`` bytes). The owner adds them to its own in client-index order (the
   reduce) and runs its leaves' M-step.
5. ``fc.em.leaf`` (owner → server): the refined leaf PC (HDF5 bytes). The server runs the sums'
   M-step.

What leaves a client: model parameters and, per component, sums over its rows (never a row, a
per-sample value or a per-sample flow). The statistics sum over clients is exactly the
statistics of the pooled rows, so the result equals centralized EM on the same structure
(:func:`mpifc.federated.em.em_step` on the concatenated rows; asserted in
``tests/federated/test_em_pooled.py``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.em import (
    check_em_supported,
    local_statistics,
    pack_sums,
    stats_from_vector,
    stats_to_vector,
    sum_statistics_in_order,
    unpack_sums,
    update_sums,
)
from mpifc.federated.serialize import fc_from_bytes, fc_to_bytes
from mpifc.federated.structure import LEAF, FederatedCircuit
from mpifc.fedpc import protocol as P


def fc_with_models_to_bytes(fc: FederatedCircuit) -> np.ndarray:
    """The whole FC, leaf models included, as HDF5 bytes ``(n_bytes,)`` uint8."""
    return fc_to_bytes(fc, with_models=True)


def fc_with_models_from_bytes(data: np.ndarray) -> FederatedCircuit:
    return fc_from_bytes(data, load_models=True)


def _leaf_ids(fc: FederatedCircuit) -> list[int]:
    return [nid for nid in fc.reachable() if fc.nodes[nid].op == LEAF]


def pooled_server_em(ctx: Any, cfg: dict[str, Any], fc: FederatedCircuit, ranks: dict[int, int]) -> list[float]:
    """Server side (rank 0): broadcast parameters, reduce the sums' statistics, M-step the sums,
    collect the refined leaves. Returns the pooled mean train log-likelihood before each step."""
    from mpifc.federated.wire_format import model_from_bytes

    check_em_supported(fc)
    t = ctx.transport
    trace: list[float] = []
    leaves = _leaf_ids(fc)
    for _ in range(int(cfg["em_iters"])):
        blob = fc_with_models_to_bytes(fc)
        for c in sorted(ranks):
            t.send(blob, ranks[c], P.EM_PARAMS)
        total = None
        for c in sorted(ranks):
            vec = t.recv(ranks[c], P.EM_SUM_STATS)
            total = vec.copy() if total is None else total + vec
        stats, ll, n = unpack_sums(fc, total)
        trace.append(ll / max(n, 1e-300))
        update_sums(fc, stats)
        for nid in leaves:
            fc.nodes[nid].leaf.model = model_from_bytes(t.recv(fc.nodes[nid].rank, P.EM_LEAF))
    return trace


def pooled_client_em(ctx: Any, cfg: dict[str, Any], index: int, data: Any, device: str | None = None) -> None:
    """Client side: local E-step for every node on this client's rows; reduce the statistics of
    its own leaves over all clients; M-step them; send them to the server. Leaf PCs that compute
    on torch do so on ``device`` (None: the CPU); statistics and models travel as CPU arrays."""
    from mpifc.federated.placement import place_models
    from mpifc.federated.wire_format import model_to_bytes

    t = ctx.transport
    me = ctx.rank
    cols = {f: data.shard.x_train[:, j] for j, f in enumerate(data.shard.features)}
    for _ in range(int(cfg["em_iters"])):
        fc = fc_with_models_from_bytes(t.recv(0, P.EM_PARAMS))
        place_models(fc, device)
        st = local_statistics(fc, cols)
        t.send(pack_sums(fc, st), 0, P.EM_SUM_STATS)
        leaves = _leaf_ids(fc)
        owners = sorted({fc.nodes[nid].rank for nid in leaves} - {me})
        pending = []
        for r in owners:
            ids = [nid for nid in leaves if fc.nodes[nid].rank == r]
            pending.append(t.isend(np.concatenate([stats_to_vector(st.leaves[nid]) for nid in ids]), r,
                                   P.EM_LEAF_STATS))
        mine = [nid for nid in leaves if fc.nodes[nid].rank == me]
        per_client = {index: {nid: st.leaves[nid] for nid in mine}}
        if mine:
            for other in sorted(fc.clients.values(), key=lambda c: c.index):
                if other.rank == me:
                    continue
                vec = t.recv(other.rank, P.EM_LEAF_STATS)
                got, off = {}, 0
                for nid in mine:
                    k = len(stats_to_vector(st.leaves[nid]))
                    got[nid] = stats_from_vector(st.leaves[nid], vec[off: off + k])
                    off += k
                if off != len(vec):
                    raise UserError(f"rank {me}: EM statistics from rank {other.rank} have {len(vec)} values, "
                                    f"expected {off}")
                per_client[other.index] = got
        for p in pending:
            p.wait()
        for nid in mine:
            total = sum_statistics_in_order([per_client[c][nid] for c in sorted(per_client)])
            model = fc.nodes[nid].leaf.model
            model.apply_em(total, step_size=1.0)
            t.send(model_to_bytes(model), 0, P.EM_LEAF)


__all__ = ["pooled_server_em", "pooled_client_em", "fc_with_models_to_bytes", "fc_with_models_from_bytes"]
