"""Distributed MPE and sampling on a trained FC (``mpifc evaluate --query mpe|sample``).

MPE, per batch of test rows (the target, if any, blanked; it is what MPE predicts):

1. upward max-product pass (``fc.query.max_values``): like the likelihood pass of
   :mod:`mpifc.fedpc.query`, but every leaf's value is its log-likelihood at its own MPE
   completion and sums take the max of ``log w_i + v_i``. Payload: ``8 · batch`` bytes per node
   crossing a rank link (the same closed form as a likelihood pass).
2. downward decision pass (``fc.query.decisions``): the rank of each sum picks the arg-max child
   per sample; a rank sends each child rank one uint8 mask per crossing node (``batch`` bytes per
   node and link): whether the node is in the sample's induced tree.
3. each client completes its own features with its active leaves (``fc.query.answer`` to the
   querier, ``8 · batch · d_i`` bytes): only entries its evidence lacks are filled; entries it
   observed are sent as NaN (a vertical client's own test values never leave it). The querier
   keeps its own evidence elsewhere.

Sampling (``--n-samples N``, unconditional): no upward pass is needed. The ranks holding sums
draw the choices per sample with per-node streams (:func:`mpifc.federated.mpe.node_rng`), send
the decisions down, and each client samples its own features for its active samples and sends
them to the querier. Result == :func:`mpifc.federated.mpe.sample_seeded` for the same seed and
batch, whatever ψ.

``--gathered`` (no ``--distributed``) runs :func:`~mpifc.federated.mpe.mpe_reference` /
:func:`~mpifc.federated.mpe.sample_seeded` on rank 0. The answer is written to ``--out FILE.h5``
(dataset ``x`` ``(n, D)`` over ``feature_order``, attrs ``query``, ``features``).
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.shards import load_manifest, read_client, read_test
from mpifc.errors import UserError
from mpifc.federated.mpe import (
    leaf_mpe,
    leaf_sample,
    max_combine,
    mpe_reference,
    mpe_route,
    node_rng,
    route_down,
    sample_route,
    sample_seeded,
    write_leaf,
)
from mpifc.federated.serialize import load_fc
from mpifc.federated.structure import LEAF, FederatedCircuit
from mpifc.fedpc import protocol as P
from mpifc.atomic import OutputKind, atomic_write_bytes
from mpifc.fedpc.checks import check_model_matches, check_root_on_querier
from mpifc.fedpc.devices import device_for, place_for_rank
from mpifc.fedpc.query import batches, exchange_evidence


# -- passes --------------------------------------------------------------------------------------
def max_upward_pass(t: Any, fc: FederatedCircuit, rank: int, cols: dict[str, np.ndarray], batch: int
                    ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Max-product upward pass; returns ``(values, completions)`` known on this rank."""
    edges = fc.rank_edges()
    values: dict[int, np.ndarray] = {}
    comps: dict[int, np.ndarray] = {}
    for (src, dst), ids in sorted(edges.items()):
        if dst != rank:
            continue
        flat = t.recv(src, P.MAX_VALUES)
        if flat.size != batch * len(ids):
            raise UserError(f"rank {rank}: max-value bundle from rank {src} has {flat.size} values, "
                            f"expected {batch * len(ids)}")
        for i, nid in enumerate(ids):
            values[nid] = flat[i * batch:(i + 1) * batch]
    for nid in fc.reachable():
        node = fc.nodes[nid]
        if node.rank != rank:
            continue
        if node.op == LEAF:
            comps[nid], values[nid] = leaf_mpe(node, cols)
        else:
            values[nid] = max_combine(node, [values[c] for c in node.children])
    for (src, dst), ids in sorted(edges.items()):
        if src == rank:
            t.send(np.concatenate([np.ascontiguousarray(values[nid], dtype=np.float64) for nid in ids]), dst,
                   P.MAX_VALUES)
    return values, comps


def decision_pass(t: Any, fc: FederatedCircuit, rank: int, batch: int, route: Any) -> dict[int, np.ndarray]:
    """Downward pass of per-sample masks; returns the masks of this rank's nodes.

    ``route(node, active) -> [child masks]`` runs for this rank's inner nodes only.
    """
    edges = fc.rank_edges()
    active: dict[int, np.ndarray] = {}
    if fc.nodes[fc.root].rank == rank:
        active[fc.root] = np.ones(batch, dtype=bool)
    for (src, dst), ids in sorted(edges.items()):
        if src != rank:
            continue
        flat = t.recv(dst, P.DECISIONS).astype(bool)
        for i, nid in enumerate(ids):
            part = flat[i * batch:(i + 1) * batch]
            active[nid] = active[nid] | part if nid in active else part.copy()
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
    route_down(fc, mine, active, route)
    for (src, dst), ids in sorted(edges.items()):
        if dst == rank:
            t.send(np.concatenate([active.get(nid, np.zeros(batch, dtype=bool)) for nid in ids]).astype(np.uint8),
                   src, P.DECISIONS)
    return {nid: active[nid] for nid in mine if nid in active}


def query_payload(fc: FederatedCircuit, batch: int, query: str, n_client_features: int) -> dict[str, int]:
    """Closed-form payload bytes of one batch: ``{kind: bytes}``."""
    crossing = sum(len(ids) for ids in fc.rank_edges().values())
    out = {P.DECISIONS.name: batch * crossing, P.ANSWER.name: 8 * batch * n_client_features}
    if query == "mpe":
        out[P.MAX_VALUES.name] = 8 * batch * crossing
    return out


# -- job -------------------------------------------------------------------------------------------
def query_rank(ctx: Any, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """This rank's part of ``evaluate --query mpe|sample``; returns the metrics on rank 0."""
    if cfg["query"] not in ("mpe", "sample"):
        raise UserError(f"unknown --query {cfg['query']!r}")
    if not cfg["distributed"]:
        if ctx.rank != 0:
            return None
        return _gathered(cfg, device_for(ctx, load_fc(cfg["model"], load_models=False), gathered=True))

    ctx.enter("read")
    manifest = load_manifest(cfg["dir"])
    fc = load_fc(cfg["model"], load_models={ctx.rank})
    place_for_rank(ctx, fc)
    check_model_matches(fc, manifest, cfg["model"])
    fc.validate()
    check_root_on_querier(fc, cfg["model"])
    t = ctx.transport
    client_at = {c.rank: c for c in fc.clients.values()}
    clients = sorted(fc.clients.values(), key=lambda c: c.index)
    mpe = cfg["query"] == "mpe"
    target = fc.target if mpe else None
    mode = cfg.get("evidence") or "auto"
    from_querier = mpe and (mode == "querier" or (mode == "auto" and manifest.setting != "vertical"))
    test = read_test(cfg["dir"]) if ctx.rank == 0 and mpe else None
    own = read_client(cfg["dir"], client_at[ctx.rank].index) if (mpe and ctx.rank in client_at
                                                                  and not from_querier) else None
    n = int(manifest.test["n"]) if mpe else int(cfg["n_samples"])
    t.barrier()
    if ctx.rank not in fc.ranks():
        return None
    ctx.ledger.set_phase("query-setup")
    if mpe and not from_querier:
        from mpifc.federated.one_pass import ids_digest

        if ctx.rank == 0:
            want = ids_digest(test.ids)
            for c in clients:
                got = t.recv_obj(c.rank, P.QUERY_DECLARE)
                if got["n_test"] != n or got["ids_digest"] != want:
                    raise UserError(f"client {c.index} (rank {c.rank}) holds {got['n_test']} test rows whose ids "
                                    f"do not match {cfg['dir']}/test.h5 ({n} rows) in order")
        if own is not None:
            t.send_obj({"n_test": int(own.x_test.shape[0]), "ids_digest": ids_digest(own.ids_test)}, 0,
                       P.QUERY_DECLARE)
    ctx.ledger.set_phase("query")
    ctx.enter("query")
    t0 = time.perf_counter()
    col = {f: j for j, f in enumerate(fc.features)}
    out = np.full((n, len(fc.features)), np.nan) if ctx.rank == 0 else None
    for b, (lo, hi) in enumerate(batches(n, int(cfg["batch"]))):
        k = hi - lo
        if mpe:
            cols = exchange_evidence(t, ctx.rank, clients, test, own, lo, hi, target, from_querier,
                                     blank_own_target=True)
            values, comps = max_upward_pass(t, fc, ctx.rank, cols, k)
            active = decision_pass(t, fc, ctx.rank, k,
                                   lambda node, a: mpe_route(node, [values[c] for c in node.children], a))
        else:
            comps = {}
            active = decision_pass(t, fc, ctx.rank, k,
                                   lambda node, a: sample_route(node, a, node_rng(cfg["seed"], b, node.id)))
        if ctx.rank in client_at:
            c = client_at[ctx.rank]
            mycol = {f: j for j, f in enumerate(c.features)}
            part = np.full((k, len(c.features)), np.nan)
            for nid, a in sorted(active.items()):
                node = fc.nodes[nid]
                if node.op != LEAF:
                    continue
                if mpe:
                    write_leaf(part, node, mycol, a, comps[nid], rows_are_active=False)
                else:
                    write_leaf(part, node, mycol, a, leaf_sample(node, a, node_rng(cfg["seed"], b, nid)),
                               rows_are_active=True)
            if mpe:  # never send back what the client observed: only the completed entries
                observed = np.stack([~np.isnan(cols.get(f, np.full(k, np.nan))) for f in c.features], axis=1)
                part[observed] = np.nan
            t.send(part, 0, P.ANSWER)
        if ctx.rank == 0:
            for c in clients:
                part = t.recv(c.rank, P.ANSWER)
                for j, f in enumerate(c.features):
                    got = ~np.isnan(part[:, j])
                    out[lo:hi][got, col[f]] = part[got, j]
    if ctx.rank != 0:
        return None
    seconds = time.perf_counter() - t0
    if mpe:
        evidence = test.x.copy()
        if target is not None:
            evidence[:, test.features.index(target)] = np.nan
        ev = evidence[:, [test.features.index(f) for f in fc.features]]
        out = np.where(np.isnan(ev), out, ev)
    return _finish(fc, out, cfg, "distributed", seconds, test)


def _gathered(cfg: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    from mpifc.federated.placement import place_models

    manifest = load_manifest(cfg["dir"])
    fc = load_fc(cfg["model"], load_models=True)
    place_models(fc, device)
    check_model_matches(fc, manifest, cfg["model"])
    fc.validate(require_models=True)
    t0 = time.perf_counter()
    test = None
    if cfg["query"] == "mpe":
        test = read_test(cfg["dir"])
        parts = []
        for lo, hi in batches(len(test.x), int(cfg["batch"])):
            cols = {f: test.x[lo:hi, j].copy() for j, f in enumerate(test.features)}
            if fc.target is not None:
                cols[fc.target][:] = np.nan
            parts.append(mpe_reference(fc, cols))
        out = np.concatenate(parts) if parts else np.zeros((0, len(fc.features)))
    else:
        out = sample_seeded(fc, int(cfg["n_samples"]), int(cfg["seed"]), int(cfg["batch"]))
    return _finish(fc, out, cfg, "gathered", time.perf_counter() - t0, test)


def _finish(fc: FederatedCircuit, out: np.ndarray, cfg: dict[str, Any], mode: str, seconds: float,
            test: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"mode": mode, "query": cfg["query"], "n": int(out.shape[0]),
                           "query_seconds": seconds, "out": cfg.get("out")}
    if cfg["query"] == "mpe" and fc.target is not None and test is not None:
        y = test.x[:, test.features.index(fc.target)]
        res["mpe_accuracy"] = float((out[:, fc.features.index(fc.target)] == y).mean()) if len(y) else None
    if cfg["query"] == "sample":
        res["seed"] = int(cfg["seed"])
    if cfg.get("out"):
        import h5py

        buf = io.BytesIO()
        with h5py.File(buf, "w") as f:
            f.create_dataset("x", data=out)
            f.attrs["query"] = cfg["query"]
            f.attrs["mode"] = mode
            f.attrs["features"] = json.dumps(list(fc.features))
        atomic_write_bytes(cfg.get("_stage", Path)(cfg["out"]), buf.getvalue())
    return res


def is_rows_output(path: str | Path) -> bool:
    """Whether ``path`` is an earlier ``evaluate --out`` file: HDF5 with a dataset ``x`` and the
    attribute ``query`` (``mpe`` or ``sample``)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return "x" in f and str(f.attrs.get("query")) in ("mpe", "sample")
    except Exception:  # noqa: BLE001 - an unreadable file is simply not one
        return False


ROWS_OUTPUT = OutputKind("an evaluate --out file (completions or samples)", is_rows_output)
