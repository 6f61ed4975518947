"""The FedPC ``train`` and ``evaluate`` jobs: what every rank of ``mpifc train/evaluate`` runs.

:func:`train` and :func:`evaluate` take a plain settings dict (built by :mod:`mpifc.cli.train`
and :mod:`mpifc.cli.evaluate` from the flags, or by a script) and run the job on every rank of
``COMM_WORLD``. Bad input exits with code 2 and a one-line message naming the client, rank,
feature or file, before any rank starts work: that includes every output path (writable, not an
input, not shared with another output). Outputs appear at their final paths only when the whole
job succeeded (:mod:`mpifc.runtime.outputs`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mpifc.atomic import check_outputs
from mpifc.errors import UserError
from mpifc.federated.one_pass import clusters_without_target
from mpifc.runtime.liveness import DEFAULT_LIMIT_S


# -- train ---------------------------------------------------------------------------------------
def _train_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest
    from mpifc.fedpc.train import train_rank

    cfg = ctx.config
    audit = _install_audit(ctx, cfg, load_manifest(cfg["dir"]), train=True)
    summary = train_rank(ctx, cfg, load_manifest(cfg["dir"]))
    _finish_audit(ctx, cfg, audit)
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


def resolve_glue_and_refine(cfg: dict[str, Any], manifest: Any) -> dict[str, Any]:
    """Fill ``glue``, ``refine``, ``em_iters`` and ``em_rows`` left ``None`` (flags not given) in place, by the
    adaptive rule (:func:`mpifc.federated.defaults.default_glue`, :func:`~mpifc.federated.
    defaults.default_refine`) from the manifest's setting and which clients hold the target.
    Every rank reads the same manifest, so every rank resolves the same values."""
    from mpifc.federated.defaults import CLASS_GLUE_EM_ROWS, default_glue, default_refine

    n = int(manifest.n_clients)
    target = manifest.target
    holders = sum(1 for c in manifest.clients if target is not None and target in c.get("features", ()))
    learners = [(cfg.get("client_learners") or {}).get(c, cfg.get("learner") or "learnspn") for c in range(n)]
    if cfg.get("glue") is None:
        rows = min((int(c.get("n_train") or 0) for c in manifest.clients), default=0)
        cfg["glue"] = default_glue(manifest.setting, holders, n, rows, learners)
    if cfg.get("refine") is None:
        refine, iters = default_refine(manifest.setting, cfg["glue"], holders, n, learners,
                                       cfg.get("assign") or "flat")
        cfg["refine"] = refine
        if cfg.get("em_iters") is None and refine == "em":
            cfg["em_iters"] = iters
        if cfg.get("em_rows") is None and refine == "em":
            cfg["em_rows"] = CLASS_GLUE_EM_ROWS
    if cfg.get("em_iters") is None:
        cfg["em_iters"] = 5
    return cfg


def train(cfg: dict[str, Any], *, deadline: float = 300.0, ledger: str | None = None,
          liveness: float = DEFAULT_LIMIT_S, on_summary: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Run one-pass FedPC training as an MPI job on every rank; returns the exit code.

    Args:
        cfg: the settings (``dir``, ``learner``, ``client_learners``, ``glue``, ``clusters``,
            ``products``, ``seed``, ``hyperparameters``, ``model``, ``assign``, ``servers``,
            ``audit``, ``refine``, ``em_iters``, ``em_initial_model``, ``exclusive_timing``,
            ``json``), as :func:`mpifc.cli.train.train_config` builds them.
        deadline: seconds any single send or receive may wait.
        ledger: where rank 0 writes the per-message ledger CSV.
        liveness: seconds a rank may show no sign of life before the job ends naming it.
        on_summary: called on rank 0 with the training summary once every rank is done (it adds
            ``bytes_by_phase`` and ``clients`` from the gathered ledger).
    """
    from data_prep.shards import input_files, load_manifest
    from mpifc.runtime.job import run_job

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
    check_outputs([("--model", cfg["model"], False), ("--ledger", ledger, False),
                   ("--em-initial-model", cfg.get("em_initial_model"), False), ("--audit", cfg.get("audit"), True)],
                  input_files(m))
    n_servers = 1 + (int(cfg.get("servers") or 0) if cfg.get("assign") == "tree" else 0)

    def on_ledger(table: Any) -> None:
        summary = cfg.get("_summary")
        if summary is not None and on_summary is not None:
            summary["bytes_by_phase"] = bytes_by_phase(table)
            summary["clients"] = m.n_clients
            on_summary(summary)

    def job(ctx: Any) -> int:
        ctx.config = cfg  # one dict, so on_ledger sees rank 0's summary
        return _train_job(ctx)

    return run_job(job, config=cfg, servers=n_servers, min_clients=m.n_clients,
                   deadline=deadline, liveness=liveness, ledger_csv=ledger, on_ledger=on_ledger)


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


def evaluate(cfg: dict[str, Any], *, deadline: float = 300.0, ledger: str | None = None,
             liveness: float = DEFAULT_LIMIT_S, on_result: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Evaluate a trained FC (distributed or gathered) as an MPI job; returns the exit code.

    Args:
        cfg: the settings (``dir``, ``model``, ``distributed``, ``evidence``, ``batch``,
            ``output_npz``, ``audit``, ``query_rows``, ``query``, ``n_samples``, ``seed``,
            ``out``), as :func:`mpifc.cli.evaluate.evaluate_config` builds them.
        deadline: seconds any single send or receive may wait.
        ledger: where rank 0 writes the per-message ledger CSV.
        liveness: seconds a rank may show no sign of life before the job ends naming it.
        on_result: called on rank 0 with the metrics (with the query's bytes and messages from the
            gathered ledger) once every rank is done.
    """
    from data_prep.shards import input_files, load_manifest
    from mpifc.federated.serialize import load_fc
    from mpifc.runtime.job import run_job

    if cfg["batch"] < 1:
        raise UserError(f"--batch must be >= 1, got {cfg['batch']}")
    if cfg.get("query_rows") is not None and cfg["query_rows"] < 1:
        raise UserError(f"--query-rows must be >= 1, got {cfg['query_rows']}")
    fc = load_fc(cfg["model"], load_models=False)
    need = max(fc.ranks()) + 1 if cfg["distributed"] else 1
    if cfg.get("query") == "sample" and cfg["n_samples"] < 1:
        raise UserError(f"--n-samples must be >= 1, got {cfg['n_samples']}")
    check_outputs([("--ledger", ledger, False), ("--output-npz", cfg.get("output_npz"), False),
                   ("--out", cfg.get("out"), False), ("--audit", cfg.get("audit"), True)],
                  [("the model", Path(cfg["model"]))] + input_files(load_manifest(cfg["dir"])))

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
        return _evaluate_job(ctx)

    return run_job(job, config=cfg, servers=1, min_clients=need - 1, deadline=deadline, liveness=liveness,
                   ledger_csv=ledger, on_ledger=on_ledger)


# -- audit ---------------------------------------------------------------------------------------
def _install_audit(ctx: Any, cfg: dict[str, Any], manifest: Any, train: bool) -> Any:
    if not cfg.get("audit"):
        return None
    from data_prep.shards import read_client
    from mpifc.federated.assign import client_rank_map
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
    audit = SendAudit(ctx.rank, allowed)
    n_servers = int(cfg.get("servers") or 0) if cfg.get("assign") == "tree" else 0
    if not train:
        from mpifc.federated.serialize import load_fc

        ranks = {c.index: c.rank for c in load_fc(cfg["model"], load_models=False).clients.values()}
    else:
        ranks = client_rank_map(range(manifest.n_clients), n_servers)
    client_of = {r: c for c, r in ranks.items()}
    if ctx.rank in client_of:
        shard = read_client(cfg["dir"], client_of[ctx.rank])
        audit.protect(shard.x_train, "train")
        audit.protect(shard.x_test, "test")
    audit.install(ctx.transport)
    Path(cfg["audit"]).mkdir(parents=True, exist_ok=True)
    return audit


# -- query ---------------------------------------------------------------------------------------
def query(cfg: dict[str, Any], load_rows: Any, *, deadline: float = 300.0, ledger: str | None = None,
          liveness: float = DEFAULT_LIMIT_S) -> int:
    """Answer a user's rows with the distributed passes (``mpifc query --distributed``); returns
    the exit code. The answer lands in ``cfg["_answer"]`` on rank 0.

    Args:
        cfg: ``model``, ``what``, ``target``, ``batch``, ``seed`` (see
            :func:`mpifc.fedpc.user_query.query_rank`).
        load_rows: called on rank 0 only, inside the job: returns the ``(n, D)`` model rows (it
            reads and encodes the user's file, so only the querier ever sees it).
        deadline: seconds any single send or receive may wait.
        ledger: where rank 0 writes the per-message ledger CSV.
    """
    from mpifc.federated.serialize import load_fc
    from mpifc.fedpc.user_query import query_rank
    from mpifc.runtime.job import run_job

    fc = load_fc(cfg["model"], load_models=False)
    need = max(fc.ranks()) + 1

    def job(ctx: Any) -> int:
        rows = load_rows() if ctx.rank == 0 else None
        answer = query_rank(ctx, cfg, rows)
        if ctx.rank == 0:
            cfg["_answer"] = answer
        return 0

    return run_job(job, config=cfg, servers=1, min_clients=need - 1, deadline=deadline, liveness=liveness,
                   ledger_csv=ledger)


def _finish_audit(ctx: Any, cfg: dict[str, Any], audit: Any) -> None:
    """Every rank writes its audit file; then rank 0 merges them into ``audit-summary.json``."""
    if audit is None:
        return
    from mpifc.fedpc.audit import merge

    audit.write(cfg["audit"])
    ctx.transport.barrier()
    if ctx.rank == 0:
        merge(cfg["audit"])
