"""One-pass training of a FedPC over MPI (Algorithm 1 with the runtime's byte-counted transport).

Rank layout: rank 0 is the root server, ranks ``1..S`` the intermediate servers of ``--assign
tree`` (idle during training: ψ only uses them at query time), then one rank per client in
manifest index order (:func:`mpifc.federated.assign.client_rank_map`). Extra ranks idle.

Protocol (all messages to or from rank 0, phases as named in the ledger):

* ``declare``: client → server ``fc.train.declare`` (names, meta-types, counts, ids digest);
  the server plans (Algorithm 1, lines 1-7) and sends each client only its own tasks.
* ``learn``: clients cluster and fit their PCs locally, then send ``fc.train.counts`` (and,
  with ``--glue cooccurrence``, ``fc.train.cluster_ids``). The server assembles the FC and infers
  every weight from the counts (lines 8-22), then applies ψ and validates it.
* ``gather``: clients send each PC as HDF5 bytes (``fc.train.model``) and their timings; the
  server writes ONE model file atomically and tells everyone it is done.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.assign import assign, client_rank_map
from mpifc.federated.one_pass import (
    ClientDeclaration,
    ClientReport,
    FederationPlan,
    OnePassBuilder,
    insert_models,
    run_client_tasks,
)
from mpifc.federated.serialize import model_from_bytes, model_to_bytes, save_fc
from mpifc.runtime import fc_protocol as P
from mpifc.runtime.fc_data import read_client_data

CLIENT_PHASES = ("read", "learn", "serialize", "em")


def client_plan(plan: FederationPlan, client: int) -> FederationPlan:
    """The part of the plan one client needs: its own tasks and declaration, nothing of others'."""
    return replace(plan, tasks=plan.tasks_for(client), declarations={client: plan.declarations[client]})


def builder_from_config(cfg: dict[str, Any]) -> OnePassBuilder:
    hp = dict(cfg.get("hyperparameters") or {})
    return OnePassBuilder(n_clusters=int(cfg["clusters"]), n_products=int(cfg["products"]), glue=cfg["glue"],
                          seed=int(cfg["seed"]), learner=cfg["learner"],
                          learners={int(k): v for k, v in (cfg.get("client_learners") or {}).items()},
                          hyperparameters=hp)


def train_rank(ctx: Any, cfg: dict[str, Any], manifest: Any) -> dict[str, Any] | None:
    """Run this rank's part of training; returns the summary dict on rank 0, else ``None``."""
    n_servers = int(cfg["servers"]) if cfg["assign"] == "tree" else 0
    ranks = client_rank_map(range(manifest.n_clients), n_servers)
    client_of = {r: c for c, r in ranks.items()}
    if ctx.rank in client_of:
        _client(ctx, cfg, client_of[ctx.rank])
        return None
    if ctx.rank == 0:
        return _server(ctx, cfg, manifest, ranks, n_servers)
    return None


# What each learner's fit imports (numpy-only learners need no torch: see factorized.py).
_LEARNER_MODULES = {"learnspn": ("torch", "mpifc.circuit.learnspn"), "ratspn": ("torch", "mpifc.circuit.ratspn"),
                    "einet": ("torch", "mpifc.circuit.einet"), "dt": ("sklearn.tree",), "factorized": ()}


def warm_up(learners: set[str], cluster: bool = True) -> None:
    """Import the heavy modules this rank will use before any timer starts: import time is not
    training time. Modules the rank does not need are not imported at all (each costs seconds
    of start-up): ``cluster`` (k-means, sklearn) only where rows are clustered, torch only for
    learners built on it.
    """
    import importlib

    import mpifc.federated.factorized  # noqa: F401

    mods = ["sklearn.cluster"] if cluster else []
    for name in sorted(learners):
        # An unknown (e.g. third-party registered) learner: import everything, as before.
        mods += _LEARNER_MODULES.get(name, ("sklearn.cluster", "torch"))
    for mod in dict.fromkeys(mods):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass  # the learner call itself reports a missing module clearly


def _client(ctx: Any, cfg: dict[str, Any], index: int) -> None:
    t = ctx.transport
    times = dict.fromkeys(CLIENT_PHASES, 0.0)
    ctx.ledger.set_phase("declare")
    t0 = time.perf_counter()
    data = read_client_data(cfg["dir"], index)
    times["read"] = time.perf_counter() - t0
    d = data.declaration
    t.send_obj({"index": d.index, "features": list(d.features), "meta_types": list(d.meta_types),
                "n_categories": list(d.n_categories), "n_rows": d.n_rows, "ids_digest": d.ids_digest},
               0, P.DECLARE)
    plan: FederationPlan = t.recv_obj(0, P.PLAN)
    # After the plan: bad input is caught before anyone pays for the heavy imports.
    warm_up({task.learner for task in plan.tasks}, cluster=any(task.n_clusters > 1 for task in plan.tasks))
    ctx.ledger.set_phase("learn")
    t0 = time.perf_counter()
    report = run_client_tasks(plan, index, data.shard.x_train, data.shard.features)
    times["learn"] = time.perf_counter() - t0
    t.send(report.counts(), 0, P.COUNTS)
    if plan.glue == "cooccurrence" and any(task.n_clusters > 0 for task in plan.tasks):
        t.send(report.cluster_ids.astype(np.int64), 0, P.CLUSTER_IDS)
    ctx.ledger.set_phase("gather")
    t0 = time.perf_counter()
    blobs = [model_to_bytes(leaf.model) for leaf in report.leaves]
    times["serialize"] = time.perf_counter() - t0
    for b in blobs:
        t.send(b, 0, P.MODEL)
    if cfg.get("refine") == "em":
        ctx.ledger.set_phase("em")
        t0 = time.perf_counter()
        _client_em(ctx, cfg, index, data, report)
        times["em"] = time.perf_counter() - t0
    t.send(np.array([times.get(p, 0.0) for p in CLIENT_PHASES]), 0, P.TIMING)
    t.recv_obj(0, P.DONE)


def _client_em(ctx: Any, cfg: dict[str, Any], index: int, data: Any, report: ClientReport) -> None:
    """Exact EM, client side: own leaves only, own rows only; sends the refined PCs at the end."""
    from mpifc.federated.em import update_leaf
    from mpifc.federated.serialize import fc_from_bytes
    from mpifc.runtime.fc_query import downward_pass, upward_pass

    t = ctx.transport
    fc = fc_from_bytes(t.recv(0, P.EM_STRUCTURE))
    insert_models(fc, {(index, r.subspace, r.cluster): r.model for r in report.leaves})
    cols = {f: data.shard.x_train[:, j] for j, f in enumerate(data.shard.features)}
    n = data.shard.x_train.shape[0]
    mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == ctx.rank and fc.nodes[nid].op == "leaf"]
    for _ in range(int(cfg["em_iters"])):
        values: dict[int, np.ndarray] = {}
        upward_pass(t, fc, ctx.rank, cols, n, values=values)
        flows, _ = downward_pass(t, fc, ctx.rank, values, n)
        for nid in mine:
            update_leaf(fc, nid, cols, flows[nid])
    for r in report.leaves:
        t.send(model_to_bytes(r.model), 0, P.MODEL)


def _server(ctx: Any, cfg: dict[str, Any], manifest: Any, ranks: dict[int, int], n_servers: int
            ) -> dict[str, Any]:
    t = ctx.transport
    busy: dict[str, float] = {}
    ctx.ledger.set_phase("declare")
    decls = []
    for c in sorted(ranks):
        raw = t.recv_obj(ranks[c], P.DECLARE)
        if int(raw["index"]) != c:
            raise UserError(f"rank {ranks[c]} declared client {raw['index']}, expected client {c}")
        decls.append(ClientDeclaration(c, tuple(raw["features"]), tuple(raw["meta_types"]),
                                       tuple(int(k) for k in raw["n_categories"]), int(raw["n_rows"]),
                                       str(raw["ids_digest"])))
    t0 = time.perf_counter()
    builder = builder_from_config(cfg)
    plan = builder.plan(decls, manifest.feature_order, manifest.target, manifest.setting)
    busy["plan"] = time.perf_counter() - t0
    if cfg.get("refine") == "em":
        if cfg["assign"] != "flat":
            raise UserError("--refine em supports --assign flat only")
        digests = {d.ids_digest for d in decls}
        if len(digests) != 1 or len({d.n_rows for d in decls}) != 1:
            raise UserError("--refine em (exact EM without moving data) needs every client to hold the "
                            "same rows in the same order (vertical data with aligned ids)")
    for c in sorted(ranks):
        t.send_obj(client_plan(plan, c), ranks[c], P.PLAN)
    # The server fits nothing: it only needs the leaf models' classes to deserialize them.
    warm_up({task.learner for task in plan.tasks} - {"dt"}, cluster=False)
    ctx.ledger.set_phase("learn")
    reports = []
    for c in sorted(ranks):
        counts = t.recv(ranks[c], P.COUNTS)
        ids = None
        if plan.glue == "cooccurrence" and any(task.n_clusters > 0 for task in plan.tasks_for(c)):
            ids = t.recv(ranks[c], P.CLUSTER_IDS)
        reports.append(ClientReport.from_counts(c, counts, plan, ids))
    t0 = time.perf_counter()
    fc = builder.assemble(plan, reports, ranks)
    assign(fc, cfg["assign"], n_servers)
    busy["assemble"] = time.perf_counter() - t0
    ctx.ledger.set_phase("gather")
    client_times = {}
    t_des = 0.0
    for rep in reports:
        c = rep.client
        models = {}
        for leaf in rep.leaves:
            blob = t.recv(ranks[c], P.MODEL)
            t0 = time.perf_counter()
            models[(c, leaf.subspace, leaf.cluster)] = model_from_bytes(blob)
            t_des += time.perf_counter() - t0
        insert_models(fc, models)
    busy["deserialize"] = t_des
    fc.validate(require_models=True)
    em_trace: list[float] = []
    if cfg.get("refine") == "em":
        if cfg.get("em_initial_model"):
            save_fc(fc, cfg["em_initial_model"])
        ctx.ledger.set_phase("em")
        t0 = time.perf_counter()
        em_trace = _server_em(ctx, cfg, fc, ranks, reports, decls[0].n_rows)
        busy["em"] = time.perf_counter() - t0
        fc.validate(require_models=True)
    for c in sorted(ranks):
        client_times[c] = dict(zip(CLIENT_PHASES, t.recv(ranks[c], P.TIMING).tolist()))
    rows = ctx.ledger.rows
    sent = ctx.ledger.sent
    bytes_train = int(rows["payload_bytes"].sum() + rows["header_bytes"].sum() + sent[:, 1].sum() + sent[:, 2].sum())
    messages = int(len(rows) + sent[:, 0].sum())
    client_busy = {c: float(sum(v.values())) for c, v in client_times.items()}
    server_busy = float(sum(busy.values()))
    summary = {
        "model": str(cfg["model"]),
        "setting": manifest.setting,
        "learner": cfg["learner"], "glue": cfg["glue"], "clusters": int(cfg["clusters"]),
        "products": int(cfg["products"]), "seed": int(cfg["seed"]), "assign": cfg["assign"],
        "n_nodes": len(fc.nodes), "n_leaves": len(fc.leaves), "n_parameters": fc.num_parameters(),
        "bytes_train": bytes_train, "messages_train": messages,
        "em_train_ll": em_trace,
        "ranks": ctx.size,
        # Busy seconds only (waiting excluded); the file write is left out of both figures.
        "train_seconds_critical_path": max(client_busy.values()) + server_busy,
        "train_seconds_total": sum(client_busy.values()) + server_busy,
        "client_seconds": {str(c): v for c, v in client_times.items()},
        "server_seconds": dict(busy),
    }
    fc.meta.update(train=summary)
    save_fc(fc, cfg["model"])
    for c in sorted(ranks):
        t.send_obj("ok", ranks[c], P.DONE)
    return summary


def _server_em(ctx: Any, cfg: dict[str, Any], fc: Any, ranks: dict[int, int], reports: list[ClientReport],
               n: int) -> list[float]:
    """Exact EM, server side: sum nodes only; returns the mean train log-likelihood per iteration."""
    from mpifc.federated.em import update_sums
    from mpifc.federated.serialize import fc_to_bytes
    from mpifc.runtime.fc_query import downward_pass, upward_pass

    t = ctx.transport
    blob = fc_to_bytes(fc)
    for c in sorted(ranks):
        t.send(blob, ranks[c], P.EM_STRUCTURE)
    trace = []
    for _ in range(int(cfg["em_iters"])):
        values: dict[int, np.ndarray] = {}
        root = upward_pass(t, fc, ctx.rank, {}, n, values=values)
        trace.append(float(root[:, 0].mean()))
        _, stats = downward_pass(t, fc, ctx.rank, values, n)
        update_sums(fc, stats)
    models = {}
    for rep in reports:
        for leaf in rep.leaves:
            models[(rep.client, leaf.subspace, leaf.cluster)] = model_from_bytes(t.recv(ranks[rep.client], P.MODEL))
    insert_models(fc, models)
    return trace
