"""``mpifc evaluate``: a trained FedPC on the held-out test set (or FedNGM with ``--model-family ngm``).

Without ``--distributed`` the gathered model is evaluated in one process; with it, under
``mpiexec``, the upward pass runs over the ranks ψ names (:func:`mpifc.fedpc.job.evaluate`).
"""
from __future__ import annotations

import argparse
from typing import Any

from mpifc.cli.common import (add_audit_arguments, add_deadline_argument, add_device_argument, add_liveness_argument,
                              add_output_arguments, add_overwrite_argument)
from mpifc.cli.train import FAMILIES


def add_fedpc_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """The FedPC flags of ``mpifc evaluate``."""
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
    add_deadline_argument(p)
    add_liveness_argument(p)
    add_device_argument(p, "EiNet and RAT-SPN leaf PCs")
    add_audit_arguments(p)
    add_overwrite_argument(p)
    add_output_arguments(p, "the metrics (rank 0)")
    p.add_argument("--query", default="ll", choices=("ll", "mpe", "sample"),
                   help="ll: log-likelihood/conditionals; mpe: most probable completion of the "
                        "test rows with the target blanked; sample: --n-samples unconditional samples")
    p.add_argument("--n-samples", type=int, default=1000, help="samples drawn by --query sample")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of --query sample (per-node streams)")
    p.add_argument("--out", default=None, help="HDF5 file for the MPE completions or samples (dataset x)")


def add_ngm_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--model-family ngm`` flags of ``mpifc evaluate``."""
    g = p.add_argument_group("FedNGM (--model-family ngm)")
    g.add_argument("--target", action="append", default=[], metavar="NAME",
                   help="feature to predict from the others (repeatable; default: the dataset target)")
    g.add_argument("--client", type=int, default=None, metavar="K",
                   help="evaluate on client K's own test rows instead of test.h5")
    g.add_argument("--infer-steps", type=int, default=None, help="input-optimisation steps (default: the model's)")


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc evaluate``: FedPC's, ``--model-family`` and the FedNGM group."""
    add_fedpc_evaluate_arguments(p)
    p.add_argument("--model-family", default="fc", choices=FAMILIES, help="fc: federated circuits; ngm: FedNGM")
    add_ngm_evaluate_arguments(p)


def evaluate_config(args: argparse.Namespace) -> dict[str, Any]:
    """The FedPC evaluation settings of parsed flags."""
    return {"dir": str(args.dir), "model": str(args.model), "distributed": bool(args.distributed),
            "evidence": args.evidence, "batch": args.batch, "output_npz": args.output_npz,
            "audit": args.audit, "audit_findings": args.audit_findings, "query_rows": args.query_rows,
            "query": args.query, "n_samples": args.n_samples, "seed": args.sample_seed, "out": args.out,
            "overwrite": bool(getattr(args, "overwrite", False))}


def evaluate_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc evaluate``; returns the exit code."""
    if getattr(args, "model_family", "fc") == "ngm":
        from mpifc.ngm.shard_jobs import evaluate

        return evaluate(str(args.dir), str(args.model), list(args.target), args.client, args.infer_steps,
                        as_json=args.json, quiet=args.quiet)
    from mpifc.cli.summary import emit, evaluate_text
    from mpifc.cli.train import output_mode
    from mpifc.fedpc.job import evaluate

    cfg = evaluate_config(args)
    cfg["progress"] = output_mode(args) == "human"
    return evaluate(cfg, deadline=args.deadline, ledger=args.ledger, liveness=args.liveness,
                    device=args.device, on_result=lambda s: emit(s, output_mode(args), evaluate_text))
