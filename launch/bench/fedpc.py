"""FedPC benchmark: one-pass training time vs centralized LearnSPN, query throughput, glue modes.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/fedpc.py --datasets breast-cancer adult credit \\
        --split iid --out /tmp/fedpc-bench

Per dataset (horizontal, ``--clients`` clients, ``--split`` iid (the paper's appendix E for the
binary tasks) or label (each client holds one class, as Q1's text and ``mpifc.experiments.table1``)):

* **Training time.** One ``mpiexec`` training job (``mpifc.runtime.fc_job train``) and LearnSPN on
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
    in :func:`mpifc.runtime.fc_train.warm_up`).
  - ``fedpc_critical_path_s``: the slowest client's CPU seconds of ``learn`` (its PC fitting)
    plus ``serialize`` (its models to wire bytes), plus the server's CPU seconds of ``plan``,
    ``assemble`` and ``deserialize`` (blob decoding). Reading the shard is excluded (as the
    centralized run's reading is), and so are imports/warm-up, message waits and the model
    file write. ``fedpc_job_critical_path_s`` is the job's own figure (which includes ``read``).
  - CPU seconds, not wall seconds: on a shared machine the ranks of one job compete for cores
    (and with other jobs), and wall seconds then measure the scheduler. Wall-clock figures are
    reported beside them (``*_wall``) for reference.

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
    r = subprocess.run([str(exe), "-n", str(n), sys.executable, "-m", "mpifc.runtime.fc_job", *args],
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


def centralized(shards: Path, thr: float, mis: int, hp: dict) -> dict:
    """LearnSPN on the union of the client rows (horizontal: stacked), same hyperparameters."""
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.runtime.fc_train import warm_up

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
    test = read_test(shards)
    ll = np.asarray(spn.log_likelihood(test.x[:, [test.features.index(f) for f in order]]), dtype=np.float64)
    return {"seconds": cpu, "seconds_wall": wall, "test_ll": float(ll.mean()), "rows": len(x),
            "n_parameters": int(spn.num_parameters())}


def macro_f1(shards: Path, npz: Path) -> float | None:
    """Macro-averaged F1 (mean over classes), from the per-row class log-joints."""
    z = np.load(npz)
    test = read_test(shards)
    m = load_manifest(shards)
    if m.target is None:
        return None
    y = test.x[:, test.features.index(m.target)].astype(np.int64)
    pred = np.argmax(z["joint"], axis=1)
    f1s = []
    for k in range(z["joint"].shape[1]):
        tp = np.sum((pred == k) & (y == k))
        denom = np.sum(pred == k) + np.sum(y == k)
        f1s.append(2.0 * tp / denom if denom else 0.0)
    return float(np.mean(f1s))


def bench_dataset(a: argparse.Namespace, out: Path, ds: str) -> dict:
    from mpifc.runtime.fc_eval import evaluate_gathered

    thr, mis = HP[ds]
    rows = None if ds == "breast-cancer" or a.max_rows == 0 else a.max_rows
    hp = learner_hp(a)
    sh = prepared(out, ds, "horizontal", a.clients, rows, a.split)
    model = out / f"{ds}-h-{a.split}.h5"
    tr = mpiexec(a.clients + 1, ["train", str(sh), "--learner", "learnspn", "--threshold", str(thr),
                                 "--min-instances-slice", str(mis), *hp_flags(hp), "--model", str(model), "--json"],
                a.timeout)
    cen = centralized(sh, thr, mis, hp)
    client_cp = max(v["learn"] + v["serialize"] for v in tr["client_seconds"].values())
    server = sum(tr["server_seconds"].values())
    cp = client_cp + server
    walls = tr.get("client_seconds_wall", {})
    cp_wall = (max(v["learn"] + v["serialize"] for v in walls.values()) + sum(tr["server_seconds_wall"].values())
               if walls else None)
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
         "fedpc_critical_path_s": cp, "fedpc_client_max_s": client_cp, "fedpc_server_s": server,
         "fedpc_job_critical_path_s": tr["train_seconds_critical_path"],
         "fedpc_total_cpu_s": tr["train_seconds_total"], "client_seconds": tr["client_seconds"],
         "server_seconds": tr["server_seconds"], "central_s": cen["seconds"],
         "relative_runtime": cp / cen["seconds"], "paper_relative_runtime": PAPER_RELATIVE[ds],
         "fedpc_critical_path_wall_s": cp_wall, "central_wall_s": cen["seconds_wall"],
         "fedpc_test_ll": gat["test_ll"], "central_test_ll": cen["test_ll"],
         "ll_gap": cen["test_ll"] - gat["test_ll"], "accuracy": gat["accuracy"], "f1": gat["f1"],
         "f1_macro": macro_f1(sh, npz), "paper_fc_pc_acc_f1": PAPER_T7[ds],
         "fedpc_n_parameters": tr["n_parameters"], "central_n_parameters": cen["n_parameters"],
         "bytes_train": tr["bytes_train"], "query_rows": a.query_rows, "batch": a.batch,
         "bytes_query": dist_q["bytes_query"], "messages_query": dist_q["messages"],
         "distributed_batch_s": dist_q["batch_seconds"], "gathered_batch_s": gat_q["batch_seconds"],
         "throughput_ratio": thr_best, "throughput_ratio_total": thr_total}
    print(f"{ds} horizontal {a.clients} clients ({a.split} split): rows={cen['rows']} "
          f"fedpc_cp={cp:.3f}s (client {client_cp:.3f} + server {server:.3f}) central={cen['seconds']:.3f}s "
          f"relative={r['relative_runtime']:.3f} (paper {PAPER_RELATIVE[ds]}) "
          f"ll fedpc={gat['test_ll']:.3f} central={cen['test_ll']:.3f} acc={gat['accuracy']:.3f} "
          f"f1={gat['f1']:.3f} f1_macro={r['f1_macro']:.3f} "
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
                    "--products", "8", "--model", str(mv), "--json"], a.timeout)
        ev = evaluate_gathered({"dir": str(sv), "model": str(mv), "batch": a.batch})
        glue[g] = {"test_ll": ev["test_ll"], "accuracy": ev["accuracy"]}
    r["vertical_glue"] = glue
    print(f"{ds} vertical 2 clients K=4 P=8: " + " ".join(f"{g}: ll={v['test_ll']:.3f} acc={v['accuracy']:.3f}"
                                                          for g, v in glue.items()), flush=True)
    return r


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
    p.add_argument("--skip-glue", action="store_true", help="no vertical glue-mode runs")
    p.add_argument("--out", default="/tmp/fedpc-bench")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {ds: bench_dataset(a, out, ds) for ds in a.datasets}
    from mpifc.atomic import atomic_write_text

    atomic_write_text(out / "results.json", json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
