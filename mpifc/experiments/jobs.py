"""The steps experiments are made of: shards, FedPC/FC[DT] training, evaluation, baselines.

MPI work goes through :class:`~mpifc.experiments.launcher.Launcher` (``mpifc train``,
``mpifc baseline fedavg``, ``mpifc baseline splitnn``); single-process work (centralized
LearnSPN, gathered evaluation, gradient boosting) runs in this process, so its timings are not
inflated by launching ranks.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpifc.experiments.launcher import Launcher

MPIFC = "mpifc"  # jobs run as ``python -m mpifc SUBCOMMAND ...``


@dataclass(frozen=True)
class ShardSpec:
    """What :func:`data_prep.prepare` is asked for; equal specs share one shard directory."""

    dataset: str
    setting: str
    clients: int
    seed: int
    split: str = "iid"
    max_rows: int | None = None
    label_owner: str | int | None = None

    def dirname(self) -> str:
        from data_prep.prepare import PREPROCESSING

        owner = "" if self.label_owner is None else f"-lo{self.label_owner}"
        rows = "all" if self.max_rows is None else str(self.max_rows)
        # the preprocessing defaults' name: shards of other defaults are never reused
        return (f"{self.dataset.replace(':', '_')}-{self.setting}{self.clients}-{self.split}{owner}"
                f"-rows{rows}-seed{self.seed}-{PREPROCESSING}")


class ShardCache:
    """Shard directories under one root, prepared on first use and reused afterwards.

    ``data_prep.write_shards`` renames a complete directory into place, so a directory with a
    manifest is whole; tests point several experiments at one root to prepare data once.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def runs(self) -> Path:
        """Where :func:`cached_job` keeps the runs on these shards."""
        return self.root / "runs"

    def get(self, spec: ShardSpec) -> Path:
        from data_prep import prepare, write_shards

        d = self.root / spec.dirname()
        if not (d / "manifest.json").exists():
            kw: dict[str, Any] = {}
            if spec.label_owner is not None:
                kw["label_owner"] = spec.label_owner
            write_shards(prepare(dataset=spec.dataset, setting=spec.setting, clients=spec.clients,
                                 seed=spec.seed, split=spec.split, max_rows=spec.max_rows, **kw), d)
        return d


def n_clients(shards: Path) -> int:
    from data_prep.shards import load_manifest

    return load_manifest(shards).n_clients


MIS_CAP_FRACTION = 0.1


def capped_hp(hp: dict[str, Any], shards: Path, fraction: float = MIS_CAP_FRACTION) -> dict[str, Any]:
    """Table 4's LearnSPN settings as the experiments run them: SPFlow's RDC convention
    (:data:`mpifc.experiments.paper.SPFLOW_RDC`, unless ``hp`` sets its own) and
    ``min_instances_slice`` capped at ``fraction`` of the smallest client's training rows (at
    least 10).

    Table 4's 300 rows exceed a breast-cancer client's rows; LearnSPN then never splits rows and
    returns a fully factorized leaf, in which the label is independent of the features (it then
    predicts the majority class). The paper's value is kept as ``min_instances_slice_paper``.
    Every experiment building its LearnSPN settings here gets the same arguments for the same
    cell, so identical runs are shared through :func:`cached_job`.
    """
    if "min_instances_slice" not in hp:
        return dict(hp)
    from data_prep.shards import load_manifest
    from mpifc.experiments.paper import SPFLOW_RDC

    n = min(int(c["n_train"]) for c in load_manifest(shards).clients)
    cap = max(10, int(fraction * n))
    out = {**hp, **{k: v for k, v in SPFLOW_RDC.items() if k not in hp}}
    out["min_instances_slice"] = min(int(hp["min_instances_slice"]), cap)
    out["min_instances_slice_paper"] = int(hp["min_instances_slice"])
    return out


def cached_job(launcher: Launcher, runs: Path, module: str, ranks: int, args: list[str],
               outputs: dict[str, str], timeout: float | None = None) -> dict[str, Any]:
    """Run ``python -m module args`` once per distinct (module, ranks, args); reuse it afterwards.

    The job's output files (``outputs``: flag -> file name) go to ``runs/<key>/``, where ``key``
    hashes the command without them; its JSON result is saved there last. Experiments sharing a
    shard cache thus share identical runs (commcost reuses table7's where their settings agree), and an interrupted
    experiment resumes job by job. Shard directories are named by everything that made them,
    so the same arguments mean the same data.

    Returns:
        The job's JSON result plus ``ranks``, ``job_seconds``, ``run_dir``, ``cached`` and, per
        output flag, ``<name>_path`` (e.g. ``model_path`` for ``--model``).
    """
    from mpifc.atomic import atomic_write_text

    key = hashlib.sha256(json.dumps([module, ranks, args]).encode()).hexdigest()[:20]
    run_dir = runs / key
    done = run_dir / "result.json"
    if done.exists():
        return {**json.loads(done.read_text()), "cached": True}
    run_dir.mkdir(parents=True, exist_ok=True)
    full = list(args)
    paths = {}
    for flag, name in outputs.items():
        full += [flag, str(run_dir / name)]
        paths[flag.lstrip("-").replace("-", "_") + "_path"] = str(run_dir / name)
    # Every rank of an mpifc job reports its peak RSS there (mpifc.runtime.job.MODULE_REPORT_ENV).
    reports = run_dir / "rank-reports"
    job = launcher.run(ranks, ["-m", module, *full], timeout, env={"MPIFC_MODULE_REPORT": str(reports)})
    res = {**job.last_json(), **paths, "ranks": ranks, "job_seconds": job.seconds, "run_dir": str(run_dir),
           "command": " ".join(job.cmd), **peak_rss(reports)}
    res.pop("ledger", None)  # the baselines' per-kind breakdown: the ledger file has it all
    atomic_write_text(done, json.dumps(res, indent=1))
    return {**res, "cached": False}


def peak_rss(folder: Path) -> dict[str, float]:
    """The largest peak RSS (MB) of a job's ranks from their module reports in ``folder``:
    ``peak_rss_mb_max`` over all ranks, ``peak_rss_mb_server`` and ``peak_rss_mb_client`` per
    role; empty when the job wrote none (not an mpifc job)."""
    best: dict[str, float] = {}
    for p in sorted(folder.glob("rank-*.json")) if folder.is_dir() else []:
        try:
            rep = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        mb = float(rep.get("peak_rss_mb", 0.0))
        for key in ("peak_rss_mb_max", f"peak_rss_mb_{rep.get('role', 'client')}"):
            best[key] = max(best.get(key, 0.0), mb)
    return best


def fc_train_args(shards: Path, *, learner: str = "learnspn", glue: str = "random", clusters: int = 2,
                  products: int = 4, seed: int = 0, hp: dict[str, Any] | None = None, assign: str = "flat",
                  servers: int = 0, extra: Sequence[str] = (), preset: str = "learner") -> tuple[list[str], int]:
    """``mpifc train`` arguments (output files left out) and the number of ranks they need.

    ``hp`` holds LearnSPN's ``threshold`` / ``min_instances_slice`` and any other learner
    hyperparameter (passed as ``--hp KEY=VALUE``); keys ending in ``_paper`` are provenance only.
    ``preset="adaptive"``: the command a user runs, no setting but the learner and the seed
    (``glue``, ``clusters``, ``products`` and ``hp`` are not passed: the adaptive rule fills them).
    """
    if preset == "adaptive":
        args = ["train", str(shards), "--learner", learner, "--seed", str(seed), "--json", "--assign", assign,
                *extra]
        if assign == "tree":
            args += ["--servers", str(servers)]
        return args, 1 + (servers if assign == "tree" else 0) + n_clients(shards)
    # Experiments state every setting they use: the learners' own defaults fill the rest, never
    # the adaptive rule (mpifc.federated.defaults), so a reproduction does not move with it.
    args = ["train", str(shards), "--learner", learner, "--glue", glue, "--clusters", str(clusters),
            "--products", str(products), "--seed", str(seed), "--json", "--assign", assign,
            "--preset", "learner", *extra]
    if assign == "tree":
        args += ["--servers", str(servers)]
    for k, v in (hp or {}).items():
        if k.endswith("_paper"):
            continue
        if k == "threshold":
            args += ["--threshold", str(v)]
        elif k == "min_instances_slice":
            args += ["--min-instances-slice", str(v)]
        else:
            args += ["--hp", f"{k}={v}"]
    return args, 1 + (servers if assign == "tree" else 0) + n_clients(shards)


def train_fc(launcher: Launcher, shards: Path, model: Path, *, ledger: Path | None = None,
             timeout: float | None = None, **kw: Any) -> dict[str, Any]:
    """One-pass training as an MPI job writing ``model`` (and ``ledger``); returns its summary.

    ``kw`` are :func:`fc_train_args`' options. Not cached: see :func:`train_fc_cached`.
    """
    args, ranks = fc_train_args(shards, **kw)
    args += ["--model", str(model)] + (["--ledger", str(ledger)] if ledger is not None else [])
    Path(model).parent.mkdir(parents=True, exist_ok=True)
    job = launcher.run(ranks, ["-m", MPIFC, *args], timeout)
    return {**job.last_json(), "ranks": ranks, "job_seconds": job.seconds}


def train_fc_cached(launcher: Launcher, shards: Path, runs: Path, *, em_initial: bool = False,
                    timeout: float | None = None, **kw: Any) -> dict[str, Any]:
    """:func:`train_fc` through :func:`cached_job`: model and ledger live in the run's folder.

    Returns:
        The training summary plus ``model_path`` and ``ledger_path`` (and
        ``em_initial_model_path`` with ``em_initial``).
    """
    args, ranks = fc_train_args(shards, **kw)
    outputs = {"--model": "model.h5", "--ledger": "ledger.csv"}
    if em_initial:
        outputs["--em-initial-model"] = "one-pass.h5"
    return cached_job(launcher, runs, MPIFC, ranks, args, outputs, timeout)


def train_fc_uncached(launcher: Launcher, shards: Path, runs: Path, *, timeout: float | None = None,
                      **kw: Any) -> dict[str, Any]:
    """:func:`train_fc_cached` once more, outside the cache (a timing round): the job runs in a
    throw-away cache under ``runs`` (its model and ledger are removed afterwards).

    Returns:
        The training summary plus ``ranks`` and ``job_seconds``.
    """
    import tempfile

    runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=runs, prefix="timing-") as tmp:
        res = train_fc_cached(launcher, shards, Path(tmp), timeout=timeout, **kw)
    # the model and ledger are gone with the folder: no paths to them
    return {k: v for k, v in res.items() if k not in ("model_path", "ledger_path", "run_dir", "cached")}


def evaluate_fc(shards: Path, model: Path, npz: Path | None = None) -> dict[str, Any]:
    """Gathered single-process evaluation: test LL (nats/sample), accuracy and macro F1 (``f1``,
    as the baselines and the paper's Table 7 report it; ``f1_binary``: the second class's F1 on
    a two-class target)."""
    from mpifc.fedpc.evaluate import evaluate_gathered

    cfg = {"dir": str(shards), "model": str(model), "batch": 10_000}
    if npz is not None:
        cfg["output_npz"] = str(npz)
    out = evaluate_gathered(cfg)
    if out.get("accuracy") is not None:
        per_class = list((out.get("f1_per_class") or {}).values())  # None: class absent, never predicted
        out["f1"] = out["f1_macro"]
        out["f1_binary"] = per_class[1] if len(per_class) == 2 else None
    return out


def central_learnspn(central_shards: Path, threshold: float, min_instances_slice: int, seed: int,
                     **learner_hp: Any) -> dict[str, Any]:
    """Centralized LearnSPN on the one-client shards, timed in this process as FedPC's clients are.

    Like a client rank, this process first warms up (:func:`mpifc.fedpc.train.warm_up`:
    imports and one tiny fit, no data) and then counts CPU seconds (``time.process_time``), the
    unit of FedPC's ``train_seconds_critical_path``; wall seconds on a shared machine would
    count other processes' load on this side only. ``learner_hp``: further :func:`learn_spn`
    options (e.g. the RDC convention), the same as the federated clients get.

    Returns:
        ``seconds`` (CPU seconds of structure learning + parameters), ``wall_seconds``,
        ``test_ll`` (mean nats per test row over every column, the target included, as
        FedPC's), ``rows``.
    """
    from data_prep.shards import load_manifest, read_client, read_test
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.fedpc.train import warm_up

    m = load_manifest(central_shards)
    shard = read_client(central_shards, 0)
    order = m.feature_order
    x = shard.x_train[:, [shard.features.index(f) for f in order]]
    warm_up({"learnspn"}, cluster=False, fit=True)  # as every client rank does before its clock

    c0, w0 = time.process_time(), time.perf_counter()
    spn = learn_spn(x, m.meta_types(order), threshold=threshold, min_instances_slice=min_instances_slice, seed=seed,
                    **learner_hp)
    seconds, wall = time.process_time() - c0, time.perf_counter() - w0
    test = read_test(central_shards)
    ll = np.asarray(spn.log_likelihood(test.x[:, [test.features.index(f) for f in order]]), dtype=np.float64)
    return {"seconds": seconds, "wall_seconds": wall, "test_ll": float(ll.mean()), "rows": int(x.shape[0]),
            "test_rows": int(test.x.shape[0])}


def run_fedavg(launcher: Launcher, shards: Path, runs: Path, seed: int, rounds: int, local_epochs: int = 1,
               hidden: str = "64,32", lr: float = 0.1, batch_size: int = 32, timeout: float | None = None
               ) -> dict[str, Any]:
    """FedAvg-MLP as an MPI job (1 + clients ranks), through :func:`cached_job`."""
    args = ["baseline", "fedavg", str(shards), "--seed", str(seed), "--rounds", str(rounds), "--local-epochs",
            str(local_epochs), "--hidden", hidden, "--lr", str(lr), "--batch-size", str(batch_size), "--json"]
    return cached_job(launcher, runs, MPIFC, 1 + n_clients(shards), args,
                      {"--ledger": "ledger.csv"}, timeout)


def run_splitnn(launcher: Launcher, shards: Path, runs: Path, seed: int, epochs: int, cut: int = 8,
                lr: float = 0.1, batch_size: int = 32, timeout: float | None = None) -> dict[str, Any]:
    """SplitNN-MLP as an MPI job (1 + clients ranks), through :func:`cached_job`."""
    args = ["baseline", "splitnn", str(shards), "--seed", str(seed), "--epochs", str(epochs), "--cut", str(cut),
            "--lr", str(lr), "--batch-size", str(batch_size), "--json"]
    return cached_job(launcher, runs, MPIFC, 1 + n_clients(shards), args,
                      {"--ledger": "ledger.csv"}, timeout)


def central_hgb(shards: Path, seed: int) -> dict[str, Any]:
    """Centralized HistGradientBoosting on the joined shards (the ceiling), in this process."""
    from mpifc.baselines.central import run_central

    return run_central(str(shards), "hgb", seed)


def finite(*values: Any) -> bool:
    """All values are real finite numbers."""
    return all(isinstance(v, (int, float)) and math.isfinite(float(v)) for v in values)
