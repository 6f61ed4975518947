"""The FedPC ``train`` and ``evaluate`` jobs: what every rank of ``mpifc train/evaluate`` runs.

:func:`train` and :func:`evaluate` take a plain settings dict (built by :mod:`mpifc.cli.train`
and :mod:`mpifc.cli.evaluate` from the flags, or by a script) and run the job on every rank of
``COMM_WORLD``. Bad input exits with code 2 and a one-line message naming the client, rank,
feature or file, before any rank starts work: that includes every output path (writable, not an
input, not shared with another output). Outputs appear at their final paths only when the whole
job succeeded (:mod:`mpifc.runtime.outputs`).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import mpifc.progress as progress
from mpifc.atomic import Output, check_outputs
from mpifc.errors import UserError
from mpifc.federated.one_pass import clusters_without_target
from mpifc.runtime.liveness import DEFAULT_LIMIT_S


# -- train ---------------------------------------------------------------------------------------
def _train_job(ctx: Any, manifest: Any = None) -> int:
    """One rank's training job; ``manifest``: the shard set's manifest, if read already."""
    from data_prep.shards import load_manifest
    from mpifc.fedpc.train import train_rank

    cfg = ctx.config
    m = load_manifest(cfg["dir"]) if manifest is None else manifest
    audits: list[Any] = []

    def install(shard: Any = None) -> None:
        if shard is not None:
            # the rows as read, whatever the job does to its own arrays afterwards
            from dataclasses import replace

            shard = replace(shard, x_train=shard.x_train.copy(), x_valid=shard.x_valid.copy(),
                            x_test=shard.x_test.copy())
        audit = _install_audit(ctx, cfg, m, train=True, shard=shard)
        audits.append(audit if audit is not None else _install_model_check(ctx, cfg, m, shard=shard))

    # A client rank reads its shard once: its audit is installed as soon as it has read it, before
    # it sends anything; every other rank's at once.
    client = ctx.rank in _client_of(cfg, m)
    if not client:
        install()
    summary = train_rank(ctx, cfg, m, on_read=install if client else None)
    _finish_audit(ctx, cfg, audits[0] if audits else None)
    if summary is not None:
        cfg["_summary"] = summary
    return 0


def bytes_by_phase(table: Any, phases: tuple[str, ...] | None = None) -> dict[str, int]:
    """Payload and header bytes per ledger phase (all phases, or those in ``phases``), in the
    order they first occur."""
    rows = table.rows
    out: dict[str, int] = {}
    for ph, pb, hb in zip(rows["phase"].tolist(), rows["payload_bytes"].tolist(), rows["header_bytes"].tolist()):
        name = table.phases[ph]
        if phases is None or name in phases:
            out[name] = out.get(name, 0) + int(pb + hb)
    return out


def process_started() -> float:
    """``time.perf_counter()`` at this process's start: from ``/proc`` on Linux (to the clock
    tick), else now. So a job's wall time includes the interpreter's start and the imports."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time after boot
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0.0 <= age < 86_400.0 else now


def warn_idle_ranks(ctx: Any, used: int, what: str) -> None:
    """On rank 0: one line on stderr when ``mpiexec`` started more ranks than the job uses."""
    if ctx.rank == 0 and ctx.size > used:
        idle = f"rank {used}" if ctx.size == used + 1 else f"ranks {used}-{ctx.size - 1}"
        sys.stderr.write(f"mpifc: warning: mpiexec started {ctx.size} ranks, but {what} uses {used}; {idle} "
                         f"will idle (run mpiexec -n {used})\n")
        sys.stderr.flush()


def resolve_glue_and_refine(cfg: dict[str, Any], manifest: Any) -> dict[str, Any]:
    """Fill ``glue``, ``refine``, ``em_iters`` and ``em_rows`` left ``None`` (flags not given) in place, by the
    adaptive rule (:func:`mpifc.federated.defaults.default_glue`, :func:`~mpifc.federated.
    defaults.default_refine`) from the manifest's setting and which clients hold the target.
    Every rank reads the same manifest, so every rank resolves the same values."""
    from mpifc.federated.defaults import CLASS_GLUE_EM_ROWS, LEAF_EM_ITERS, default_glue, default_refine

    n = int(manifest.n_clients)
    target = manifest.target
    holders = sum(1 for c in manifest.clients if target is not None and target in c.get("features", ()))
    learners = [(cfg.get("client_learners") or {}).get(c, cfg.get("learner") or "learnspn") for c in range(n)]
    if cfg.get("glue") is None:
        rows = min((int(c.get("n_train") or 0) for c in manifest.clients), default=0)
        classes = int((manifest.features.get(target) or {}).get("n_categories") or 0) if target is not None else 0
        cfg["glue"] = default_glue(manifest.setting, holders, n, rows, learners, classes)
    if cfg.get("refine") is None:
        refine, iters = default_refine(manifest.setting, cfg["glue"], holders, n, learners,
                                       cfg.get("assign") or "flat")
        if (cfg.get("hyperparameters") or {}).get("dp_epsilon") is not None:
            refine, iters = "none", 0  # EM re-fits on the rows, outside the noise (mpifc.federated.dp)
        cfg["refine"] = refine
        if cfg.get("em_iters") is None and refine == "em":
            cfg["em_iters"] = LEAF_EM_ITERS if cfg.get("em_leaves") else iters
        if cfg.get("em_rows") is None and refine == "em":
            cfg["em_rows"] = CLASS_GLUE_EM_ROWS
    if cfg.get("em_iters") is None:
        cfg["em_iters"] = 5
    return cfg


def train(cfg: dict[str, Any], *, deadline: float | None = None, ledger: str | None = None,
          liveness: float = DEFAULT_LIMIT_S, on_summary: Callable[[dict[str, Any]], None] | None = None,
          device: str | None = None) -> int:
    """Run one-pass FedPC training as an MPI job on every rank; returns the exit code.

    Args:
        cfg: the settings (``dir``, ``learner``, ``client_learners``, ``glue``, ``clusters``,
            ``products``, ``seed``, ``hyperparameters``, ``model``, ``assign``, ``servers``,
            ``audit``, ``refine``, ``em_iters``, ``em_initial_model``, ``exclusive_timing``,
            ``json``), as :func:`mpifc.cli.train.train_config` builds them.
        deadline: the job's wall-clock limit in seconds, or None (see :func:`mpifc.runtime.job.run_job`).
        ledger: where rank 0 writes the per-message ledger CSV.
        liveness: seconds a rank may show no sign of life before the job ends naming it.
        on_summary: called on rank 0 with the training summary once every rank is done (it adds
            ``bytes_by_phase`` and ``clients`` from the gathered ledger).
        device: ``--device`` (auto, cpu, cuda, cuda:N): where each client's EiNet and RAT-SPN
            PCs fit (:mod:`mpifc.runtime.device`); None: auto.
    """
    from data_prep.shards import input_files, load_manifest, source_files
    from mpifc.runtime.job import run_job

    started = process_started()
    m = load_manifest(cfg["dir"])
    if clusters_without_target(cfg["hyperparameters"]) and m.target is None:
        raise UserError(f"--cluster-without-target: the manifest of {cfg['dir']} names no target column")
    for index, name in sorted((cfg.get("client_learners") or {}).items()):
        if not 0 <= int(index) < m.n_clients:
            raise UserError(f"--client-learner {index}={name}: there is no client {index} "
                            f"(the shards in {cfg['dir']} hold clients 0..{m.n_clients - 1})")
    if cfg.get("em_iters") is not None and int(cfg["em_iters"]) < 1:
        raise UserError(f"--em-iters must be >= 1, got {cfg['em_iters']}")
    resolve_glue_and_refine(cfg, m)
    if cfg["hyperparameters"].get("dp_epsilon") is not None and cfg["refine"] == "em":
        raise UserError("--dp-epsilon: --refine em passes per-sample values and re-fits the leaves on the rows, "
                        "which the noise does not cover; leave --refine out (or none)")
    from mpifc.fedpc.audit import AUDIT_OUTPUT
    from mpifc.federated.serialize import MODEL_OUTPUT
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    check_outputs([Output("--model", cfg["model"], MODEL_OUTPUT), Output("--ledger", ledger, LEDGER_OUTPUT),
                   Output("--em-initial-model", cfg.get("em_initial_model"), MODEL_OUTPUT),
                   Output("--audit", cfg.get("audit"), AUDIT_OUTPUT)],
                  input_files(m), source_files(m), overwrite=bool(cfg.get("overwrite")))
    n_servers = 1 + (int(cfg.get("servers") or 0) if cfg.get("assign") == "tree" else 0)

    def on_ledger(table: Any) -> None:
        summary = cfg.get("_summary")
        if summary is not None and on_summary is not None:
            summary["bytes_by_phase"] = bytes_by_phase(table)
            summary["clients"] = m.n_clients
            # the job's wall time on rank 0, from its process's start to every rank's end
            summary["job_wall_seconds"] = time.perf_counter() - started
            on_summary(summary)

    def job(ctx: Any) -> int:
        ctx.config = cfg  # one dict, so on_ledger sees rank 0's summary
        warn_idle_ranks(ctx, n_servers + m.n_clients,
                        f"training {m.n_clients} clients" + (f" with {n_servers} servers" if n_servers > 1 else ""))
        with progress.ticker("mpifc train", bool(cfg.get("progress")) and ctx.rank == 0):
            return _train_job(ctx, m)

    return run_job(job, config=cfg, servers=n_servers, min_clients=m.n_clients,
                   deadline=deadline, liveness=liveness, ledger_csv=ledger, on_ledger=on_ledger, device=device)


# -- evaluate ------------------------------------------------------------------------------------
def _evaluate_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest
    from mpifc.fedpc.evaluate import evaluate_rank
    from mpifc.fedpc.mpe import query_rank

    cfg = ctx.config
    audit = _install_audit(ctx, cfg, load_manifest(cfg["dir"]), train=False)
    # ll: likelihoods and conditionals; mpe / sample: the max-product and sampling passes
    result = evaluate_rank(ctx, cfg) if cfg.get("query", "ll") == "ll" else query_rank(ctx, cfg)
    _finish_audit(ctx, cfg, audit)
    if ctx.rank == 0:
        ctx.config["_result"] = result
    return 0


def evaluate(cfg: dict[str, Any], *, deadline: float | None = None, ledger: str | None = None,
             liveness: float = DEFAULT_LIMIT_S, on_result: Callable[[dict[str, Any]], None] | None = None,
             device: str | None = None) -> int:
    """Evaluate a trained FC (distributed or gathered) as an MPI job; returns the exit code.

    Args:
        cfg: the settings (``dir``, ``model``, ``distributed``, ``evidence``, ``batch``,
            ``output_npz``, ``audit``, ``query_rows``, ``query``, ``n_samples``, ``seed``,
            ``out``), as :func:`mpifc.cli.evaluate.evaluate_config` builds them.
        deadline: the job's wall-clock limit in seconds, or None (see :func:`mpifc.runtime.job.run_job`).
        ledger: where rank 0 writes the per-message ledger CSV.
        liveness: seconds a rank may show no sign of life before the job ends naming it.
        on_result: called on rank 0 with the metrics (with the query's bytes and messages from the
            gathered ledger) once every rank is done.
        device: ``--device``: where each rank's EiNet and RAT-SPN leaf PCs compute; None: auto.
    """
    from data_prep.shards import input_files, load_manifest, source_files
    from mpifc.federated.serialize import load_fc, model_sources
    from mpifc.runtime.job import run_job

    if cfg["batch"] < 1:
        raise UserError(f"--batch must be >= 1, got {cfg['batch']}")
    if cfg.get("query_rows") is not None and cfg["query_rows"] < 1:
        raise UserError(f"--query-rows must be >= 1, got {cfg['query_rows']}")
    fc = load_fc(cfg["model"], load_models=False)
    need = max(fc.ranks()) + 1 if cfg["distributed"] else 1
    if cfg.get("query") == "sample" and cfg["n_samples"] < 1:
        raise UserError(f"--n-samples must be >= 1, got {cfg['n_samples']}")
    from mpifc.fedpc.audit import AUDIT_OUTPUT
    from mpifc.fedpc.evaluate import NPZ_OUTPUT
    from mpifc.fedpc.mpe import ROWS_OUTPUT
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    m = load_manifest(cfg["dir"])
    check_outputs([Output("--ledger", ledger, LEDGER_OUTPUT), Output("--output-npz", cfg.get("output_npz"), NPZ_OUTPUT),
                   Output("--out", cfg.get("out"), ROWS_OUTPUT), Output("--audit", cfg.get("audit"), AUDIT_OUTPUT)],
                  [("the model", Path(cfg["model"]))] + input_files(m), model_sources(fc) + source_files(m),
                  overwrite=bool(cfg.get("overwrite")))

    def on_ledger(table: Any) -> None:
        result = cfg.get("_result") or {}
        rows = table.rows
        phases = [table.phases[p] for p in rows["phase"].tolist()]
        q = [i for i, ph in enumerate(phases) if ph in ("query", "query-setup")]
        result["bytes_query"] = int(rows["payload_bytes"][q].sum() + rows["header_bytes"][q].sum())
        result["messages"] = len(q)
        result["ranks"] = int(table.sent.shape[0])
        if on_result is not None:
            on_result(result)

    def job(ctx: Any) -> int:
        ctx.config = cfg  # share one dict so on_ledger sees rank 0's result
        cfg["_stage"] = ctx.stage  # output files (--out, --output-npz) appear only if the job succeeds
        if cfg["distributed"]:
            warn_idle_ranks(ctx, need, "this model's circuit")
        with progress.ticker("mpifc evaluate", bool(cfg.get("progress")) and ctx.rank == 0):
            return _evaluate_job(ctx)

    return run_job(job, config=cfg, servers=1, min_clients=need - 1, deadline=deadline, liveness=liveness,
                   ledger_csv=ledger, on_ledger=on_ledger, device=device)


# -- audit ---------------------------------------------------------------------------------------
def _client_of(cfg: dict[str, Any], manifest: Any) -> dict[int, int]:
    """The training job's client index of each client rank."""
    from mpifc.federated.assign import client_rank_map

    n_servers = int(cfg.get("servers") or 0) if cfg.get("assign") == "tree" else 0
    return {r: c for c, r in client_rank_map(range(manifest.n_clients), n_servers).items()}


def _install_audit(ctx: Any, cfg: dict[str, Any], manifest: Any, train: bool, shard: Any = None) -> Any:
    """``--audit``: this rank's :class:`~mpifc.fedpc.audit.SendAudit` on its transport (None
    without it). ``shard``: a client rank's own shard, if read already."""
    if not cfg.get("audit"):
        return None
    from data_prep.shards import read_client
    from mpifc.fedpc import protocol as P
    from mpifc.fedpc.audit import SendAudit

    # The per-sample data each job sends by design, and why (anything else is reported as not allowed).
    if train:
        allowed = {}
        if cfg.get("glue") == "cooccurrence":
            allowed[P.CLUSTER_IDS.name] = "--glue cooccurrence sends one k-means cluster id per aligned training row"
        if cfg.get("refine") == "em" and manifest.setting == "vertical":
            why = "--refine em on vertical data: exact EM passes per-sample values and flows over the aligned rows"
            allowed[P.VALUES.name] = allowed[P.FLOWS.name] = why
    else:
        why = "a query pass carries one value per query row"
        allowed = {k.name: why for k in (P.VALUES, P.MAX_VALUES, P.DECISIONS, P.ANSWER, P.EVIDENCE)}
    if not train:
        from mpifc.federated.serialize import load_fc

        client_of = {c.rank: c.index for c in load_fc(cfg["model"], load_models=False).clients.values()}
    else:
        client_of = _client_of(cfg, manifest)
    who = f"client {client_of[ctx.rank]} (rank {ctx.rank})" if ctx.rank in client_of else f"rank {ctx.rank}"
    audit = SendAudit(ctx.rank, allowed, findings=cfg.get("audit_findings") or "fail", directory=cfg["audit"],
                      who=who)
    if ctx.rank in client_of:
        if shard is None:
            shard = read_client(cfg["dir"], client_of[ctx.rank], manifest=manifest)
        real = [m == "real" for m in shard.meta_types]
        for rows, what in ((shard.x_train, "train"), (shard.x_valid, "valid"), (shard.x_test, "test")):
            audit.protect(rows, what, real=real, names=list(shard.features))
    audit.install(ctx.transport)
    return audit


def _install_model_check(ctx: Any, cfg: dict[str, Any], manifest: Any, shard: Any = None) -> Any:
    """Without ``--audit``: the audit of the models a training client sends (``fc.train.model``,
    ``fc.em.leaf``), no record written. It costs a search of a few kilobytes per PC (the
    per-sample values of EM, megabytes, are left to ``--audit``); a finding fails the job, or,
    with ``--audit-findings record``, is sent and the model's meta says so. ``shard``: the
    client's own shard, if read already."""
    from data_prep.shards import read_client
    from mpifc.fedpc.audit import SendAudit

    client_of = _client_of(cfg, manifest)
    if ctx.rank not in client_of:
        return None
    audit = SendAudit(ctx.rank, findings=cfg.get("audit_findings") or "fail",
                      who=f"client {client_of[ctx.rank]} (rank {ctx.rank})", payloads={"model_parameters"})
    if shard is None:
        shard = read_client(cfg["dir"], client_of[ctx.rank], manifest=manifest)
    real = [m == "real" for m in shard.meta_types]
    for rows, what in ((shard.x_train, "train"), (shard.x_valid, "valid"), (shard.x_test, "test")):
        audit.protect(rows, what, real=real, names=list(shard.features))
    audit.install(ctx.transport)
    return audit


# -- query ---------------------------------------------------------------------------------------
def query(cfg: dict[str, Any], load_rows: Any, *, deadline: float | None = None, ledger: str | None = None,
          liveness: float = DEFAULT_LIMIT_S, device: str | None = None,
          write_answer: Callable[[Any, Any], None] | None = None) -> int:
    """Answer a user's rows with the distributed passes (``mpifc query --distributed``); returns
    the exit code. The answer lands in ``cfg["_answer"]`` on rank 0.

    Args:
        cfg: ``model``, ``what``, ``target``, ``batch``, ``seed`` (see
            :func:`mpifc.fedpc.user_query.query_rank`).
        load_rows: called on rank 0 only, inside the job: returns the ``(n, D)`` model rows (it
            reads and encodes the user's file, so only the querier ever sees it).
        deadline: the job's wall-clock limit in seconds, or None (see :func:`mpifc.runtime.job.run_job`).
        ledger: where rank 0 writes the per-message ledger CSV.
        device: ``--device``: where each rank's EiNet and RAT-SPN leaf PCs compute; None: auto.
        write_answer: called on rank 0 inside the job as ``write_answer(answer, stage)``, where
            ``stage(path)`` gives the partial file to write instead of ``path``: the answer file
            then appears with the ledger, only if the whole job succeeds.
    """
    from mpifc.federated.serialize import load_fc
    from mpifc.fedpc.user_query import query_rank
    from mpifc.runtime.job import run_job

    fc = load_fc(cfg["model"], load_models=False)
    need = max(fc.ranks()) + 1

    def job(ctx: Any) -> int:
        warn_idle_ranks(ctx, need, "this model's circuit")
        with progress.ticker("mpifc query", bool(cfg.get("progress")) and ctx.rank == 0):
            rows = load_rows() if ctx.rank == 0 else None
            answer = query_rank(ctx, cfg, rows)
        if ctx.rank == 0:
            cfg["_answer"] = answer
            if write_answer is not None:
                write_answer(answer, ctx.stage)
        return 0

    return run_job(job, config=cfg, servers=1, min_clients=need - 1, deadline=deadline, liveness=liveness,
                   ledger_csv=ledger, device=device)


def _finish_audit(ctx: Any, cfg: dict[str, Any], audit: Any) -> None:
    """Every rank writes its audit file; then rank 0 merges them into ``audit-summary.json``
    (nothing without ``--audit``)."""
    if audit is None or not cfg.get("audit"):
        return
    from mpifc.fedpc.audit import merge
    from mpifc.runtime.outputs import shared_partial

    audit.moment_coincidences = int(cfg.get("_moment_coincidences", 0))
    # Staged like every output: in place only if the whole job succeeds.
    d = Path(cfg["audit"])
    audit.write(d, ctx.outputs.stage(d / f"audit-rank{ctx.rank}.json", shared=True))
    ctx.transport.barrier()
    if ctx.rank == 0:
        merge(d, files=[shared_partial(d / f"audit-rank{r}.json") for r in range(ctx.size)],
              to=ctx.stage(d / "audit-summary.json"))
