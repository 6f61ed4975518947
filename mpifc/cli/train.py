"""``mpifc train``: one-pass FedPC training (or FedNGM with ``--model-family ngm``) as an MPI job.

Rank 0 is the server; one rank per client follows (``mpiexec -n C+1``). The flags become a plain
settings dict (:func:`train_config`) that :func:`mpifc.fedpc.job.train` runs on every rank.
"""
from __future__ import annotations

import argparse
import functools
import math
from typing import Any

from mpifc.cli.common import (add_audit_arguments, add_deadline_argument, add_device_argument, add_liveness_argument,
                              add_output_arguments, add_overwrite_argument, comma_ints, parse_kv)
from mpifc.errors import UserError
from mpifc.federated.assign import ASSIGN_STRATEGIES
from mpifc.federated.defaults import PRESETS, RULE_HELP
from mpifc.federated.hyperparameters import LEARNER_PARAMS, check_hyperparameters
from mpifc.federated.learners import learner_names
from mpifc.federated.one_pass import CLUSTER_WITHOUT_TARGET, GLUE_MODES

FAMILIES = ("fc", "ngm")
"""``--model-family``: fc = federated circuits (FedPC), ngm = FedNGM."""


def add_fedpc_train_arguments(p: argparse.ArgumentParser) -> None:
    """The FedPC flags of ``mpifc train``."""
    p.epilog = (RULE_HELP + " With --setting central shards (one client holding every row and "
                "feature) training is Algorithm 1 on that client: by default one LearnSPN (K = 1); "
                "with --clusters K, a k-means split into K clusters, one LearnSPN each, glued as any "
                "single-owner subspace.")
    p.add_argument("dir", help="shard directory written by data_prep")
    p.add_argument("--learner", default=None, choices=learner_names(),
                   help="client PC learner (default: learnspn; factorized with --dp-epsilon)")
    p.add_argument("--client-learner", action="append", default=[], metavar="IDX=NAME",
                   help="per-client learner override (repeatable)")
    p.add_argument("--preset", default="adaptive", choices=PRESETS,
                   help="what fills the settings not given (see below): adaptive, learner "
                        "(the learners' own defaults, K = 2), paper (Table 4 for the shards' dataset)")
    p.add_argument("--glue", default=None, choices=GLUE_MODES,
                   help="how the clients' PCs are joined: class = the target's holders split their rows by "
                        "class, one product per class (vertical: with every k-means cluster of the other "
                        "clients, tied to the classes by EM); random = the paper's P products of randomly "
                        "chosen clusters; combinatorial = every combination of clusters, weighted by the "
                        "product of cluster fractions; cooccurrence = every observed combination, weighted by "
                        "its frequency (clients send one cluster id per aligned row); default: class for "
                        "classification with two clients or more (horizontal: while a client has fewer than "
                        "1,000 rows), else random (--preset learner: random; "
                        "--preset paper: Table 4's)")
    p.add_argument("--clusters", type=int, default=None,
                   help="K, clusters per single-owner subspace (default: the preset's rule, see below)")
    p.add_argument("--products", type=int, default=4, help="P, products of the random glue")
    p.add_argument("--cluster-without-target", action="store_true",
                   help="the label owner's k-means leaves the target column out (its cluster PCs still model "
                        "it), so no cluster is a 'label cluster'; default off (Algorithm 1 as written). "
                        "Same as --hp cluster_without_target=1; see mpifc.federated.one_pass.CLUSTER_WITHOUT_TARGET")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same model")
    p.add_argument("--threshold", type=float, default=None, help="LearnSPN RDC threshold (default: the preset's rule)")
    p.add_argument("--min-instances-slice", type=int, default=None, help="LearnSPN min rows per slice (default: the preset's rule)")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter of the learner (repeatable), checked before any rank starts: "
                        + "; ".join(f"{name}: {', '.join(keys)}" for name, keys in
                                    sorted((n, sorted(ps)) for n, ps in LEARNER_PARAMS.items())))
    p.add_argument("--model", required=True,
                   help="output model file (HDF5, written atomically); may replace only an earlier model "
                        "(see --overwrite)")
    p.add_argument("--ledger", default=None, help="per-message ledger CSV (may replace only an earlier ledger)")
    p.add_argument("--assign", default="flat", choices=ASSIGN_STRATEGIES, help="ψ strategy")
    p.add_argument("--servers", type=int, default=0, help="intermediate server ranks for --assign tree")
    p.add_argument("--refine", default=None, choices=("none", "em"),
                   help="em: exact distributed EM after one-pass training (vertical: per-sample flows, "
                        "--assign flat; horizontal/hybrid: pooled E-step statistics); default: em with "
                        "up to 100 iterations where the adaptive class glue joins vertical clients (see below), "
                        "else none")
    p.add_argument("--em-iters", type=int, default=None,
                   help="EM iterations for --refine em (>= 1; default 5, or 100 under the class glue's sampled EM, "
                        "10 with --em-leaves)")
    p.add_argument("--em-rows", type=int, default=None,
                   help="vertical --refine em on a seeded sample of this many aligned rows (float32 values sent "
                        "once, every PC kept, the sum weights moved on the server, stopping once the LL settles; "
                        "0: exact EM on every row; default: 0, or 2048 under the class glue's EM)")
    p.add_argument("--em-leaves", action="store_true",
                   help="sampled EM (--em-rows) also moves the PCs of the clients without the target: their "
                        "values every iteration, float16 flows back, the refined PCs at the end (more bytes; "
                        "exact EM, --em-rows 0, always moves them; default: off)")
    p.add_argument("--em-initial-model", default=None, help="also write the model before EM here")
    add_deadline_argument(p)
    add_liveness_argument(p)
    add_device_argument(p, "EiNet and RAT-SPN client PCs (fit, EM)")
    add_audit_arguments(p)
    p.add_argument("--dp-epsilon", type=float, default=None, metavar="E",
                   help="make what every client sends epsilon-differentially private (Laplace noise on the "
                        "counts and sufficient statistics of factorized PCs, one PC per subspace or class, no "
                        "EM; mpifc.federated.dp); default: off")
    p.add_argument("--dp-clip", type=float, default=None, metavar="B",
                   help="with --dp-epsilon: real values (model units) are clipped to [-B, B] (default 4)")
    p.add_argument("--dp-seed", type=int, default=None, metavar="S",
                   help="with --dp-epsilon: seed the noise (a reproducible run; no privacy against whoever knows "
                        "S); default: each client's own entropy")
    add_overwrite_argument(p)
    add_output_arguments(p, "the summary (rank 0)")
    p.add_argument("--exclusive-timing", action="store_true",
                   help="clients learn one after another, so each client's CPU seconds are measured without "
                        "its own job's other ranks competing for the cores (same model and messages); "
                        "implies --warm-up")
    p.add_argument("--warm-up", action="store_true",
                   help="for timings: import every module a rank's learner may use and fit each learner once "
                        "on a tiny synthetic table before the clocks start, so one-off start-up costs stay "
                        "out of the timed phases (same model and messages; costs seconds per rank)")


def add_ngm_train_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--model-family ngm`` flags of ``mpifc train``, in their own group."""
    g = p.add_argument_group("FedNGM (--model-family ngm)")
    g.add_argument("--min-clients", type=int, default=1, metavar="K",
                   help="release rule: refuse to release the global graph/model below K clients")
    g.add_argument("--lam", type=float, default=1.0, help="weight of the graph-constrained path norm (eq. 1)")
    g.add_argument("--epochs", type=int, default=50, help="epochs of every NGM (clients and global)")
    g.add_argument("--hidden", type=functools.partial(comma_ints, flag="--hidden"), default=(32, 32),
                   metavar="H1,H2", help="hidden layer widths")
    g.add_argument("--batch-size", type=int, default=256, help="rows per optimisation step of every NGM")
    g.add_argument("--lr", type=float, default=2e-2, help="learning rate of every NGM")
    g.add_argument("--calib-rows", type=int, default=1000, help="rows each NGM calibrates its sampler on")
    g.add_argument("--samples", type=int, default=10_000, help="samples the master draws from client NGMs in all")
    g.add_argument("--proportional", action="store_true",
                   help="draw samples in proportion to client sizes instead of equally")
    g.add_argument("--public", default=None, metavar="DIR",
                   help="public data for the extra term of eq. 3: a shard directory whose test.h5 the master reads")
    g.add_argument("--graph-alpha", type=float, default=0.05, help="graphical lasso penalty of the local graphs")
    g.add_argument("--stitch-hidden", type=int, default=0,
                   help="hidden units per layer a client adds to stitch its extra features (0 = no stitching)")
    g.add_argument("--features", default=None, metavar="A,B,...",
                   help="model only these shard columns (every client must hold them); default: all")
    g.add_argument("--save-local", default=None, metavar="DIR",
                   help="each client also writes its own local NGM to DIR/client-<i>.h5")
    g.add_argument("--folds", type=int, default=1, help="with --fold: clients hold out 1/FOLDS of their rows")
    g.add_argument("--fold", type=int, default=None, help="which fold clients hold out (for cross-validation)")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc train``: FedPC's, ``--model-family`` and the FedNGM group."""
    add_fedpc_train_arguments(p)
    p.add_argument("--model-family", default="fc", choices=FAMILIES,
                   help="fc: federated circuits (FedPC); ngm: FedNGM (flags in the FedNGM group)")
    add_ngm_train_arguments(p)


def train_config(args: argparse.Namespace) -> dict[str, Any]:
    """The FedPC training settings of parsed flags (checked; UserError names the flag).

    Flags not given stay out of ``hyperparameters`` (and ``clusters`` None), so the preset's
    defaults fill them on each client (:mod:`mpifc.federated.defaults`)."""
    hp = parse_kv(args.hp, "--hp")
    if args.threshold is not None:
        hp["threshold"] = args.threshold
    if args.min_instances_slice is not None:
        hp["min_instances_slice"] = args.min_instances_slice
    preset = getattr(args, "preset", None) or "adaptive"
    glue = args.glue
    if preset == "paper":
        from mpifc.experiments.paper import paper_preset

        table, table_glue = paper_preset(str(args.dir))
        hp = {**table, **hp}  # explicit flags win
        glue = glue or table_glue
    clusters = args.clusters if args.clusters is not None else (None if preset == "adaptive" else 2)
    if getattr(args, "cluster_without_target", False):
        hp[CLUSTER_WITHOUT_TARGET] = True  # a plan hyperparameter: sent with the plan, never to a learner
    dp = {"dp_epsilon": getattr(args, "dp_epsilon", None), "dp_clip": getattr(args, "dp_clip", None),
          "dp_seed": getattr(args, "dp_seed", None)}
    if dp["dp_epsilon"] is None and any(v is not None for v in dp.values()):
        raise UserError("--dp-clip and --dp-seed need --dp-epsilon")
    for flag, v in (("--dp-epsilon", dp["dp_epsilon"]), ("--dp-clip", dp["dp_clip"])):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UserError(f"{flag} must be a finite number > 0, got {v:g}")
    hp.update({k: v for k, v in dp.items() if v is not None})  # plan hyperparameters: sent with the plan
    learner = args.learner or ("factorized" if dp["dp_epsilon"] is not None else "learnspn")
    learners = {}
    for k, v in parse_kv(args.client_learner, "--client-learner").items():
        if v not in learner_names():
            raise UserError(f"--client-learner {k}={v}: unknown learner; known: {', '.join(learner_names())}")
        learners[int(k)] = v
    hp = check_hyperparameters(hp, [learner, *learners.values()])
    if args.assign == "tree" and args.servers < 1:
        raise UserError("--assign tree needs --servers S with S >= 1")
    if args.em_iters is not None and args.em_iters < 1:
        raise UserError(f"--em-iters must be >= 1, got {args.em_iters}")
    if args.em_rows is not None and args.em_rows < 0:
        raise UserError(f"--em-rows must be >= 0, got {args.em_rows}")
    refine = args.refine if args.refine is not None or preset == "adaptive" else "none"
    return {"dir": str(args.dir), "learner": learner, "client_learners": learners, "glue": glue if glue or preset == "adaptive" else "random",
            "clusters": clusters, "products": args.products, "seed": args.seed, "hyperparameters": hp,
            "preset": preset, "defaults": "adaptive" if preset == "adaptive" else "learner",
            "model": str(args.model), "assign": args.assign, "servers": args.servers, "audit": args.audit,
            "audit_findings": args.audit_findings,
            "refine": refine, "em_iters": args.em_iters, "em_rows": args.em_rows, "em_leaves": bool(args.em_leaves),
            "em_initial_model": args.em_initial_model,
            "exclusive_timing": bool(args.exclusive_timing), "overwrite": bool(getattr(args, "overwrite", False)),
            "warm_up": bool(args.warm_up or args.exclusive_timing)}


def ngm_train_config(args: argparse.Namespace) -> dict[str, Any]:
    """The FedNGM training settings of parsed flags."""
    return {"dir": str(args.dir), "model": str(args.model), "seed": int(args.seed), "min_clients": args.min_clients,
            "lam": args.lam, "epochs": args.epochs, "hidden": list(args.hidden), "batch_size": args.batch_size,
            "lr": args.lr, "calib_rows": args.calib_rows, "samples": args.samples,
            "proportional": bool(args.proportional), "public": args.public, "graph_alpha": args.graph_alpha,
            "stitch_hidden": args.stitch_hidden, "save_local": args.save_local, "folds": args.folds,
            "fold": args.fold, "overwrite": bool(getattr(args, "overwrite", False)),
            "features": [n.strip() for n in args.features.split(",") if n.strip()] if args.features else None}


def train_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc train``; returns the exit code."""
    if getattr(args, "model_family", "fc") == "ngm":
        from mpifc.ngm.shard_jobs import train

        return train(ngm_train_config(args), deadline=args.deadline, ledger=args.ledger, as_json=args.json)
    from mpifc.cli.summary import emit, train_text
    from mpifc.fedpc.job import train

    cfg = train_config(args)
    cfg["progress"] = output_mode(args) == "human"
    return train(cfg, deadline=args.deadline, ledger=args.ledger, liveness=args.liveness, device=args.device,
                 on_summary=lambda s: emit(s, output_mode(args), train_text))


def output_mode(args: argparse.Namespace) -> str:
    """``"json"``, ``"quiet"`` or ``"human"`` (the default) from ``--json`` / ``--quiet``."""
    return "json" if getattr(args, "json", False) else "quiet" if getattr(args, "quiet", False) else "human"
