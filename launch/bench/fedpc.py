"""FedPC benchmark: one-pass training time vs centralized LearnSPN, query throughput, glue modes.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/fedpc.py --datasets breast-cancer adult credit \\
        --split iid --out /tmp/fedpc-bench

Per dataset (horizontal, ``--clients`` clients, ``--split`` iid (the paper's appendix E for the
binary tasks) or label (each client holds one class, as the paper's text on its first question (Table 1) and ``mpifc.experiments.table1``)):

* **Training time.** One ``mpiexec`` training job (``mpifc.fedpc.job train``) and LearnSPN on
  the union of the same client rows in this process, with the SAME hyperparameters, passed
  unchanged to every client and to the centralized run (seeds differ only as Algorithm 1 derives
  them). The defaults replicate the paper's setup (section 4 and appendix E) as closely as this
  code base allows:

  - full datasets (``--max-rows 0``): the paper trained on the full data. Sub-second runs on a few
    thousand rows are dominated by per-run fixed costs (server plan/assemble, serialisation), and
    LearnSPN's cost grows like ``n log(n / min_instances_slice)`` (every tree level touches all
    rows, the depth grows with ``n``), so the 5-client speed-up only shows at full size.
  - Table 4 thresholds and min_instances_slice (``HP``); breast cancer 300 -> 30 because a client
    holds 91 rows: with 300 every client model is fully factorised (measured: test LL gap 5.5
    nats, the comparison then measures "factorised vs. one split", not FedPC).
  - MSPN leaves (``--leaf piecewise``): "the leaves of the FedPC were parameterized with MSPNs",
    i.e. SPFlow's ``learn_mspn`` with piecewise-linear leaves. With Gaussian leaves (``auto``), the
    target-encoded, standardised columns of adult/credit (few distinct values, stored as real)
    give slices with constant columns a variance of ``min_var`` and +3.7 nats per such column, so
    the test LL counts constant slices (deeper central trees) rather than measuring fit.
  - SPFlow's RDC (``--rdc-ties ordinal --rdc-k 20``): the paper's numbers come from SPFlow, whose
    copula ranks ties in row order and finds many more dependencies on discrete-valued columns
    (see :func:`mpifc.circuit.rdc.ecdf`); ``--rdc-ties max --rdc-k 10`` is our faithful RDC.

  What each figure includes:

  - ``central_s``: CPU seconds (``time.process_time``) of ``learn_spn`` on the stacked rows:
    structure learning and parameters, nothing else (no data reading, no imports: the process
    has imported everything and fitted a tiny synthetic table first, exactly as a client does
    in :func:`mpifc.fedpc.train.warm_up`).
  - ``fedpc_critical_path_s``: the slowest client's CPU seconds of ``learn`` (its PC fitting)
    plus ``serialize`` (its models to wire bytes), plus the server's CPU seconds of ``plan``,
    ``assemble`` and ``deserialize`` (blob decoding). Reading the shard is excluded (as the
    centralized run's reading is), and so are imports/warm-up, message waits and the model
    file write. ``fedpc_job_critical_path_s`` is the job's own figure (which includes ``read``).
  - CPU seconds, not wall seconds: on a shared machine the ranks of one job compete for cores
    (and with other jobs), and wall seconds then measure the scheduler. Wall-clock figures are
    reported beside them (``*_wall``) for reference.
  - ``--timing`` (default ``both``): the MPI job runs ``clients + 1`` ranks; on a 2-core machine
    the clients learning at the same time inflate each other's CPU seconds (shared cores, caches,
    memory bandwidth) while the centralized run is alone. ``contended`` times the ordinary job;
    ``exclusive`` runs the same job with the clients learning one after another
    (``fc_job train --exclusive-timing``, :mod:`mpifc.fedpc.train`), so every client is
    timed as uncontended by its federation as the centralized run is (other jobs on the machine
    affect both alike); ``both`` runs the two (the model must come out identical) and reports
    ``relative_runtime_by_mode``. ``relative_runtime`` / ``timing_mode`` are the contended
    figures when they were measured. The critical path is the slowest client + server in both.
  - ``--repeat R`` (default 1): R alternating rounds of the training job(s) and the centralized
    run; each side's figure is its minimum CPU seconds over the rounds (noise on a shared machine
    only ever adds time), every round is listed (``critical_path_runs_by_mode``, ``central_s_runs``,
    per client ``critical_path_clients_runs_by_mode``). For reference only,
    ``relative_runtime_client_best_by_mode`` takes each client's best round before the slowest
    client (see :func:`client_best_cp`); the headline stays the slowest client of one round.

* **Log-likelihood.** Mean test log-likelihood (nats per row, all columns) of the gathered FedPC
  and of the centralized SPN on the same test rows; ``ll_gap`` = central - FedPC.
* **Query throughput.** The test rows repeated to ``--query-rows`` queries, evaluated in batches
  of ``--batch`` rows by the distributed upward pass (one ``mpiexec`` job, evidence sent by the
  querier) and by the gathered model in this process. ``throughput_ratio`` =
  gathered seconds per batch / distributed seconds per batch, each the best (minimum) batch,
  which discards batches hit by the scheduler; ``throughput_ratio_total`` uses the totals.
* **Glue modes.** Vertical (2 clients, K=4, P=8) gathered test log-likelihood of the random,
  combinatorial and cooccurrence glue.

Prints one line per measurement and a final JSON document (also written to OUT/results.json).
Wall time is dominated by the evaluations (piecewise leaves over 16k-30k test rows), not by
training: on a machine at load ~20, breast cancer took ~8 min and adult ~20 min; credit alone
with ``--query-rows 10000`` ~4 min. ``--skip-glue`` and a small ``--query-rows`` save time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from data_prep.prepare import prepare  # noqa: E402
from data_prep.shards import load_manifest, read_client, read_test, write_shards  # noqa: E402

# Table 4 of the paper (horizontal): (threshold, min_instances_slice); breast-cancer 300 -> 30
# (a client holds 91 rows; see the docstring).
HP = {"breast-cancer": (0.4, 30), "adult": (0.3, 200), "credit": (0.5, 200)}
PAPER_RELATIVE = {"breast-cancer": 0.21, "adult": 0.17, "credit": 0.42}
# Table 7, FC[PC] horizontal 5 clients: (accuracy, F1).
PAPER_T7 = {"breast-cancer": (0.98, 0.98), "adult": (0.87, 0.80), "credit": (0.93, 0.68)}


def mpiexec(n: int, args: list[str], timeout: float) -> dict:
    exe = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    r = subprocess.run([str(exe), "-n", str(n), sys.executable, "-m", "mpifc", *args],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"job failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def prepared(out: Path, dataset: str, setting: str, clients: int, max_rows: int | None, split: str) -> Path:
    d = out / f"{dataset}-{setting}-{clients}-{split}-{max_rows}"
    if not (d / "manifest.json").exists():
        write_shards(prepare(dataset=dataset, setting=setting, clients=clients, seed=0, max_rows=max_rows,
                             split=split), d)
    return d


def learner_hp(a: argparse.Namespace) -> dict:
    """LearnSPN hyperparameters besides threshold / min_instances_slice, the same on both sides."""
    return {"leaf": a.leaf, "rdc_ties": a.rdc_ties, "rdc_k": a.rdc_k}


def hp_flags(hp: dict) -> list[str]:
    """``fc_job train`` flags passing ``hp`` to every client's learner."""
    return [f for k, v in hp.items() for f in ("--hp", f"{k}={v}")]


def centralized(shards: Path, thr: float, mis: int, hp: dict, test_ll: bool = True) -> dict:
    """LearnSPN on the union of the client rows (horizontal: stacked), same hyperparameters
    (``test_ll``: also its mean test log-likelihood, else NaN)."""
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.fedpc.train import warm_up

    warm_up({"learnspn"}, cluster=False, fit=True)  # as every client rank does before its clock
    m = load_manifest(shards)
    order = m.feature_order
    parts = []
    for i in range(m.n_clients):
        s = read_client(shards, i)
        parts.append(s.x_train[:, [s.features.index(f) for f in order]])
    x = np.concatenate(parts)
    c0, w0 = time.process_time(), time.perf_counter()
    spn = learn_spn(x, m.meta_types(order), threshold=thr, min_instances_slice=mis, seed=0, **hp)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    ll = np.full(1, np.nan)
    if test_ll:
        test = read_test(shards)
        ll = np.asarray(spn.log_likelihood(test.x[:, [test.features.index(f) for f in order]]), dtype=np.float64)
    return {"seconds": cpu, "seconds_wall": wall, "test_ll": float(ll.mean()), "rows": len(x),
            "n_parameters": int(spn.num_parameters())}


def bench_dataset(a: argparse.Namespace, out: Path, ds: str) -> dict:
    from mpifc.fedpc.evaluate import evaluate_gathered

    thr, mis = HP[ds]
    rows = None if ds == "breast-cancer" or a.max_rows == 0 else a.max_rows
    hp = learner_hp(a)
    sh = prepared(out, ds, "horizontal", a.clients, rows, a.split)
    model = out / f"{ds}-h-{a.split}.h5"
    train_args = [str(sh), "--learner", "learnspn", "--threshold", str(thr), "--min-instances-slice", str(mis),
                  *hp_flags(hp), "--json", "--preset", "learner", "--warm-up"]
    runs: dict[str, list[dict]] = {"contended": [], "exclusive": []}
    cens = []
    for rep in range(a.repeat):
        if a.timing in ("contended", "both"):
            runs["contended"].append(mpiexec(a.clients + 1, ["train", *train_args, "--model", str(model)], a.timeout))
        if a.timing in ("exclusive", "both"):
            # Clients learn one after another (mpifc.fedpc.train, exclusive timing); the model
            # is the same (checked below); evaluations use the contended job's model when there is one.
            xmodel = out / f"{ds}-h-{a.split}-exclusive.h5" if a.timing == "both" else model
            runs["exclusive"].append(mpiexec(a.clients + 1, ["train", *train_args, "--model", str(xmodel),
                                                             "--exclusive-timing"], a.timeout))
        cens.append(centralized(sh, thr, mis, hp, test_ll=rep == 0))
    jobs = [j for js in runs.values() for j in js]
    if len({(j["n_parameters"], j["bytes_train"]) for j in jobs}) != 1:
        raise SystemExit(f"{ds}: the training jobs learned different models: "
                         f"{[(j.get('timing_mode'), j['n_parameters'], j['bytes_train']) for j in jobs]}")
    cen = dict(cens[0], seconds=min(c["seconds"] for c in cens), seconds_wall=min(c["seconds_wall"] for c in cens))
    # --repeat R: each side's best (minimum) of R runs, as for the throughput batches below.
    timing = {mode: min((critical_path(j) for j in js), key=lambda t: t["cp"]) for mode, js in runs.items() if js}
    main_mode = "contended" if runs["contended"] else "exclusive"
    tr = min(runs[main_mode], key=lambda j: critical_path(j)["cp"])  # the run behind the figures
    cp, client_cp, server, cp_wall = (timing[main_mode][k] for k in ("cp", "client", "server", "cp_wall"))
    npz = out / f"{ds}-h-{a.split}-joint.npz"
    gat = evaluate_gathered({"dir": str(sh), "model": str(model), "batch": a.batch, "output_npz": str(npz)})
    # Throughput: the same queries, distributed (MPI job) and gathered (this process).
    dist_q = mpiexec(a.clients + 1, ["evaluate", str(sh), "--model", str(model), "--distributed",
                                     "--batch", str(a.batch), "--query-rows", str(a.query_rows), "--json"],
                     a.timeout)
    gat_q = evaluate_gathered({"dir": str(sh), "model": str(model), "batch": a.batch, "query_rows": a.query_rows})
    n_batches = len(dist_q["batch_seconds"])
    thr_best = min(gat_q["batch_seconds"]) / min(dist_q["batch_seconds"])
    thr_total = gat_q["query_seconds"] / dist_q["query_seconds"]
    r = {"split": a.split, "rows": cen["rows"], "hp": {"threshold": thr, "min_instances_slice": mis, **hp},
         "timing_mode": main_mode,
         "relative_runtime_by_mode": {m: v["cp"] / cen["seconds"] for m, v in timing.items()},
         "critical_path_by_mode": timing, "repeat": a.repeat,
         "critical_path_runs_by_mode": {m: [critical_path(j)["cp"] for j in js] for m, js in runs.items() if js},
         "critical_path_clients_runs_by_mode": {m: [critical_path(j)["clients"] for j in js]
                                                for m, js in runs.items() if js},
         "relative_runtime_client_best_by_mode": {m: client_best_cp(js) / cen["seconds"]
                                                  for m, js in runs.items() if js},
         "central_s_runs": [c["seconds"] for c in cens],
         "fedpc_critical_path_s": cp, "fedpc_client_max_s": client_cp, "fedpc_server_s": server,
         "fedpc_job_critical_path_s": tr["train_seconds_critical_path"],
         "fedpc_total_cpu_s": tr["train_seconds_total"], "client_seconds": tr["client_seconds"],
         "server_seconds": tr["server_seconds"], "central_s": cen["seconds"],
         "relative_runtime": cp / cen["seconds"], "paper_relative_runtime": PAPER_RELATIVE[ds],
         "fedpc_critical_path_wall_s": cp_wall, "central_wall_s": cen["seconds_wall"],
         "fedpc_test_ll": gat["test_ll"], "central_test_ll": cen["test_ll"],
         "ll_gap": cen["test_ll"] - gat["test_ll"], "accuracy": gat["accuracy"],
         "f1_macro": gat["f1_macro"], "f1_per_class": gat["f1_per_class"], "paper_fc_pc_acc_f1": PAPER_T7[ds],
         "fedpc_n_parameters": tr["n_parameters"], "central_n_parameters": cen["n_parameters"],
         "bytes_train": tr["bytes_train"], "query_rows": a.query_rows, "batch": a.batch,
         "bytes_query": dist_q["bytes_query"], "messages_query": dist_q["messages"],
         "distributed_batch_s": dist_q["batch_seconds"], "gathered_batch_s": gat_q["batch_seconds"],
         "throughput_ratio": thr_best, "throughput_ratio_total": thr_total}
    rel = " ".join(f"relative[{m}]={v['cp'] / cen['seconds']:.3f} (client {v['client']:.3f} + server "
                   f"{v['server']:.3f}; per-client best {r['relative_runtime_client_best_by_mode'][m]:.3f})"
                   for m, v in timing.items())
    print(f"{ds} horizontal {a.clients} clients ({a.split} split): rows={cen['rows']} "
          f"central={cen['seconds']:.3f}s {rel} (paper {PAPER_RELATIVE[ds]}) "
          f"ll fedpc={gat['test_ll']:.3f} central={cen['test_ll']:.3f} acc={gat['accuracy']:.3f} "
          f"f1_macro={r['f1_macro']:.3f} "
          f"throughput dist/gathered={thr_best:.3f} (totals {thr_total:.3f}, {n_batches} batches of {a.batch})",
          flush=True)
    if a.skip_glue:
        return r
    sv = prepared(out, ds, "vertical", 2, rows, "iid")
    glue = {}
    for g in ("random", "combinatorial", "cooccurrence"):
        mv = out / f"{ds}-v-{g}.h5"
        mpiexec(3, ["train", str(sv), "--learner", "learnspn", "--threshold", str(thr),
                    "--min-instances-slice", str(mis), *hp_flags(hp), "--glue", g, "--clusters", "4",
                    "--products", "8", "--model", str(mv), "--json", "--preset", "learner"], a.timeout)
        ev = evaluate_gathered({"dir": str(sv), "model": str(mv), "batch": a.batch})
        glue[g] = {"test_ll": ev["test_ll"], "accuracy": ev["accuracy"]}
    r["vertical_glue"] = glue
    print(f"{ds} vertical 2 clients K=4 P=8: " + " ".join(f"{g}: ll={v['test_ll']:.3f} acc={v['accuracy']:.3f}"
                                                          for g, v in glue.items()), flush=True)
    return r


def client_best_cp(jobs: list[dict]) -> float:
    """Secondary critical path over R rounds (reported beside the headline, never instead of it):
    every client's best round (it repeats identical work, so its minimum estimates its noise-free
    CPU time), the slowest of those, plus the server's best round. The headline instead takes the
    slowest client within one round, a maximum of ``clients`` noisy figures that shared-machine
    noise biases upward; with R = 1 both are the same."""
    paths = [critical_path(j) for j in jobs]
    best = {c: min(p["clients"][c] for p in paths) for c in paths[0]["clients"]}
    return max(best.values()) + min(p["server"] for p in paths)


def critical_path(job: dict) -> dict:
    """The bench's critical path of one training job (slowest client's learn + serialize, plus the
    server), its parts, the per-client figures and the wall-clock analogue."""
    client = max(v["learn"] + v["serialize"] for v in job["client_seconds"].values())
    server = sum(job["server_seconds"].values())
    walls = job.get("client_seconds_wall", {})
    cp_wall = (max(v["learn"] + v["serialize"] for v in walls.values()) + sum(job["server_seconds_wall"].values())
               if walls else None)
    return {"cp": client + server, "client": client, "server": server, "cp_wall": cp_wall,
            "clients": {c: v["learn"] + v["serialize"] for c, v in job["client_seconds"].items()},
            "job_timing_mode": job.get("timing_mode", "contended")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--datasets", nargs="+", default=["breast-cancer", "adult", "credit"])
    p.add_argument("--max-rows", type=int, default=0, help="rows drawn from adult/credit (0: all, as the paper; "
                   "cancer: always all)")
    p.add_argument("--leaf", default="piecewise", choices=("piecewise", "auto", "histogram", "gaussian"),
                   help="LearnSPN leaves (piecewise: MSPN, as the paper)")
    p.add_argument("--rdc-ties", default="ordinal", choices=("ordinal", "max"),
                   help="RDC copula ties (ordinal: SPFlow's, as the paper; max: the faithful RDC)")
    p.add_argument("--rdc-k", type=int, default=20, help="RDC random features (SPFlow: 20)")
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--split", default="iid", choices=("iid", "label"), help="horizontal sample split")
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--query-rows", type=int, default=30_000, help="queries of the throughput runs")
    p.add_argument("--timing", default="both", choices=("contended", "exclusive", "both"),
                   help="FedPC training-time mode: contended (all clients learn at once, as deployed on "
                        "this oversubscribed machine), exclusive (clients learn one after another, each "
                        "uncontended by its federation like the centralized run) or both (two training "
                        "jobs, same model; relative_runtime is the contended one)")
    p.add_argument("--repeat", type=int, default=1,
                   help="training-time runs per side (FedPC job(s) and centralized run, alternating); the "
                        "relative runtime uses each side's minimum CPU seconds (discards scheduler hits on "
                        "a shared machine); every run is listed in the JSON")
    p.add_argument("--skip-glue", action="store_true", help="no vertical glue-mode runs")
    p.add_argument("--out", default="/tmp/fedpc-bench")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {ds: bench_dataset(a, out, ds) for ds in a.datasets}
    from mpifc.atomic import atomic_write_text

    atomic_write_text(out / "results.json", json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
