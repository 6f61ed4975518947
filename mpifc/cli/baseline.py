"""``mpifc baseline NAME``: the peers FedPC is measured against, on the same shards and runtime.

* ``fedavg``: FedAvg with an MLP, horizontal FL (MPI job: ``mpiexec -n C+1``);
* ``splitnn``: SplitNN with MLPs, vertical FL (MPI job);
* ``central``: centralized gradient boosting or MLP on the joined shards (one process);
* ``decentralized dl|di``: the decentralised-learning and decentralised-inference agents of the
  cost-of-decentralisation study (MPI job).
"""
from __future__ import annotations

import argparse
from typing import Any

from mpifc.cli.common import add_deadline_argument, add_device_argument, add_overwrite_argument, parse_kv
from mpifc.federated.hyperparameters import check_hyperparameters



def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Options every federated baseline job takes."""
    p.add_argument("dir", help="shard directory written by data_prep")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and shuffling seed")
    p.add_argument("--lr", type=float, default=0.1, help="SGD step size")
    p.add_argument("--batch-size", type=int, default=32, help="rows per SGD step (0 = full batch)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="parameter and activation dtype (sets the itemsize on the wire)")
    p.add_argument("--ledger", default=None, help="per-message ledger CSV (written by rank 0)")
    add_deadline_argument(p)
    add_device_argument(p, "MLP (training and prediction)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line on rank 0")
    add_overwrite_argument(p)


def add_fedavg_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``mpifc baseline fedavg``."""
    from mpifc.baselines.fedavg import DEFAULT_HIDDEN

    add_common_arguments(p)
    p.add_argument("--rounds", type=int, default=20, help="K, communication rounds")
    p.add_argument("--local-epochs", type=int, default=1, help="E, local epochs per round")
    p.add_argument("--fraction", type=float, default=1.0, help="share of clients sampled per round")
    p.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)), help="hidden widths, e.g. 64,32")
    p.add_argument("--save-params", default=None, help="rank 0 writes the final global parameters here (.npy)")


def add_splitnn_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``mpifc baseline splitnn``."""
    from mpifc.baselines.splitnn import DEFAULT_BOTTOM, DEFAULT_TOP

    add_common_arguments(p)
    p.add_argument("--epochs", type=int, default=10, help="E, training epochs")
    p.add_argument("--cut", type=int, default=8, help="F, cut-layer width per client")
    p.add_argument("--bottom-hidden", default=",".join(map(str, DEFAULT_BOTTOM)), help="bottom MLP hidden widths")
    p.add_argument("--top-hidden", default=",".join(map(str, DEFAULT_TOP)), help="top MLP hidden widths")
    p.add_argument("--save-params", default=None, help="directory for each rank's final parameters (.npy)")


def add_central_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``mpifc baseline central``."""
    p.add_argument("dir", help="shard directory written by data_prep")
    p.add_argument("--model", default="hgb", choices=("hgb", "mlp"),
                   help="hgb: scikit-learn's HistGradientBoostingClassifier (the ceiling); mlp: an MLP by plain SGD")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--hidden", default="64,32", help="mlp: hidden layer widths")
    p.add_argument("--epochs", type=int, default=50, help="mlp: passes over the joined rows")
    p.add_argument("--batch-size", type=int, default=32, help="mlp: rows per SGD step")
    p.add_argument("--lr", type=float, default=0.1, help="mlp: SGD step size")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")


def add_decentralized_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``mpifc baseline decentralized``."""
    p.add_argument("mode", choices=("dl", "di"),
                   help="dl: every agent learns its own PC (DL/CI, DL/DI); di: each agent answers alone from the CL FedPC (CL/DI)")
    p.add_argument("dir", help="shard directory (dl: --label-owner all; di: the CL model's shards)")
    p.add_argument("--out", required=True, help="directory for the per-setting .npz outputs")
    p.add_argument("--model", default=None, help="di: the CL FedPC model file (from mpifc train)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--threshold", type=float, default=None, help="LearnSPN RDC threshold (dl)")
    p.add_argument("--min-instances-slice", type=int, default=None, help="LearnSPN min rows per slice (dl)")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                   help="dl: extra LearnSPN hyperparameter (repeatable; checked like mpifc train's)")
    p.add_argument("--ledger", default=None, help="per-message ledger CSV")
    add_deadline_argument(p)
    p.add_argument("--json", action="store_true", help="print the bytes per phase as one JSON line")
    add_overwrite_argument(p)


BASELINES = {
    "fedavg": ("FedAvg with an MLP over horizontally partitioned shards (MPI job)", add_fedavg_arguments),
    "splitnn": ("SplitNN with MLPs over vertically partitioned shards (MPI job)", add_splitnn_arguments),
    "central": ("centralized reference on the joined shards (no MPI)", add_central_arguments),
    "decentralized": ("decentralised learning (dl) or inference (di) agents of the vertical-FL cost study (MPI job)",
                      add_decentralized_arguments),
}


def add_baseline_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc baseline``: one sub-command per baseline."""
    sub = p.add_subparsers(dest="baseline", metavar="BASELINE", required=True,
                           help="which baseline (each takes --help)")
    for name, (help_text, add) in BASELINES.items():
        add(sub.add_parser(name, help=help_text, description=help_text, formatter_class=p.formatter_class))


def fedavg_config(args: argparse.Namespace) -> Any:
    """The :class:`~mpifc.baselines.fedavg.FedAvgConfig` of parsed flags."""
    from mpifc.baselines.fedavg import FedAvgConfig
    from mpifc.baselines.mlp import parse_hidden

    return FedAvgConfig(dir=args.dir, rounds=args.rounds, local_epochs=args.local_epochs, fraction=args.fraction,
                        batch_size=args.batch_size, lr=args.lr, hidden=parse_hidden(args.hidden), seed=args.seed,
                        dtype=args.dtype, deadline=args.deadline, save_params=args.save_params, device=args.device)


def splitnn_config(args: argparse.Namespace) -> Any:
    """The :class:`~mpifc.baselines.splitnn.SplitNNConfig` of parsed flags."""
    from mpifc.baselines.mlp import parse_hidden
    from mpifc.baselines.splitnn import SplitNNConfig

    return SplitNNConfig(dir=args.dir, epochs=args.epochs, cut=args.cut, batch_size=args.batch_size, lr=args.lr,
                         bottom_hidden=parse_hidden(args.bottom_hidden), top_hidden=parse_hidden(args.top_hidden),
                         seed=args.seed, dtype=args.dtype, deadline=args.deadline, save_params=args.save_params,
                         device=args.device)


def baseline_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc baseline``; returns the exit code."""
    if args.baseline == "fedavg":
        from mpifc.baselines.fedavg import run

        return run(fedavg_config(args), args.ledger, args.json, overwrite=args.overwrite)
    if args.baseline == "splitnn":
        from mpifc.baselines.splitnn import run

        return run(splitnn_config(args), args.ledger, args.json, overwrite=args.overwrite)
    if args.baseline == "central":
        from mpifc.baselines.central import run_central
        from mpifc.baselines.mlp import parse_hidden

        res = run_central(args.dir, args.model, args.seed, parse_hidden(args.hidden), args.epochs,
                          args.batch_size, args.lr)
        if args.json:
            from mpifc.runtime.jsonout import finite_json

            print(finite_json(res))
        else:
            for k, v in res.items():
                print(f"{k:>14}: {v}")
        return 0
    from mpifc.analysis.decentralization_job import run_agents

    hp = parse_kv(args.hp, "--hp")
    if args.threshold is not None:
        hp["threshold"] = args.threshold
    if args.min_instances_slice is not None:
        hp["min_instances_slice"] = args.min_instances_slice
    hp = check_hyperparameters(hp, ["learnspn"])
    return run_agents(args.mode, args.dir, args.out, model=args.model, seed=args.seed, hyperparameters=hp,
                      deadline=args.deadline, ledger=args.ledger, as_json=args.json, overwrite=args.overwrite)
