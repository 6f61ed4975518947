#!/usr/bin/env python
"""Table 1's relative runtime with SPFlow 1.1.0's LearnSPN as the learner, beside ours, in one run.

The paper's Table 1 divides the one-pass critical path (the slowest client) by centralized
LearnSPN, both run with SPFlow. A ratio of CPU seconds depends on the learner's cost profile, not
only on how the work is split: a learner whose cost is mostly per split (per column pair, per
call) gives other ratios than one whose cost is mostly per row. This bench measures that
directly. For each cell it runs, on the same shards and with the same settings as
``mpifc experiment table1`` (Table 4's threshold and min_instances_slice, k-means with 2
clusters; Algorithm 1's plan with K = 2 clusters per single-owner subspace):

* **ours**: each client's work exactly as a training job does it
  (:func:`mpifc.federated.one_pass.run_client_tasks`: k-means into clusters where the plan asks,
  then one LearnSPN per cluster, MSPN piecewise leaves and SPFlow's RDC convention as table1), and
  :func:`mpifc.circuit.learnspn.learn_spn` on the union of the training rows (the ``central``
  shard). CPU seconds, the minimum of ``--repeat`` runs each, in this process after a warm-up.
* **SPFlow**: the same client work with SPFlow's ``learn_spn`` in place of ours (the same k-means
  clusters, from Algorithm 1's :func:`~mpifc.federated.one_pass.cluster_rows`, whose CPU seconds
  are measured here and added to SPFlow's client too), and SPFlow on the same union. One fresh
  worker process per cell (torch at one thread, imports and a tiny fit first), killed after
  ``--spflow-timeout`` seconds. SPFlow's leaves: Normal for real columns, Bernoulli for two-valued
  ones (SPFlow 1.1.0's piecewise-linear leaf needs per-column domains that ``learn_spn`` cannot
  pass); its RDC is patched as in ``circuit_learnspn.py`` (a constant column scores 0 instead
  of crashing).

Relative runtime = the slowest client's CPU seconds / the centralized CPU seconds, per learner.
The server's part (plan, assemble: milliseconds) and the MPI job are left out on both sides:
this compares learners, not transports (``fedpc.py`` and table1 time the real jobs).

Usage::

    OMP_NUM_THREADS=1 python launch/bench/relative_runtime_spflow.py \\
        [--datasets breast-cancer] [--settings horizontal vertical hybrid] [--seeds 0 1] \\
        [--max-rows N] [--repeat 3] [--spflow-timeout 900] [--out DIR]

Prints one line per cell and a table, and writes ``DIR/results.json`` and ``DIR/results.csv``
(atomically). Shards are prepared under ``DIR/shards`` (``--out`` defaults to a temporary folder).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# First, even when PYTHONPATH already holds it: run as a script, this folder comes first on
# sys.path, and its data_prep.py would shadow the data_prep package.
sys.path.insert(0, str(REPO))

SETTINGS = ("horizontal", "vertical", "hybrid")


def cell_inputs(cache: Any, dataset: str, setting: str, seed: int, rows: int | None) -> dict[str, Any]:
    """Shards, plan and settings of one table1 cell (as :mod:`mpifc.experiments.table1` builds them)."""
    from data_prep.shards import load_manifest, read_client
    from mpifc.experiments import paper
    from mpifc.experiments.jobs import ShardSpec
    from mpifc.experiments.table1 import horizontal_split, hyperparameters, paper_hp
    from mpifc.federated.one_pass import OnePassBuilder
    from mpifc.fedpc.data import read_client_data

    hp, glue, _ = hyperparameters(dataset, setting)
    split = horizontal_split(dataset) if setting == "horizontal" else "iid"
    n_clients = paper.TABLE1_CLIENTS[setting]
    d = cache.get(ShardSpec(dataset, setting, n_clients, seed, split=split, max_rows=rows))
    hp = paper_hp(hp, d)
    hp = {k: v for k, v in hp.items() if not k.endswith("_paper")}
    clients = [read_client_data(str(d), i) for i in range(n_clients)]
    m = load_manifest(d)
    builder = OnePassBuilder(n_clusters=2, n_products=4, glue=glue, seed=seed, learner="learnspn", hyperparameters=hp,
                             defaults="learner")  # like for like with SPFlow: Table 4 and LearnSPN's own defaults
    plan = builder.plan([c.declaration for c in clients], m.feature_order, m.target, setting)
    dc = cache.get(ShardSpec(dataset, "central", 1, seed, max_rows=rows))
    mc = load_manifest(dc)
    shard = read_client(dc, 0)
    order = mc.feature_order
    union = shard.x_train[:, [shard.features.index(f) for f in order]]
    return {"plan": plan, "clients": clients, "hp": hp, "union": union, "union_meta": mc.meta_types(order),
            "glue": glue, "split": split}


def ours(inp: dict[str, Any], seed: int, repeat: int) -> dict[str, Any]:
    """Our clients (run_client_tasks, as the job) and our centralized LearnSPN: min CPU s of ``repeat``."""
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.federated.one_pass import run_client_tasks
    from mpifc.fedpc.train import warm_up

    warm_up({"learnspn"}, cluster=True, fit=True)
    plan, hp = inp["plan"], inp["hp"]
    extra = {k: v for k, v in hp.items() if k not in ("threshold", "min_instances_slice")}
    client_s = []
    for c in inp["clients"]:
        runs = []
        for _ in range(repeat):
            t0 = time.process_time()
            run_client_tasks(plan, c.declaration.index, c.shard.x_train, c.shard.features)
            runs.append(time.process_time() - t0)
        client_s.append(min(runs))
    runs = []
    for _ in range(repeat):
        t0 = time.process_time()
        learn_spn(inp["union"], inp["union_meta"], threshold=hp["threshold"],
                  min_instances_slice=hp["min_instances_slice"], seed=seed, **extra)
        runs.append(time.process_time() - t0)
    return {"client_seconds": client_s, "central_seconds": min(runs)}


def spflow_jobs(inp: dict[str, Any]) -> tuple[list[dict[str, Any]], list[float], dict[str, np.ndarray]]:
    """The learner calls the clients make (one per task and cluster), with Algorithm 1's k-means
    done here: (jobs, k-means CPU seconds per client, arrays by name)."""
    from mpifc.federated.one_pass import cluster_columns, cluster_rows

    plan = inp["plan"]
    jobs, arrays, kmeans_s = [], {}, []
    for c in inp["clients"]:
        x, feats = c.shard.x_train, c.shard.features
        col = {f: j for j, f in enumerate(feats)}
        spent = 0.0
        for t in plan.tasks_for(c.declaration.index):
            xs = x[:, [col[f] for f in t.features]]
            meta = [plan.meta_types[f] for f in t.features]
            if t.n_clusters == 0:
                parts = [xs]
            else:
                ccols = cluster_columns(plan, t)
                t0 = time.process_time()
                labels = cluster_rows(xs[:, ccols], t.n_clusters, t.seed) if ccols else np.zeros(len(xs), int)
                spent += time.process_time() - t0
                parts = [xs[labels == k] for k in range(int(labels.max()) + 1)]
            for p in parts:
                name = f"a{len(arrays)}"
                arrays[name] = np.ascontiguousarray(p, dtype=np.float64)
                jobs.append({"client": c.declaration.index, "array": name, "meta": meta})
        kmeans_s.append(spent)
    arrays["union"] = np.ascontiguousarray(inp["union"], dtype=np.float64)
    jobs.append({"client": -1, "array": "union", "meta": list(inp["union_meta"])})
    return jobs, kmeans_s, arrays


def spflow_worker(spec_path: str) -> dict[str, Any]:
    """Run every learner call of one cell with SPFlow (in its own process); CPU seconds per call."""
    import importlib
    import importlib.util

    import torch

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    arrays = np.load(spec["arrays"])
    spl = importlib.import_module("spflow.learn.learn_spn")
    from spflow.meta.data.scope import Scope
    from spflow.modules.leaves import Bernoulli, Normal

    # SPFlow's RDC crashes on a constant column: circuit_learnspn.py's patch (scored 0)
    path = Path(__file__).with_name("circuit_learnspn.py")
    sibling = importlib.util.spec_from_file_location("circuit_learnspn", path)
    circuit_learnspn = importlib.util.module_from_spec(sibling)
    sibling.loader.exec_module(circuit_learnspn)
    circuit_learnspn.patch_spflow_rdc(spl)

    def fit(x: np.ndarray, meta: list[str]) -> float:
        two = [j for j in range(x.shape[1]) if meta[j] != "real" and set(np.unique(x[:, j])) <= {0.0, 1.0}]
        rest = [j for j in range(x.shape[1]) if j not in two]
        leaves = ([Normal(scope=Scope(rest), out_channels=1)] if rest else []) + \
                 ([Bernoulli(scope=Scope(two), out_channels=1)] if two else [])
        t0 = time.process_time()
        spl.learn_spn(torch.tensor(x), leaf_modules=leaves, out_channels=1,
                      min_instances_slice=int(spec["min_instances_slice"]),
                      partitioning_args=dict(threshold=float(spec["threshold"])),
                      clustering_args=dict(n_clusters=2))
        return time.process_time() - t0

    torch.manual_seed(int(spec["seed"]))
    rng = np.random.default_rng(0)  # warm-up: imports, torch's first ops, one split
    fit(rng.standard_normal((60, 3)), ["real"] * 3)
    return {"seconds": [fit(arrays[j["array"]], j["meta"]) for j in spec["jobs"]]}


def spflow(inp: dict[str, Any], seed: int, timeout: float, work: Path) -> dict[str, Any]:
    """SPFlow's clients and centralized run for one cell, in a worker process."""
    jobs, kmeans_s, arrays = spflow_jobs(inp)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "arrays.npz", **arrays)
    spec = {"arrays": str(work / "arrays.npz"), "jobs": jobs, "seed": seed,
            "threshold": inp["hp"]["threshold"], "min_instances_slice": inp["hp"]["min_instances_slice"]}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(work / "spec.json")]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            secs = json.loads(line)["seconds"]
            n = len(inp["clients"])
            client_s = list(kmeans_s)
            for j, s in zip(jobs, secs):
                if j["client"] >= 0:
                    client_s[j["client"]] += s
            return {"client_seconds": client_s, "central_seconds": secs[-1], "kmeans_seconds": kmeans_s,
                    "fits": len(jobs) - 1, "clients": n}
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:300]}


def _ratio(r: dict[str, Any]) -> float | None:
    if "client_seconds" not in r or not r["central_seconds"]:
        return None
    return max(r["client_seconds"]) / r["central_seconds"]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--datasets", nargs="+", default=["breast-cancer"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--max-rows", type=int, default=0, help="rows per dataset before splitting (0: all, as table1)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of ours per measurement (its minimum counts)")
    ap.add_argument("--spflow-timeout", type=float, default=900.0, help="seconds per cell's SPFlow worker")
    ap.add_argument("--out", help="folder for results.json / results.csv and the shards")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(spflow_worker(args.worker)), flush=True)
        return 0
    from mpifc.experiments import paper
    from mpifc.experiments.jobs import ShardCache

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rr-spflow-"))
    out.mkdir(parents=True, exist_ok=True)
    cache = ShardCache(out / "shards")
    rows = args.max_rows or None
    results = []
    for ds in args.datasets:
        for st in args.settings:
            for seed in args.seeds:
                inp = cell_inputs(cache, ds, st, seed, rows)
                o = ours(inp, seed, args.repeat)
                s = spflow(inp, seed, args.spflow_timeout, out / "work" / f"{ds}-{st}-{seed}")
                paper_rr = paper.TABLE1_RUNTIME.get(ds, {}).get(st)
                rec = {"dataset": ds, "setting": st, "seed": seed, "rows": int(inp["union"].shape[0]),
                       "hp": inp["hp"], "glue": inp["glue"], "split": inp["split"], "ours": o, "spflow": s,
                       "ratio_ours": _ratio(o), "ratio_spflow": _ratio(s), "paper": paper_rr}
                results.append(rec)
                rs = "-" if rec["ratio_spflow"] is None else f"{rec['ratio_spflow']:.3f}"
                print(f"{ds} {st} seed {seed}: ours {max(o['client_seconds']):.4f} / {o['central_seconds']:.4f} s = "
                      f"{rec['ratio_ours']:.3f}; SPFlow "
                      + (f"{max(s['client_seconds']):.2f} / {s['central_seconds']:.2f} s = {rs}" if "client_seconds" in s
                         else str(s))
                      + (f"; paper {paper_rr[0]} ± {paper_rr[1]}" if paper_rr else ""), flush=True)
    print("\n| dataset | setting | seeds | ours: slowest client / central CPU s | relative, ours | "
          "SPFlow: slowest client / central CPU s | relative, SPFlow | paper |")
    print("|---|---|---|---|---|---|---|---|")
    for ds in args.datasets:
        for st in args.settings:
            cell = [r for r in results if r["dataset"] == ds and r["setting"] == st]
            ro = [r["ratio_ours"] for r in cell if r["ratio_ours"] is not None]
            rsp = [r["ratio_spflow"] for r in cell if r["ratio_spflow"] is not None]
            oc = np.mean([max(r["ours"]["client_seconds"]) for r in cell])
            ocen = np.mean([r["ours"]["central_seconds"] for r in cell])
            sp = [r["spflow"] for r in cell if "client_seconds" in r["spflow"]]
            sps = (f"{np.mean([max(s['client_seconds']) for s in sp]):.2f} / "
                   f"{np.mean([s['central_seconds'] for s in sp]):.2f}") if sp else "not finished"
            p = cell[0]["paper"] if cell else None
            print(f"| {ds} | {st} | {len(cell)} | {oc:.4f} / {ocen:.4f} | "
                  f"{np.mean(ro):.3f} ± {np.std(ro):.3f} | {sps} | "
                  + (f"{np.mean(rsp):.3f} ± {np.std(rsp):.3f}" if rsp else "–") + " | "
                  + (f"{p[0]} ± {p[1]}" if p else "–") + " |")
    _write_atomic(out / "results.json", json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["dataset", "setting", "seed", "rows", "ours_client_max_s", "ours_central_s", "ratio_ours",
                "spflow_client_max_s", "spflow_central_s", "ratio_spflow", "paper", "paper_std"])
    for r in results:
        s = r["spflow"]
        w.writerow([r["dataset"], r["setting"], r["seed"], r["rows"], max(r["ours"]["client_seconds"]),
                    r["ours"]["central_seconds"], r["ratio_ours"],
                    max(s["client_seconds"]) if "client_seconds" in s else "",
                    s.get("central_seconds", ""), r["ratio_spflow"] if r["ratio_spflow"] is not None else "",
                    *(r["paper"] or ("", ""))])
    _write_atomic(out / "results.csv", buf.getvalue())
    print(f"\nwritten: {out / 'results.json'}, {out / 'results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
