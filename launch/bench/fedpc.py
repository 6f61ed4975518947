"""FedPC benchmark: one-pass training time vs centralized LearnSPN, query throughput, glue modes.

Usage (from the repo root, venv python)::

    python launch/bench/fedpc.py --datasets breast-cancer adult credit --max-rows 20000 --out /tmp/fedpc-bench

Per dataset (horizontal, 5 clients): one ``mpiexec`` training job (critical-path seconds from its
JSON), centralized LearnSPN on the union of the client rows with the same hyperparameters (timed
in this process, in the same run), test log-likelihood of both, then query throughput of the
distributed upward pass against gathered single-process evaluation (batch 10,000). Glue modes:
vertical (2 clients) test log-likelihood for random, combinatorial and cooccurrence.
Prints one line per measurement and a final JSON document.
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

# Table 4 of the paper (horizontal): (threshold, min_instances_slice).
HP = {"breast-cancer": (0.4, 30), "adult": (0.3, 200), "credit": (0.5, 200)}
PAPER_RELATIVE = {"breast-cancer": 0.21, "adult": 0.17, "credit": 0.42}


def mpiexec(n: int, args: list[str], timeout: float) -> dict:
    exe = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    r = subprocess.run([str(exe), "-n", str(n), sys.executable, "-m", "mpifc.runtime.fc_job", *args],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"job failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def prepared(out: Path, dataset: str, setting: str, clients: int, max_rows: int | None) -> Path:
    d = out / f"{dataset}-{setting}-{clients}"
    if not (d / "manifest.json").exists():
        write_shards(prepare(dataset=dataset, setting=setting, clients=clients, seed=0, max_rows=max_rows), d)
    return d


def centralized(shards: Path, thr: float, mis: int) -> dict:
    """LearnSPN on the union of the client rows (horizontal: stacked), same hyperparameters."""
    from mpifc.circuit.learnspn import learn_spn

    m = load_manifest(shards)
    order = m.feature_order
    parts = []
    for i in range(m.n_clients):
        s = read_client(shards, i)
        parts.append(s.x_train[:, [s.features.index(f) for f in order]])
    x = np.concatenate(parts)
    t0 = time.perf_counter()
    spn = learn_spn(x, m.meta_types(order), threshold=thr, min_instances_slice=mis, seed=0)
    seconds = time.perf_counter() - t0
    test = read_test(shards)
    ll = spn.log_likelihood(test.x).numpy()
    return {"seconds": seconds, "test_ll": float(ll.mean()), "rows": len(x)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--datasets", nargs="+", default=["breast-cancer", "adult", "credit"])
    p.add_argument("--max-rows", type=int, default=20000)
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--out", default="/tmp/fedpc-bench")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from mpifc.runtime.fc_eval import evaluate_gathered

    results = {}
    for ds in a.datasets:
        thr, mis = HP[ds]
        rows = None if ds == "breast-cancer" else a.max_rows
        sh = prepared(out, ds, "horizontal", a.clients, rows)
        model = out / f"{ds}-h.h5"
        tr = mpiexec(a.clients + 1, ["train", str(sh), "--learner", "learnspn", "--threshold", str(thr),
                                     "--min-instances-slice", str(mis), "--model", str(model), "--json"], a.timeout)
        cen = centralized(sh, thr, mis)
        dist = mpiexec(a.clients + 1, ["evaluate", str(sh), "--model", str(model), "--distributed",
                                       "--batch", str(a.batch), "--json"], a.timeout)
        gat = evaluate_gathered({"dir": str(sh), "model": str(model), "batch": a.batch})
        rel = tr["train_seconds_critical_path"] / cen["seconds"]
        thr_ratio = gat["query_seconds"] / dist["query_seconds"]
        r = {"rows": cen["rows"], "fedpc_critical_path_s": tr["train_seconds_critical_path"],
             "fedpc_total_cpu_s": tr["train_seconds_total"], "central_s": cen["seconds"],
             "relative_runtime": rel, "paper_relative_runtime": PAPER_RELATIVE[ds],
             "fedpc_test_ll": gat["test_ll"], "central_test_ll": cen["test_ll"],
             "ll_gap": cen["test_ll"] - gat["test_ll"], "accuracy": gat["accuracy"], "f1": gat["f1"],
             "bytes_train": tr["bytes_train"], "bytes_query": dist["bytes_query"],
             "distributed_query_s": dist["query_seconds"], "gathered_query_s": gat["query_seconds"],
             "throughput_ratio": thr_ratio}
        print(f"{ds} horizontal {a.clients} clients: rows={cen['rows']} fedpc_cp={r['fedpc_critical_path_s']:.2f}s "
              f"central={cen['seconds']:.2f}s relative={rel:.3f} (paper {PAPER_RELATIVE[ds]}) "
              f"ll fedpc={gat['test_ll']:.3f} central={cen['test_ll']:.3f} acc={gat['accuracy']:.3f} "
              f"throughput dist/gathered={thr_ratio:.3f}", flush=True)
        # Glue modes on vertical data, 2 clients, one process (same leaves learner).
        sv = prepared(out, ds, "vertical", 2, rows)
        glue = {}
        for g in ("random", "combinatorial", "cooccurrence"):
            mv = out / f"{ds}-v-{g}.h5"
            mpiexec(3, ["train", str(sv), "--learner", "learnspn", "--threshold", str(thr),
                        "--min-instances-slice", str(mis), "--glue", g, "--clusters", "4", "--products", "8",
                        "--model", str(mv), "--json"], a.timeout)
            ev = evaluate_gathered({"dir": str(sv), "model": str(mv), "batch": a.batch})
            glue[g] = {"test_ll": ev["test_ll"], "accuracy": ev["accuracy"]}
        r["vertical_glue"] = glue
        print(f"{ds} vertical 2 clients K=4: " + " ".join(f"{g}: ll={v['test_ll']:.3f} acc={v['accuracy']:.3f}"
                                                          for g, v in glue.items()), flush=True)
        results[ds] = r
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
