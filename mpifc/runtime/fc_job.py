"""``train`` and ``evaluate`` jobs for federated circuits (wired into ``mpifc train/evaluate``).

Until the CLI wires them in: ``mpiexec -n R python -m mpifc.runtime.fc_job train DIR ...`` and
``... evaluate DIR --model M.h5 [--distributed]``. Bad input exits with code 2 and a one-line
message naming the client, rank, feature or file; no model file is left half-written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mpifc.errors import UserError
from mpifc.federated.assign import ASSIGN_STRATEGIES
from mpifc.federated.learners import learner_names
from mpifc.federated.one_pass import CLUSTER_WITHOUT_TARGET, GLUE_MODES, clusters_without_target


def _parse_kv(items: list[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{what} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                out[k] = cast(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out


# -- train ---------------------------------------------------------------------------------------
def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc train``."""
    p.add_argument("dir", help="shard directory written by data_prep")
    p.add_argument("--learner", default="learnspn", choices=learner_names(), help="client PC learner")
    p.add_argument("--client-learner", action="append", default=[], metavar="IDX=NAME",
                   help="per-client learner override (repeatable)")
    p.add_argument("--glue", default="random", choices=GLUE_MODES)
    p.add_argument("--clusters", type=int, default=2, help="K, clusters per single-owner subspace")
    p.add_argument("--products", type=int, default=4, help="P, products of the random glue")
    p.add_argument("--cluster-without-target", action="store_true",
                   help="the label owner's k-means leaves the target column out (its cluster PCs still model "
                        "it), so no cluster is a 'label cluster'; default off (Algorithm 1 as written). "
                        "Same as --hp cluster_without_target=1; see mpifc.federated.one_pass.CLUSTER_WITHOUT_TARGET")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=None, help="LearnSPN RDC threshold")
    p.add_argument("--min-instances-slice", type=int, default=None, help="LearnSPN min rows per slice")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="extra learner hyperparameter")
    p.add_argument("--model", required=True, help="output model file (HDF5, written atomically)")
    p.add_argument("--ledger", default=None, help="per-message ledger CSV")
    p.add_argument("--assign", default="flat", choices=ASSIGN_STRATEGIES, help="ψ strategy")
    p.add_argument("--servers", type=int, default=0, help="intermediate server ranks for --assign tree")
    p.add_argument("--refine", default="none", choices=("none", "em"),
                   help="em: exact distributed EM after one-pass training (vertical: per-sample flows, "
                        "--assign flat; horizontal/hybrid: pooled E-step statistics)")
    p.add_argument("--em-iters", type=int, default=5, help="EM iterations for --refine em")
    p.add_argument("--em-initial-model", default=None, help="also write the model before EM here")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds any send/receive may wait")
    p.add_argument("--audit", default=None, help="directory for per-rank privacy-audit JSON")
    p.add_argument("--json", action="store_true", help="print a JSON summary on rank 0")
    p.add_argument("--exclusive-timing", action="store_true",
                   help="clients learn one after another, so each client's CPU seconds are measured without "
                        "its own job's other ranks competing for the cores (same model and messages)")


def train_config(args: argparse.Namespace) -> dict[str, Any]:
    hp = _parse_kv(args.hp, "--hp")
    if args.threshold is not None:
        hp["threshold"] = args.threshold
    if args.min_instances_slice is not None:
        hp["min_instances_slice"] = args.min_instances_slice
    if getattr(args, "cluster_without_target", False):
        hp[CLUSTER_WITHOUT_TARGET] = True  # a plan hyperparameter: sent with the plan, never to a learner
    learners = {}
    for k, v in _parse_kv(args.client_learner, "--client-learner").items():
        if v not in learner_names():
            raise UserError(f"--client-learner {k}={v}: unknown learner; known: {', '.join(learner_names())}")
        learners[int(k)] = v
    if args.assign == "tree" and args.servers < 1:
        raise UserError("--assign tree needs --servers S with S >= 1")
    return {"dir": str(args.dir), "learner": args.learner, "client_learners": learners, "glue": args.glue,
            "clusters": args.clusters, "products": args.products, "seed": args.seed, "hyperparameters": hp,
            "model": str(args.model), "assign": args.assign, "servers": args.servers, "audit": args.audit,
            "refine": args.refine, "em_iters": args.em_iters, "em_initial_model": args.em_initial_model,
            "exclusive_timing": bool(args.exclusive_timing)}


def _train_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest
    from mpifc.runtime.fc_train import train_rank

    cfg = ctx.config
    audit = _install_audit(ctx, cfg, load_manifest(cfg["dir"]), train=True)
    summary = train_rank(ctx, cfg, load_manifest(cfg["dir"]))
    if audit is not None:
        audit.write(cfg["audit"])
    if summary is not None and cfg.get("json"):
        print(json.dumps(summary), flush=True)
    return 0


def train_main(args: argparse.Namespace) -> int:
    """Run one-pass FedPC training as an MPI job; returns the exit code."""
    from data_prep.shards import load_manifest
    from mpifc.runtime.job import run_job

    cfg = train_config(args)
    cfg["json"] = bool(args.json)
    m = load_manifest(args.dir)
    if clusters_without_target(cfg["hyperparameters"]) and m.target is None:
        raise UserError(f"--cluster-without-target: the manifest of {args.dir} names no target column")
    n_servers = 1 + (args.servers if args.assign == "tree" else 0)
    return run_job(_train_job, config=cfg, servers=n_servers, min_clients=m.n_clients,
                   deadline=args.deadline, ledger_csv=args.ledger)


# -- evaluate ------------------------------------------------------------------------------------
def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc evaluate``."""
    p.add_argument("dir", help="shard directory written by data_prep")
    p.add_argument("--model", required=True, help="model file written by train")
    p.add_argument("--distributed", action="store_true", help="upward pass over the ranks ψ names")
    p.add_argument("--evidence", default="auto", choices=("auto", "querier", "local"),
                   help="who supplies the test rows: auto = each client for vertical data, else the querier")
    p.add_argument("--batch", type=int, default=10_000, help="samples per upward pass")
    p.add_argument("--query-rows", type=int, default=None,
                   help="repeat the test rows to this many queries (throughput runs; metrics then "
                        "average over the repeated rows)")
    p.add_argument("--ledger", default=None, help="per-message ledger CSV")
    p.add_argument("--output-npz", default=None, help="write per-sample class log-joints (n, k) here")
    p.add_argument("--deadline", type=float, default=300.0)
    p.add_argument("--audit", default=None, help="directory for per-rank privacy-audit JSON")
    p.add_argument("--json", action="store_true", help="print metrics as JSON on rank 0")
    p.add_argument("--query", default="ll", choices=("ll", "mpe", "sample"),
                   help="ll: log-likelihood/conditionals (default); mpe: most probable completion of the "
                        "test rows with the target blanked; sample: --n-samples unconditional samples")
    p.add_argument("--n-samples", type=int, default=1000, help="samples drawn by --query sample")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of --query sample (per-node streams)")
    p.add_argument("--out", default=None, help="HDF5 file for the MPE completions or samples (dataset x)")


def _evaluate_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest
    from mpifc.runtime.fc_eval import evaluate_rank

    cfg = ctx.config
    audit = _install_audit(ctx, cfg, load_manifest(cfg["dir"]), train=False)
    result = evaluate_rank(ctx, cfg)
    if audit is not None:
        audit.write(cfg["audit"])
    if ctx.rank == 0:
        ctx.config["_result"] = result
    return 0


def evaluate_main(args: argparse.Namespace) -> int:
    """Evaluate a trained FC (distributed or gathered); returns the exit code."""
    from mpifc.federated.serialize import load_fc
    from mpifc.runtime.job import run_job

    if args.batch < 1:
        raise UserError(f"--batch must be >= 1, got {args.batch}")
    if args.query_rows is not None and args.query_rows < 1:
        raise UserError(f"--query-rows must be >= 1, got {args.query_rows}")
    fc = load_fc(args.model, load_models=False)
    need = max(fc.ranks()) + 1 if args.distributed else 1
    cfg = {"dir": str(args.dir), "model": str(args.model), "distributed": bool(args.distributed),
           "evidence": args.evidence, "batch": args.batch, "output_npz": args.output_npz,
           "audit": args.audit, "query_rows": args.query_rows, "query": args.query, "n_samples": args.n_samples, "seed": args.sample_seed,
           "out": args.out}
    if args.query == "sample" and args.n_samples < 1:
        raise UserError(f"--n-samples must be >= 1, got {args.n_samples}")

    def on_ledger(table: Any) -> None:
        result = cfg.get("_result") or {}
        rows = table.rows
        phases = [table.phases[p] for p in rows["phase"].tolist()]
        q = [i for i, ph in enumerate(phases) if ph in ("query", "query-setup")]
        result["bytes_query"] = int(rows["payload_bytes"][q].sum() + rows["header_bytes"][q].sum())
        result["messages"] = len(q)
        result["ranks"] = int(table.sent.shape[0])
        if args.json:
            print(json.dumps(result), flush=True)

    def job(ctx: Any) -> int:
        ctx.config = cfg  # share one dict so on_ledger sees rank 0's result
        return _evaluate_job(ctx)

    return run_job(job, config=cfg, servers=1, min_clients=need - 1, deadline=args.deadline,
                   ledger_csv=args.ledger, on_ledger=on_ledger)


# -- audit ---------------------------------------------------------------------------------------
def _install_audit(ctx: Any, cfg: dict[str, Any], manifest: Any, train: bool) -> Any:
    if not cfg.get("audit"):
        return None
    from data_prep.shards import read_client
    from mpifc.federated.assign import client_rank_map
    from mpifc.runtime.fc_audit import SendAudit

    audit = SendAudit(ctx.rank)
    n_servers = int(cfg.get("servers") or 0) if cfg.get("assign") == "tree" else 0
    if not train:
        from mpifc.federated.serialize import load_fc

        ranks = {c.index: c.rank for c in load_fc(cfg["model"], load_models=False).clients.values()}
    else:
        ranks = client_rank_map(range(manifest.n_clients), n_servers)
    client_of = {r: c for c, r in ranks.items()}
    if ctx.rank in client_of:
        shard = read_client(cfg["dir"], client_of[ctx.rank])
        audit.protect(shard.x_train)
        audit.protect(shard.x_test)
    audit.install(ctx.transport)
    Path(cfg["audit"]).mkdir(parents=True, exist_ok=True)
    return audit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifc.runtime.fc_job")
    sub = p.add_subparsers(dest="command", required=True)
    add_train_arguments(sub.add_parser("train", help="one-pass FedPC training"))
    add_evaluate_arguments(sub.add_parser("evaluate", help="evaluate a trained FC"))
    args = p.parse_args(argv)
    try:
        if args.command == "train":
            return train_main(args)
        return evaluate_main(args)
    except UserError as e:
        from mpifc.runtime.failure import abort_job

        abort_job(e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
