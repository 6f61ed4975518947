"""One-pass training of a FedPC over MPI (Algorithm 1 with the runtime's byte-counted transport).

Rank layout: rank 0 is the root server, ranks ``1..S`` the intermediate servers of ``--assign
tree`` (idle during training: ψ only uses them at query time), then one rank per client in
manifest index order (:func:`mpifc.federated.assign.client_rank_map`). Extra ranks idle.

Protocol (all messages to or from rank 0, phases as named in the ledger):

* ``declare``: client → server ``fc.train.declare`` (names, meta-types, counts, ids digest);
  the server plans (Algorithm 1, lines 1-7) and sends each client only its own tasks.
* ``learn``: clients cluster and fit their PCs locally, then send ``fc.train.counts`` (and,
  with ``--glue cooccurrence``, ``fc.train.cluster_ids``: one id per training row in the smallest
  unsigned dtype holding K - 1, uint8 for K <= 256). The server assembles the FC and infers
  every weight from the counts (lines 8-22), then applies ψ and validates it.
* ``gather``: clients send each PC in the compact wire format (``fc.train.model``,
  :func:`~mpifc.federated.wire_format.model_to_bytes`) and their timings; the server keeps them
  decoded but not rebuilt (:class:`~mpifc.federated.wire_format.WireModel`: it never evaluates a
  leaf), writes ONE model file atomically and tells everyone it is done.

Timing: every figure is busy time of a phase, measured as this process's CPU seconds
(``time.process_time``, all threads; OMP_NUM_THREADS=1 keeps native libraries single-threaded),
so ranks sharing cores (oversubscribed MPI, other jobs) are not charged for waiting for a core,
and waiting for messages is excluded. With ``cfg["warm_up"]`` (``--warm-up``, implied by exclusive
timing) imports and one-off first-call costs happen before the clocks start (:func:`warm_up`);
without it (a user's job) a rank imports only what its own fit needs, when it needs it, so the
``learn`` phase then includes those imports.
Client phases: ``read`` (own shard), ``learn`` (k-means and PC fitting), ``serialize``, ``em``;
server: ``plan``, ``assemble``, ``deserialize`` (blob decoding), ``em``. The model file write is
in neither figure. Wall-clock seconds of the same phases are reported beside them (``*_wall``).

Exclusive timing (``cfg["exclusive_timing"]``, opt-in; default off = *contended*). By default every
client learns at the same time, so on an oversubscribed machine (e.g. 6 ranks on 2 cores) each
client's CPU seconds are inflated by the others sharing its cores, caches and memory bandwidth,
while a centralized reference run alone is not. With exclusive timing the server hands out the
plans one client at a time, in client order: it sends client ``c`` its plan, receives its counts
(and cluster ids) and its model blobs, and only then sends client ``c + 1`` its plan. Each
client's ``learn`` and ``serialize`` then run with no other rank of the job computing (the server
and the waiting clients sleep in deadline-bounded receives). The server warms up before the first
plan instead of after. Messages, bytes, ledger phases, seeds and the model are exactly those of
the contended run; the timing figures keep their meaning (critical path = slowest client +
server) but measure each client uncontended by its own federation. Only the one-pass phases are
staggered (``--refine em`` runs as usual afterwards). Wall time grows to roughly the sum of the
clients' times, and a client waits for the plan up to the transport deadline, so long per-client
fits need a larger ``--deadline``. The summary records the mode (``timing_mode``).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import numpy as np

import mpifc.progress as progress
from mpifc.errors import UserError
from mpifc.federated.assign import assign, client_rank_map
from mpifc.federated.one_pass import (
    ClientDeclaration,
    ClientReport,
    FederationPlan,
    OnePassBuilder,
    clusters_without_target,
    insert_models,
    pack_cluster_ids,
    record_hyperparameters,
    run_client_tasks,
    unpack_cluster_ids,
)
from mpifc.federated.serialize import SOURCES, save_fc
from mpifc.federated.wire_format import model_from_bytes, model_to_bytes
from mpifc.fedpc import protocol as P
from mpifc.fedpc.data import ClientData, read_client_data

CLIENT_PHASES = ("read", "learn", "serialize", "em")


def client_plan(plan: FederationPlan, client: int) -> FederationPlan:
    """The part of the plan one client needs: its own tasks and declaration, nothing of others'."""
    return replace(plan, tasks=plan.tasks_for(client), declarations={client: plan.declarations[client]})


def builder_from_config(cfg: dict[str, Any]) -> OnePassBuilder:
    """The builder of a settings dict: ``clusters`` None (or absent) lets the defaults choose
    K per subspace; ``defaults`` ("adaptive", the default, or "learner") fills what the user
    did not set (:mod:`mpifc.federated.defaults`)."""
    hp = dict(cfg.get("hyperparameters") or {})
    k = cfg.get("clusters")
    return OnePassBuilder(n_clusters=None if k is None else int(k), n_products=int(cfg["products"]),
                          glue=cfg["glue"], seed=int(cfg["seed"]), learner=cfg["learner"],
                          learners={int(k): v for k, v in (cfg.get("client_learners") or {}).items()},
                          hyperparameters=hp, defaults=cfg.get("defaults") or "adaptive")


def train_rank(ctx: Any, cfg: dict[str, Any], manifest: Any, on_read: Any = None) -> dict[str, Any] | None:
    """Run this rank's part of training; returns the summary dict on rank 0, else ``None``.

    ``on_read``: called on a client rank with its own shard once read, before the rank sends
    anything (the job installs its send audit there, so the shard is read once).

    Every rank computes on the CPU unless a learner it runs computes on torch: then on its
    device (``ctx.device``, resolved only then). What each rank computed on is gathered at the
    end outside the ledger (:meth:`~mpifc.runtime.job.JobContext.gather_device_facts`) and
    recorded in the summary (``devices``)."""
    n_servers = int(cfg["servers"]) if cfg["assign"] == "tree" else 0
    ranks = client_rank_map(range(manifest.n_clients), n_servers)
    client_of = {r: c for c, r in ranks.items()}
    if ctx.rank in client_of:
        _client(ctx, cfg, client_of[ctx.rank], manifest, on_read)
        return None
    if ctx.rank == 0:
        return _server(ctx, cfg, manifest, ranks, n_servers)
    ctx.gather_device_facts()  # an idle rank: the CPU, no torch
    return None


def job_learners(cfg: dict[str, Any]) -> set[str]:
    """Every learner the job's clients use (the default one and the per-client ones)."""
    return {cfg.get("learner") or "learnspn", *(cfg.get("client_learners") or {}).values()}


def rank_device(ctx: Any, learners: Any) -> str | None:
    """This rank's device as a string when one of ``learners`` computes on torch, else None
    (the device is not resolved, so torch is not imported)."""
    from mpifc.federated.learners import takes_device

    return str(ctx.device) if any(takes_device(name) for name in learners) else None


# What each learner's fit imports (LearnSPN, factorized and DT models are fitted, sent and
# evaluated without torch: mpifc.circuit.numpy_eval).
_LEARNER_MODULES = {"learnspn": ("mpifc.circuit.learnspn",), "ratspn": ("torch", "mpifc.circuit.ratspn"),
                    "einet": ("torch", "mpifc.circuit.einet"), "dt": ("mpifc.federated.cart",), "factorized": ()}


def warm_up(learners: set[str], cluster: bool = True, fit: bool = False) -> None:
    """Import the heavy modules this rank will use before any timer starts: import time is not
    training time. Modules the rank does not need are not imported at all (each costs seconds
    of start-up): ``cluster`` (k-means) only where rows are clustered, torch only for
    learners built on it. ``fit``: also :func:`warm_up_fit` (client ranks, which fit).
    """
    import importlib

    import mpifc.federated.factorized  # noqa: F401

    mods = ["mpifc.circuit.kmeans", "mpifc.circuit.splitting"] if cluster else []
    for name in sorted(learners):
        # An unknown (e.g. third-party registered) learner: import everything, as before.
        mods += _LEARNER_MODULES.get(name, ("sklearn.cluster", "torch"))
    for mod in dict.fromkeys(mods):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass  # the learner call itself reports a missing module clearly
    if fit:
        warm_up_fit(learners, cluster)


# Learners whose first call pays one-off start-up costs worth paying before the clock.
_WARM_FIT = {"learnspn": {"threshold": 0.3, "min_instances_slice": 16}}
_WARM_LEAVES = {"learnspn": ("auto", "piecewise", "histogram")}
_WARM_DISCRETE = {"learnspn": ({"col_split": "gtest", "gtest_pvalue": 0.05, "min_instances_slice": 16, "class_column": 0},)}


def warm_up_fit(learners: set[str], cluster: bool = False) -> None:
    """Fit each learner once on a tiny synthetic table (no client data): the first LearnSPN
    call in a process pays one-off costs (thread-pool introspection, loading the BLAS routine
    of k-means, first-call set-up, lazily imported submodules) of ~0.1 s that do not depend on
    the data.
    Every leaf family LearnSPN offers is fitted once (the first piecewise or histogram fit has
    set-up of its own), the fitted model is serialized once (as a client's models are), and with
    ``cluster`` one tiny k-means of Algorithm 1's clustering runs (its first call scans the
    loaded native libraries: ~10 ms inside a client's timed phase otherwise). The centralized
    references of ``launch/bench/fedpc.py`` and ``mpifc experiment table1`` are warmed the same way."""
    from mpifc.federated.learners import fit_leaf

    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=64), rng.normal(size=64), rng.integers(0, 2, 64), rng.integers(0, 3, 64)])
    x[:, 1] += x[:, 0]
    for name in sorted(set(learners) & set(_WARM_FIT)):
        for leaf in _WARM_LEAVES.get(name, (None,)):
            hp = dict(_WARM_FIT[name], **({"leaf": leaf} if leaf else {}))
            try:
                model = fit_leaf(name, x, ["real", "real", "discrete", "categorical"], 0, n_categories=[0, 0, 2, 3],
                                 **hp)
                from mpifc.federated.wire_format import model_to_bytes

                model_to_bytes(model)
            except Exception:  # noqa: BLE001 - warm-up is best effort; the real call reports errors
                pass
        for extra in _WARM_DISCRETE.get(name, ()):
            # the adaptive defaults' paths: the G-test split (its chi-squared critical values) and
            # the class split on discrete columns
            try:
                fit_leaf(name, x[:, 2:], ["discrete", "categorical"], 0, n_categories=[2, 3], **extra)
            except Exception:  # noqa: BLE001
                pass
    if cluster:
        from mpifc.federated.one_pass import cluster_rows

        try:
            cluster_rows(x, 2, 0)
        except Exception:  # noqa: BLE001
            pass


def fit_client(plan: FederationPlan, index: int, data: ClientData, device: str | None = None) -> ClientReport:
    """Client ``index``'s part of Algorithm 1 on its own rows: its leaf PCs, counts and (with the
    cooccurrence glue) cluster ids; learners that compute on torch fit on ``device``. The MPI job
    and :func:`mpifc.api.simulate` both call this."""
    return run_client_tasks(plan, index, data.shard.x_train, data.shard.features, x_valid=data.shard.x_valid,
                            device=device)


def _client(ctx: Any, cfg: dict[str, Any], index: int, manifest: Any = None, on_read: Any = None) -> None:
    from mpifc.circuit.privacy import MomentGuard
    from mpifc.federated.wire_format import set_release_guard

    times = dict.fromkeys(CLIENT_PHASES, 0.0)
    walls = dict.fromkeys(CLIENT_PHASES, 0.0)
    ctx.ledger.set_phase("declare")
    ctx.enter("read")
    with _clock(times, walls, "read"):
        data = read_client_data(cfg["dir"], index, manifest)
        # every PC this rank sends: its Gaussian moments off the grid of values (k-rows rule)
        guard = MomentGuard(client_rare_values(data.shard))
    if on_read is not None:
        on_read(data.shard)
    set_release_guard(guard)
    try:
        _client_job(ctx, cfg, index, data, times, walls)
    finally:
        set_release_guard(None)
        cfg["_moment_coincidences"] = guard.coincidences  # for the audit report (mpifc.fedpc.job)


def released(report: ClientReport, shard: Any) -> ClientReport:
    """``report``'s PCs as the server receives them from the client's rank: each through the
    wire bytes, its Gaussian moments moved off the grid of the client's rare values
    (:class:`mpifc.circuit.privacy.MomentGuard`), so a one-process build equals the MPI job."""
    from mpifc.circuit.privacy import MomentGuard
    from mpifc.federated.wire_format import set_release_guard

    set_release_guard(MomentGuard(client_rare_values(shard)))
    try:
        for leaf in report.leaves:
            leaf.model = model_from_bytes(model_to_bytes(leaf.model))
    finally:
        set_release_guard(None)
    return report


def client_rare_values(shard: Any) -> np.ndarray:
    """The values that fewer than k rows of a client's shard (training, validation and test
    rows) hold in its real columns (:func:`mpifc.circuit.privacy.rare_values`)."""
    from mpifc.circuit.privacy import rare_values

    real = [j for j, m in enumerate(shard.meta_types) if m == "real"]
    return rare_values(np.concatenate([shard.x_train, shard.x_valid, shard.x_test]), real)


def _client_job(ctx: Any, cfg: dict[str, Any], index: int, data: ClientData, times: dict[str, float],
                walls: dict[str, float]) -> None:
    """The client's protocol after reading its shard (see :func:`_client`)."""
    t = ctx.transport
    d = data.declaration
    t.send_obj({"index": d.index, "features": list(d.features), "meta_types": list(d.meta_types),
                "n_categories": list(d.n_categories), "n_rows": d.n_rows, "ids_digest": d.ids_digest},
               0, P.DECLARE)
    plan: FederationPlan = t.recv_obj(0, P.PLAN)
    ctx.notes["learners"] = sorted({task.learner for task in plan.tasks})
    ctx.notes["warm_up"] = bool(cfg.get("warm_up"))
    if cfg.get("warm_up"):
        # Timings only (--warm-up): a user's job imports what its fit needs, when it needs it.
        # After the plan: bad input is caught before anyone pays for the heavy imports.
        warm_up({task.learner for task in plan.tasks}, cluster=any(task.n_clusters > 1 for task in plan.tasks),
                fit=True)
    # The device is resolved only when this client's learners compute on torch (after the plan:
    # bad input is caught before anyone pays for torch).
    device = rank_device(ctx, {task.learner for task in plan.tasks})
    ctx.ledger.set_phase("learn")
    ctx.enter("learn")
    with _clock(times, walls, "learn"):
        report = fit_client(plan, index, data, device=device)
    t.send(report.counts(), 0, P.COUNTS)
    if plan.glue == "cooccurrence" and any(task.n_clusters > 0 for task in plan.tasks):
        # the smallest unsigned dtype holding K - 1 (uint8 for K <= 256): 1 B per row, not 8
        t.send(pack_cluster_ids(plan, index, report.cluster_ids), 0, P.CLUSTER_IDS)
    ctx.ledger.set_phase("gather")
    ctx.enter("gather")
    with _clock(times, walls, "serialize"):
        blobs = [model_to_bytes(leaf.model) for leaf in report.leaves]
    for b in blobs:
        t.send(b, 0, P.MODEL)
    if cfg.get("refine") == "em":
        ctx.ledger.set_phase("em")
        ctx.enter("em")
        with _clock(times, walls, "em"):
            if plan.setting == "vertical" and cfg.get("em_rows"):
                from mpifc.fedpc.sampled_em import client_sampled_em

                client_sampled_em(ctx, cfg, index, data, report, plan.target in data.shard.features)
            elif plan.setting == "vertical":
                _client_em(ctx, cfg, index, data, report)
            else:  # horizontal / hybrid: pooled E-step statistics (mpifc.fedpc.em)
                from mpifc.fedpc.em import pooled_client_em

                # every client evaluates every client's PCs: a device if any learner needs one
                pooled_client_em(ctx, cfg, index, data, device=rank_device(ctx, job_learners(cfg)))
    t.send(np.array([times.get(p, 0.0) for p in CLIENT_PHASES] + [walls.get(p, 0.0) for p in CLIENT_PHASES]),
           0, P.TIMING)
    ctx.enter("write")  # the server assembles and writes the model meanwhile
    ctx.gather_device_facts()
    t.recv_obj(0, P.DONE)


@contextmanager
def _clock(cpu: dict[str, float], wall: dict[str, float], phase: str) -> Iterator[None]:
    """Add the block's CPU seconds (this process, all threads) to ``cpu[phase]`` and its
    wall-clock seconds to ``wall[phase]``."""
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        yield
    finally:
        cpu[phase] = cpu.get(phase, 0.0) + time.process_time() - c0
        wall[phase] = wall.get(phase, 0.0) + time.perf_counter() - w0


def _client_em(ctx: Any, cfg: dict[str, Any], index: int, data: Any, report: ClientReport) -> None:
    """Exact EM, client side: own leaves only, own rows only; sends the refined PCs at the end."""
    from mpifc.federated.em import update_leaf
    from mpifc.federated.serialize import fc_from_bytes
    from mpifc.fedpc.query import downward_pass, upward_pass

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
    walls: dict[str, float] = {}
    ctx.ledger.set_phase("declare")
    ctx.enter("read")  # the clients read their shards and declare them
    progress.phase(f"waiting for {len(ranks)} clients to read and declare their shards")
    decls = []
    for c in sorted(ranks):
        raw = t.recv_obj(ranks[c], P.DECLARE)
        if int(raw["index"]) != c:
            raise UserError(f"rank {ranks[c]} declared client {raw['index']}, expected client {c}")
        decls.append(ClientDeclaration(c, tuple(raw["features"]), tuple(raw["meta_types"]),
                                       tuple(int(k) for k in raw["n_categories"]), int(raw["n_rows"]),
                                       str(raw["ids_digest"])))
    with _clock(busy, walls, "plan"):
        builder = builder_from_config(cfg)
        plan = builder.plan(decls, manifest.feature_order, manifest.target, manifest.setting)
    if cfg.get("refine") == "em" and manifest.setting == "vertical":
        if cfg["assign"] != "flat":
            raise UserError("--refine em supports --assign flat only")
        digests = {d.ids_digest for d in decls}
        if len(digests) != 1 or len({d.n_rows for d in decls}) != 1:
            raise UserError("--refine em (exact EM without moving data) needs every client to hold the "
                            "same rows in the same order (vertical data with aligned ids)")
    exclusive = bool(cfg.get("exclusive_timing"))
    ctx.notes["warm_up"] = bool(cfg.get("warm_up") or exclusive)
    # The server fits nothing: it only needs the leaf models' classes to deserialize them.
    # Exclusive timing: warm up before any client starts, so no client learns beside it.
    if exclusive:
        warm_up({task.learner for task in plan.tasks} - {"dt"}, cluster=False)
    reports = []
    blobs: dict[int, list[np.ndarray]] = {}
    if exclusive:
        for c in sorted(ranks):  # one client at a time (module doc); same messages, same phases
            ctx.ledger.set_phase("declare")
            t.send_obj(client_plan(plan, c), ranks[c], P.PLAN)
            ctx.ledger.set_phase("learn")
            reports.append(_recv_report(t, plan, c, ranks[c]))
            ctx.ledger.set_phase("gather")
            blobs[c] = [t.recv(ranks[c], P.MODEL) for _ in reports[-1].leaves]
    else:
        for c in sorted(ranks):
            t.send_obj(client_plan(plan, c), ranks[c], P.PLAN)
        if cfg.get("warm_up"):
            warm_up({task.learner for task in plan.tasks} - {"dt"}, cluster=False)
        ctx.ledger.set_phase("learn")
        ctx.enter("learn")
        progress.phase(lambda: f"learning: {len(reports)} of {len(ranks)} clients done")
        t_learn = time.perf_counter()
        for c in sorted(ranks):
            reports.append(_recv_report(t, plan, c, ranks[c]))
            if cfg.get("progress"):
                _progress(f"client {c} (rank {ranks[c]}) learned {len(reports[-1].leaves)} PC(s) from its "
                          f"{plan.declarations[c].n_rows} rows "
                          f"[{len(reports)}/{len(ranks)} clients, {time.perf_counter() - t_learn:.1f} s]")
    ctx.enter("assemble")
    progress.phase("assembling the federated circuit")
    with _clock(busy, walls, "assemble"):
        fc = builder.assemble(plan, reports, ranks)
        assign(fc, cfg["assign"], n_servers)
    ctx.ledger.set_phase("gather")
    ctx.enter("gather")
    progress.phase("gathering the clients' PCs")
    client_times = {}
    busy["deserialize"] = walls["deserialize"] = 0.0
    for rep in reports:
        c = rep.client
        models = {}
        for i, leaf in enumerate(rep.leaves):
            blob = blobs[c][i] if exclusive else t.recv(ranks[c], P.MODEL)
            with _clock(busy, walls, "deserialize"):
                models[(c, leaf.subspace, leaf.cluster)] = model_from_bytes(
                    blob, lazy=True, source=f"client {c} (rank {ranks[c]})")
        insert_models(fc, models)
    fc.validate(require_models=True)
    em_trace: list[float] = []
    if cfg.get("refine") == "em":
        from mpifc.federated.em import check_em_supported

        check_em_supported(fc)  # e.g. FC[DT]: a clear error before any file or EM message
        if cfg.get("em_initial_model"):
            save_fc(fc, ctx.stage(cfg["em_initial_model"]))
        ctx.ledger.set_phase("em")
        ctx.enter("em")
        progress.phase(f"exact EM, {int(cfg['em_iters'])} iterations")
        with _clock(busy, walls, "em"):
            if manifest.setting == "vertical" and cfg.get("em_rows"):
                from mpifc.fedpc.sampled_em import server_sampled_em

                em_trace = server_sampled_em(ctx, cfg, fc, ranks, reports, decls[0].n_rows)
            elif manifest.setting == "vertical":
                em_trace = _server_em(ctx, cfg, fc, ranks, reports, decls[0].n_rows)
            else:  # horizontal / hybrid: pooled E-step statistics (mpifc.fedpc.em)
                from mpifc.fedpc.em import pooled_server_em

                em_trace = pooled_server_em(ctx, cfg, fc, ranks)
        fc.validate(require_models=True)
    client_walls = {}
    for c in sorted(ranks):
        got = t.recv(ranks[c], P.TIMING).tolist()
        client_times[c] = dict(zip(CLIENT_PHASES, got[:len(CLIENT_PHASES)]))
        client_walls[c] = dict(zip(CLIENT_PHASES, got[len(CLIENT_PHASES):]))
    devices = ctx.gather_device_facts()
    rows = ctx.ledger.rows
    sent = ctx.ledger.sent
    bytes_train = int(rows["payload_bytes"].sum() + rows["header_bytes"].sum() + sent[:, 1].sum() + sent[:, 2].sum())
    messages = int(len(rows) + sent[:, 0].sum())
    client_busy = {c: float(sum(v.values())) for c, v in client_times.items()}
    server_busy = float(sum(busy.values()))
    record_hyperparameters(fc, plan)
    summary = {
        "model": str(cfg["model"]),
        "setting": manifest.setting,
        "learner": cfg["learner"], "glue": plan.glue, "clusters": int(plan.n_clusters),
        "preset": cfg.get("preset") or "adaptive",
        "products": int(cfg["products"]), "seed": int(cfg["seed"]), "assign": cfg["assign"],
        # opt-in plan option (one_pass.CLUSTER_WITHOUT_TARGET), recorded only when on
        **({"cluster_without_target": True} if clusters_without_target(plan.hyperparameters) else {}),
        "n_nodes": len(fc.nodes), "n_leaves": len(fc.leaves), "n_parameters": fc.num_parameters(),
        "bytes_train": bytes_train, "messages_train": messages,
        "em_train_ll": em_trace,
        "ranks": ctx.size,
        "timing_mode": "exclusive" if exclusive else "contended",
        # Busy CPU seconds only (waiting excluded; module doc); the file write is in neither.
        "train_seconds_critical_path": max(client_busy.values()) + server_busy,
        "train_seconds_total": sum(client_busy.values()) + server_busy,
        "client_seconds": {str(c): v for c, v in client_times.items()},
        "server_seconds": dict(busy),
        "train_wall_seconds_critical_path": max(sum(v.values()) for v in client_walls.values())
        + sum(walls.values()),
        "client_seconds_wall": {str(c): v for c, v in client_walls.items()},
        "server_seconds_wall": dict(walls),
        # what each rank computed on (name, memory; a GPU's peak): outside the ledger, so a run
        # on GPUs records the same messages and bytes as one on CPUs
        "devices": devices,
    }
    fc.meta.update(train=summary, codec=model_codec(manifest), privacy=privacy_record(cfg, plan),
                   **{SOURCES: recorded_sources(manifest)})
    ctx.enter("write")
    progress.phase("writing the model")
    # Written beside its final path; in place only once every rank has finished (run_job).
    save_fc(fc, ctx.stage(cfg["model"]))
    for c in sorted(ranks):
        t.send_obj("ok", ranks[c], P.DONE)
    return summary


def _progress(line: str) -> None:
    """One progress line on stdout, beside the human summary, for runs a person watches:
    through the running ticker (:mod:`mpifc.progress`), which then stays quiet for a while."""
    if progress.running():
        progress.say(line)
        return
    print(f"mpifc train: {line}", flush=True)


def privacy_record(cfg: dict[str, Any], plan: FederationPlan | None = None) -> dict[str, Any]:
    """What the model's meta says of privacy (docs/formats.md): ``k`` of the k-rows rule
    (:mod:`mpifc.circuit.privacy`); what the audit checked (``"every message"`` with
    ``--audit``, else ``"model messages"``: the PCs the clients sent); what a finding did:
    ``"fail"`` (it would have stopped the job, so there was none) or ``"record"``
    (``--audit-findings record``: findings were sent, and counted in the audit's files); and,
    with ``--dp-epsilon``, ``dp``: the accounting of :func:`mpifc.federated.dp.accounting`, per
    client from the plan's tasks."""
    from mpifc.circuit.privacy import MIN_LEAF_ROWS

    out: dict[str, Any] = {"k": MIN_LEAF_ROWS, "audit": "every message" if cfg.get("audit") else "model messages",
                           "findings": cfg.get("audit_findings") or "fail"}
    hp = cfg.get("hyperparameters") or {}
    if hp.get("dp_epsilon") is not None and plan is not None:
        from mpifc.federated.dp import DEFAULT_CLIP, accounting, client_sensitivity

        clip = float(hp.get("dp_clip") or DEFAULT_CLIP)
        sens = {c: client_sensitivity([[plan.meta_types[f] for f in t.features] for t in plan.tasks_for(c)], clip)
                for c in sorted(plan.declarations)}
        out["dp"] = accounting(float(hp["dp_epsilon"]), clip, sens, hp.get("dp_seed") is not None)
    return out


def model_codec(manifest: Any) -> dict[str, Any]:
    """What turns a user's rows into model rows and back (:class:`data_prep.codec.RowCodec`),
    from the shard set's manifest: the model file carries it, so queries need only the model."""
    from data_prep.codec import RowCodec

    return RowCodec.from_manifest(manifest.raw).to_json()


def recorded_sources(manifest: Any) -> list[list[str]]:
    """What the model records as its sources (:data:`mpifc.federated.serialize.SOURCES`): the
    shard set's files and the files it was made from, as absolute paths."""
    from data_prep.shards import input_files, source_files

    return [[what, os.path.abspath(p)] for what, p in input_files(manifest) + source_files(manifest)]


def _recv_report(t: Any, plan: FederationPlan, c: int, rank: int) -> ClientReport:
    """Client ``c``'s counts (and, with the cooccurrence glue, cluster ids) as a report."""
    report = ClientReport.from_counts(c, t.recv(rank, P.COUNTS), plan)
    if plan.glue == "cooccurrence" and any(task.n_clusters > 0 for task in plan.tasks_for(c)):
        # exactly the dtype of the plan's K, the declared row count, ids below the PCs it reported
        report.cluster_ids = unpack_cluster_ids(plan, report, t.recv(rank, P.CLUSTER_IDS),
                                                f"client {c} (rank {rank})")
    return report


def _server_em(ctx: Any, cfg: dict[str, Any], fc: Any, ranks: dict[int, int], reports: list[ClientReport],
               n: int) -> list[float]:
    """Exact EM, server side: sum nodes only; returns the mean train log-likelihood per iteration."""
    from mpifc.federated.em import update_sums
    from mpifc.federated.serialize import fc_to_bytes
    from mpifc.fedpc.query import downward_pass, upward_pass

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
            models[(rep.client, leaf.subspace, leaf.cluster)] = model_from_bytes(
                t.recv(ranks[rep.client], P.MODEL), lazy=True, source=f"client {rep.client} (rank {ranks[rep.client]})")
    insert_models(fc, models)
    return trace
