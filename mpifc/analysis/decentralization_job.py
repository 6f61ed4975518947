"""MPI jobs for the decentralised settings of the vertical-FL cost study, on mpifc's byte-counted runtime.

Two jobs, each a real ``mpiexec`` job whose every message goes through the runtime's
:class:`~mpifc.runtime.transport.Transport`, so the ledger CSV is the byte count:

* ``dl`` (DL/CI and DL/DI) on shards with the label on every client (``--label-owner all``).
  Rank 0 is the combiner, client ``k`` sits on rank ``k + 1``.

  - phase ``train``: each agent fits its own LearnSPN on ``(X_k, Y)``, its rows only. Client 0
    sends the combiner its class counts (``8 · C`` bytes, kind ``dz.dl.prior_counts``), the
    only training message: the combiner's ``p(y)`` for the product of experts.
  - phase ``query-setup``: each agent sends its test-row count and ids digest (alignment check,
    as :mod:`mpifc.fedpc.evaluate` does); counted separately from the query.
  - phase ``query`` (DL/CI): each agent sends ``log p_k(y = c, x_k)`` ``(n_test, C)`` float64
    (kind ``dz.dl.class_loglik``, ``8 · n_test · C`` payload bytes); the combiner forms
    ``p(y | x) ∝ p(y)^(1-K) Π_k p_k(y | x_k)`` and writes ``dl_ci.npz``.
  - DL/DI: each agent writes its own ``log p_k(y | x_k)`` to ``dl_di_agent{k}.npz``; no message.

* ``di`` (CL/DI) on the shards the CL FedPC was trained on, with its model file. Rank 0 (the
  server that gathered the FedPC in training) sends each agent, in phase ``di-pack``, what it needs
  to evaluate the FedPC alone with the others' features marginalised: the structure and weights
  (:func:`~mpifc.federated.serialize.fc_to_bytes`, kind ``dz.di.structure``) and, for every other
  client's leaf whose scope holds ``y``, its label marginal ``log p(y = c)`` (kind
  ``dz.di.label_tables``: node ids int64, tables ``(n, C)`` float64). The others' other leaves
  marginalise to 1 and need nothing. The agent keeps its own leaf PCs (it trained them; here read
  from the model file, only the leaves ψ puts on its rank) and writes ``cl_di_agent{k}.npz``;
  no message at test time.

Every ``.npz`` holds ``log_post`` ``(n_test, C)`` (log-posteriors, nats) and ``ids`` (test ids).
Rank 0 prints one JSON line (``--json``) with the ledger's bytes per phase (payload and header).

Run: ``mpiexec -n K+1 mpifc baseline decentralized dl DIR --out D [--ledger L]``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import logsumexp

from mpifc.atomic import OutputKind
from mpifc.errors import UserError
from mpifc.runtime.kinds import register_kind

PRIOR_COUNTS = register_kind("dz.dl.prior_counts", "count",
                             "agent 0 -> combiner: class counts of its training rows (float64, C)")
CLASS_LOGLIK = register_kind("dz.dl.class_loglik", "likelihood_vector",
                             "agent -> combiner: log p_k(y = c, x_k) per test row, float64 (n_test, C)")
TEST_DECLARE = register_kind("dz.query.declare", "feature_declaration",
                             "agent -> combiner: test row count and ids digest (alignment check)")
DI_STRUCTURE = register_kind("dz.di.structure", "model_parameters",
                             "server -> agent: FedPC structure, psi and sum weights (HDF5, no leaf models)")
DI_LABEL_IDS = register_kind("dz.di.label_ids", "model_parameters",
                             "server -> agent: node ids of the other clients' leaves that hold y (int64)")
DI_LABEL_TABLES = register_kind("dz.di.label_tables", "model_parameters",
                                "server -> agent: log p(y = c) of those leaves, float64 (n_leaves, C)")

PHASES = ("train", "di-pack", "query-setup", "query")
DL_PRIOR_SEED_TAG = 0x444C  # "DL": the seed stream of the agents' own PCs (as the in-process code)


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    from mpifc.atomic import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def is_agent_output(path: str | Path) -> bool:
    """Whether ``path`` is an earlier output of these jobs: an ``.npz`` holding ``log_post`` and ``ids``."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return {"log_post.npy", "ids.npy"} <= set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


AGENT_OUTPUTS = OutputKind("an agent output (.npz)", is_agent_output,
                           members=r"(dl_ci|dl_di_agent\d+|cl_di_agent\d+)\.npz")
"""``--out DIR``: the ``.npz`` files the agents write there."""


def log_posterior(log_joint: np.ndarray) -> np.ndarray:
    return log_joint - logsumexp(log_joint, axis=1, keepdims=True)


def laplace_log_prior(counts: np.ndarray) -> np.ndarray:
    """``log((n_c + 1) / (N + C))``: the label prior of the product of experts."""
    counts = np.asarray(counts, dtype=np.float64)
    return np.log((counts + 1.0) / (counts.sum() + len(counts)))


def poe(local_log_joints: list[np.ndarray], log_prior: np.ndarray) -> np.ndarray:
    """``log p(y | x) ∝ (1 - K) log p(y) + Σ_k log p_k(y | x_k)``, normalised."""
    total = (1 - len(local_log_joints)) * np.asarray(log_prior)[None, :]
    for lj in local_log_joints:
        total = total + log_posterior(lj)
    return log_posterior(total)


def fit_local_pc(shard: Any, meta_types: list[str], n_categories: list[int], seed: int,
                 hp: dict[str, Any]) -> Any:
    """Agent ``k``'s own LearnSPN on ``(X_k, Y)`` (its training rows only)."""
    from mpifc.federated.learners import fit_leaf
    from mpifc.federated.one_pass import derive_seed

    return fit_leaf("learnspn", shard.x_train, meta_types, derive_seed(seed, DL_PRIOR_SEED_TAG, shard.index),
                    n_categories=n_categories, **hp)


def class_log_joint(model: Any, x: np.ndarray, target_col: int, n_classes: int) -> np.ndarray:
    """``log p_k(y = c, x_k)`` ``(n, C)`` float64, the target column replaced by each class."""
    n = x.shape[0]
    rep = np.repeat(x, n_classes, axis=0)
    rep[:, target_col] = np.tile(np.arange(n_classes, dtype=np.float64), n)
    v = model.log_likelihood(rep)
    v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
    return np.ascontiguousarray(np.asarray(v, dtype=np.float64).reshape(n, n_classes))


# -- dl ------------------------------------------------------------------------------------------
def _dl_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest, read_test
    from mpifc.federated.one_pass import ids_digest
    from mpifc.fedpc.data import read_client_data

    cfg = ctx.config
    m = load_manifest(cfg["dir"])
    if m.label_owner != "all":
        raise UserError(f"{cfg['dir']}: the dl job needs the label on every client (--label-owner all), "
                        f"got label_owner={m.label_owner!r}")
    target = m.target
    n_classes = int(m.features[target]["n_categories"] or 0)
    if n_classes < 2:
        raise UserError(f"{cfg['dir']}: target {target!r} is not categorical")
    k_agents = m.n_clients
    out = Path(cfg["out"])
    t = ctx.transport
    if ctx.rank > k_agents:
        return 0
    if ctx.rank == 0:
        ctx.ledger.set_phase("train")
        counts = t.recv(1, PRIOR_COUNTS)
        log_prior = laplace_log_prior(counts)
        test = read_test(cfg["dir"])
        want = ids_digest(test.ids)
        ctx.ledger.set_phase("query-setup")
        for k in range(k_agents):
            got = t.recv_obj(k + 1, TEST_DECLARE)
            if got["n_test"] != len(test.ids) or got["ids_digest"] != want:
                raise UserError(f"agent {k} (rank {k + 1}) holds test rows that do not match {cfg['dir']}/test.h5")
        ctx.ledger.set_phase("query")
        local = [t.recv(k + 1, CLASS_LOGLIK) for k in range(k_agents)]
        _write_npz(ctx.stage(out / "dl_ci.npz"), log_post=poe(local, log_prior), ids=test.ids, log_prior=log_prior)
        return 0
    index = ctx.rank - 1
    data = read_client_data(cfg["dir"], index)
    sh = data.shard
    tcol = list(sh.features).index(target)
    ctx.ledger.set_phase("train")
    model = fit_local_pc(sh, list(data.declaration.meta_types), list(data.declaration.n_categories),
                         int(cfg["seed"]), dict(cfg.get("hyperparameters") or {}))
    if index == 0:
        y = sh.x_train[:, tcol].astype(np.int64)
        t.send(np.bincount(y, minlength=n_classes).astype(np.float64), 0, PRIOR_COUNTS)
    x = sh.x_test.copy()
    x[:, tcol] = np.nan  # the agent predicts its test labels; they are never evidence
    lj = class_log_joint(model, x, tcol, n_classes)
    _write_npz(ctx.stage(out / f"dl_di_agent{index}.npz"), log_post=log_posterior(lj), ids=sh.ids_test, log_joint=lj)
    ctx.ledger.set_phase("query-setup")
    t.send_obj({"n_test": int(sh.x_test.shape[0]), "ids_digest": ids_digest(sh.ids_test)}, 0, TEST_DECLARE)
    ctx.ledger.set_phase("query")
    t.send(lj, 0, CLASS_LOGLIK)
    return 0


# -- di ------------------------------------------------------------------------------------------
def label_leaves(fc: Any, agent: int, target: str) -> list[int]:
    """Reachable leaf ids of clients other than ``agent`` whose scope holds ``target``."""
    return [nid for nid in fc.reachable() if fc.nodes[nid].op == "leaf"
            and fc.nodes[nid].leaf.client != agent and target in fc.nodes[nid].scope]


def label_table(fc: Any, nid: int, target: str, n_classes: int) -> np.ndarray:
    """``log p(y = c)`` of leaf ``nid`` (every other feature marginalised), ``(C,)``."""
    from mpifc.federated.evaluate import Query, leaf_values

    node = fc.nodes[nid]
    cols = {f: np.full(1, np.nan) for f in node.leaf.features}
    return leaf_values(node, cols, Query(target, n_classes)).reshape(n_classes)


def di_log_joint(fc: Any, agent: int, cols: dict[str, np.ndarray], n: int, target: str, n_classes: int,
                 tables: dict[int, np.ndarray]) -> np.ndarray:
    """``log p(y = c, x_agent)`` ``(n, C)`` from the agent's own leaves and the pack alone."""
    from mpifc.federated.evaluate import Query, leaf_values, upward

    def leaf_fn(node: Any, c: dict[str, np.ndarray], q: Query) -> np.ndarray:
        if node.leaf.client == agent:
            return leaf_values(node, c, q)
        if node.id in tables:
            return np.broadcast_to(tables[node.id][None, :], (n, n_classes))
        return np.zeros((n, 1))  # a PC over the others' features only, all marginalised: 1

    return upward(fc, cols, Query(target, n_classes), leaf_fn=leaf_fn)[fc.root]


def _di_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest
    from mpifc.federated.serialize import fc_from_bytes, fc_to_bytes, load_fc
    from mpifc.fedpc.data import read_client_data

    cfg = ctx.config
    m = load_manifest(cfg["dir"])
    target = m.target
    n_classes = int(m.features[target]["n_categories"] or 0)
    out = Path(cfg["out"])
    t = ctx.transport
    ctx.ledger.set_phase("di-pack")
    if ctx.rank == 0:
        fc = load_fc(cfg["model"], load_models=True)
        blob = fc_to_bytes(fc)
        for c in sorted(fc.clients.values(), key=lambda c: c.index):
            ids = label_leaves(fc, c.index, target)
            tables = np.array([label_table(fc, nid, target, n_classes) for nid in ids],
                              dtype=np.float64).reshape(len(ids), n_classes)
            t.send(blob, c.rank, DI_STRUCTURE)
            t.send(np.asarray(ids, dtype=np.int64), c.rank, DI_LABEL_IDS)
            t.send(tables, c.rank, DI_LABEL_TABLES)
        return 0
    own = load_fc(cfg["model"], load_models={ctx.rank})  # this rank's own leaf PCs only
    mine = {c.rank: c.index for c in own.clients.values()}
    if ctx.rank not in mine:
        return 0
    agent = mine[ctx.rank]
    fc = fc_from_bytes(t.recv(0, DI_STRUCTURE))
    ids = t.recv(0, DI_LABEL_IDS)
    tables_arr = t.recv(0, DI_LABEL_TABLES).reshape(len(ids), n_classes)
    for nid in fc.reachable():
        if fc.nodes[nid].op == "leaf" and fc.nodes[nid].leaf.client == agent:
            fc.nodes[nid].leaf.model = own.nodes[nid].leaf.model
    tables = {int(i): tables_arr[j] for j, i in enumerate(ids.tolist())}
    ctx.ledger.set_phase("query")  # nothing is sent from here on
    sh = read_client_data(cfg["dir"], agent).shard
    n = sh.x_test.shape[0]
    cols = {f: np.full(n, np.nan) for f in fc.features}
    for j, f in enumerate(sh.features):
        if f != target:
            cols[f] = sh.x_test[:, j]
    lj = di_log_joint(fc, agent, cols, n, target, n_classes, tables)
    _write_npz(ctx.stage(out / f"cl_di_agent{agent}.npz"), log_post=log_posterior(lj), ids=sh.ids_test, log_joint=lj)
    return 0


# -- entry ---------------------------------------------------------------------------------------
def ledger_bytes(table: Any) -> dict[str, dict[str, int]]:
    """``{phase: {payload, header, messages}}`` over the gathered ledger rows."""
    rows = table.rows
    out: dict[str, dict[str, int]] = {p: {"payload": 0, "header": 0, "messages": 0} for p in PHASES}
    for i, ph in enumerate(rows["phase"].tolist()):
        name = table.phases[ph]
        d = out.setdefault(name, {"payload": 0, "header": 0, "messages": 0})
        d["payload"] += int(rows["payload_bytes"][i])
        d["header"] += int(rows["header_bytes"][i])
        d["messages"] += 1
    return out


def run_agents(mode: str, directory: str, out: str, *, model: str | None = None, seed: int = 0,
               hyperparameters: dict[str, Any] | None = None, deadline: float = 600.0,
               ledger: str | None = None, as_json: bool = False, overwrite: bool = False) -> int:
    """Run the ``dl`` or ``di`` job on every rank of ``COMM_WORLD``; returns the exit code.

    Args:
        mode: ``"dl"`` (each agent learns its own PC; DL/CI and DL/DI) or ``"di"`` (CL/DI from
            the CL FedPC in ``model``).
        directory: the shard folder (dl: ``--label-owner all``; di: the CL model's shards).
        out: folder for the per-setting ``.npz`` outputs.
        hyperparameters: LearnSPN settings of the dl agents.
        as_json: rank 0 prints the ledger's bytes per phase as one JSON line.
        overwrite: outputs may replace files of another kind (never an input or a source).
    """
    from data_prep.shards import input_files, load_manifest, source_files
    from mpifc.atomic import Output, check_outputs
    from mpifc.runtime.job import run_job
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    if mode not in ("dl", "di"):
        raise UserError(f"mode must be dl or di, not {mode!r}")
    if mode == "di" and not model:
        raise UserError("di needs --model (the CL FedPC)")
    m = load_manifest(directory)
    inputs = input_files(m) + ([("the model", Path(model))] if model else [])
    check_outputs([Output("--out", out, AGENT_OUTPUTS), Output("--ledger", ledger, LEDGER_OUTPUT)], inputs,
                  source_files(m), overwrite=overwrite)
    cfg = {"dir": directory, "out": out, "model": model, "seed": seed, "hyperparameters": dict(hyperparameters or {})}
    k = m.n_clients

    def on_ledger(table: Any) -> None:
        if as_json:
            print(json.dumps({"mode": mode, "ranks": int(table.sent.shape[0]), "bytes": ledger_bytes(table)}),
                  flush=True)

    return run_job(_dl_job if mode == "dl" else _di_job, config=cfg, servers=1, min_clients=k,
                   deadline=deadline, ledger_csv=ledger, on_ledger=on_ledger)
