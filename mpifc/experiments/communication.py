"""``commcost``: measured training bytes of FedPC one-pass, FedAvg and SplitNN beside the closed forms.

On the same shards: horizontal FedPC against FedAvg (K rounds), vertical FedPC against SplitNN
(E epochs). Each job writes its per-message ledger; the measured bytes are set beside the
closed forms of :mod:`mpifc.analysis.commcost` for the same |C|, M, K, E, F, S:

* FedAvg and SplitNN: the ledger's payload bytes of phase ``train`` against the exact form;
* FedPC: the payload of the kinds the paper counts (``fc.train.model`` and ``fc.train.counts``)
  against ``|C| (M + 1)`` (horizontal) or ``K M |C| + P`` (vertical) scalars, with M the
  client PCs' parameters. The PCs travel as HDF5 files, so the measured bytes carry the
  structure and file overhead the formula leaves out; the ratio says how much.

The figure is appendix D's Fig. 5 redrawn from the formulas, with our measured runs added.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from mpifc.experiments import registry
from mpifc.experiments.jobs import ShardCache, ShardSpec, capped_hp, run_fedavg, run_splitnn, train_fc_cached
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.paper import TABLE4
from mpifc.experiments.report import fmt, markdown_table, provenance, short_error
from mpifc.experiments.store import OK, Cell, ResultStore, aggregate, run_cells, write_csv, write_h5_table
from mpifc.experiments.table7 import budgets

FEDPC_KINDS = ("fc.train.model", "fc.train.counts")
CLUSTERS, PRODUCTS = 2, 4


def ledger_bytes(path: Path, kinds: Sequence[str] | None = None, phase: str | None = None) -> dict[str, int]:
    """Payload and total bytes and messages of a job's ledger CSV, filtered by kind and phase."""
    pay = tot = n = 0
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if kinds is not None and r["kind"] not in kinds:
                continue
            if phase is not None and r["phase"] != phase:
                continue
            pay += int(r["payload_bytes"])
            tot += int(r["total_bytes"])
            n += 1
    return {"payload_bytes": pay, "total_bytes": tot, "messages": n}


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        max_rows: int | None = None, shards: str | Path | None = None, timeout: float | None = None,
        progress: bool = True, launcher: Launcher | None = None, **_: Any) -> dict[str, Any]:
    """Run (or resume) the communication-cost study into ``out_dir``."""
    from mpifc.analysis import commcost as cc

    out = Path(out_dir)
    store = ResultStore(out)
    datasets = [d for d in (datasets or ("breast-cancer",)) if d != "mnist"]
    rows = max_rows  # breast cancer is small enough in full, also for --quick
    n_h, n_v = (2, 2) if quick else (5, 2)
    budget = budgets(quick)
    rounds, epochs, cut = budget["rounds"], budget["epochs"], 8
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 6 * 3600))
    cells = []
    for ds in datasets:
        for seed in seeds:
            cells += [Cell(ds, "horizontal", n_h, "fedpc", seed), Cell(ds, "horizontal", n_h, "fedavg", seed),
                      Cell(ds, "vertical", n_v, "fedpc", seed), Cell(ds, "vertical", n_v, "splitnn", seed)]

    def work(cell: Cell) -> dict[str, Any]:
        # The same runs as table7's (same shards, hyperparameters and budgets): with a shared
        # shard cache they are reused, not rerun.
        d = cache.get(ShardSpec(cell.dataset, cell.setting, cell.clients, cell.seed, max_rows=rows))
        if cell.method == "fedpc":
            thr, mis, glue = TABLE4[cell.setting].get(cell.dataset, (0.4, 100, "combinatorial"))
            hp = capped_hp({"threshold": thr, "min_instances_slice": mis}, d)
            tr = train_fc_cached(launch, d, cache.runs, glue=glue, clusters=CLUSTERS, products=PRODUCTS,
                                 seed=cell.seed, hp=hp)
            counted = ledger_bytes(Path(tr["ledger_path"]), FEDPC_KINDS)
            c = cell.clients
            m_total = int(tr["n_parameters"])
            if cell.setting == "horizontal":
                m = max(1, m_total // c)
                formula = cc.fedpc_horizontal_bytes(c, m)
            else:
                m = max(1, m_total // (c * CLUSTERS))
                formula = cc.fedpc_vertical_bytes(c, m, CLUSTERS, PRODUCTS)
            return {"measured_bytes": counted["payload_bytes"], "measured_total_bytes": tr["bytes_train"],
                    "formula_bytes": formula, "ratio": counted["payload_bytes"] / formula, "n_parameters": m_total,
                    "m_per_pc": m, "messages": counted["messages"], "ledger": tr["ledger_path"],
                    "cached_run": tr["cached"]}
        if cell.method == "fedavg":
            res = run_fedavg(launch, d, cache.runs, cell.seed, rounds=rounds)
            formula = cc.fedavg_bytes(cell.clients, res["n_parameters"], rounds, itemsize=res["itemsize"])
            extra = {"rounds": rounds, "n_parameters": res["n_parameters"]}
        else:
            res = run_splitnn(launch, d, cache.runs, cell.seed, epochs=epochs, cut=cut)
            formula = cc.splitnn_bytes(cell.clients, cut, res["n_train"], epochs,
                                       itemsize=res.get("itemsize", cc.FLOAT32), n_classes=res["n_classes"])
            extra = {"epochs": epochs, "cut": cut, "samples": res["n_train"]}
        return {"measured_bytes": res["payload_bytes_train"], "measured_total_bytes": res["bytes_train"],
                "formula_bytes": formula, "ratio": res["payload_bytes_train"] / formula,
                "messages": res["messages_train"], "accuracy": res.get("accuracy"), "ledger": res["ledger_path"],
                "cached_run": res["cached"], **extra}

    records, counts = run_cells(store, cells, work, "commcost", progress)
    agg = aggregate(records, ("measured_bytes", "measured_total_bytes", "formula_bytes", "ratio"))
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    by = {(a["dataset"], a["setting"], a["method"]): a for a in agg}
    table, points = [], []
    for a in agg:
        ok = a["status"] == OK
        table.append([a["dataset"], a["setting"], a["clients"], a["method"],
                      f"{a['measured_bytes_mean']:.0f}" if ok else short_error(a),
                      f"{a['measured_total_bytes_mean']:.0f}" if ok else "–",
                      f"{a['formula_bytes_mean']:.0f}" if ok else "–", fmt(a["ratio_mean"], a["ratio_std"], 3)])
        if ok:
            points.append(cc.MeasuredPoint(a["setting"], a["method"], f"{a['dataset']}\n(ours)",
                                           int(a["measured_bytes_mean"]), int(a["formula_bytes_mean"])))
    ratios = []
    for ds in datasets:
        h, f = by.get((ds, "horizontal", "fedpc")), by.get((ds, "horizontal", "fedavg"))
        v, s = by.get((ds, "vertical", "fedpc")), by.get((ds, "vertical", "splitnn"))
        if h and f and h["status"] == OK and f["status"] == OK:
            r = f["measured_bytes_mean"] / h["measured_bytes_mean"]
            ratios.append([ds, "FedAvg / FedPC (horizontal)", f"{r:.1f}x"])
        if v and s and v["status"] == OK and s["status"] == OK:
            r = s["measured_bytes_mean"] / v["measured_bytes_mean"]
            ratios.append([ds, "SplitNN / FedPC (vertical)", f"{r:.1f}x"])
    for sc in cc.scenario_costs():
        ratios.append([f"paper-like S={sc['samples']:.0e} M={sc['params']:.0e} (formula)",
                       "FedAvg/FedPC; SplitNN/FedPC",
                       f"{sc['fedavg_over_fedpc']:.0f}x; {sc['splitnn_over_fedpc']:.0f}x"])
    md = provenance("Communication cost of training: measured against closed forms", seeds, quick, {
        "runs": f"the runs of table7: FedPC (K={CLUSTERS}, P={PRODUCTS}, Table 4 settings), FedAvg K={rounds} rounds, SplitNN E={epochs} epochs F={cut}",
        "measured": "ledger payload bytes (FedPC: model + count messages; baselines: phase train); "
                    "total = with headers and every other message",
        "formula": "mpifc.analysis.commcost, float32 scalars, both directions for the baselines",
    }) + "\n" + markdown_table(["dataset", "setting", "clients", "method", "measured payload B", "measured total B",
                                "formula B", "measured / formula"], table) + "\n\n" + \
        markdown_table(["where", "ratio", "value"], ratios) + "\n"
    from mpifc.runtime.atomic import atomic_write_text

    files.append(atomic_write_text(out / "commcost.md", md))
    files.append(cc.plot_appendix_d(out / "commcost.png", measured=points))
    return {"files": [str(p) for p in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg}


registry.register("commcost", "measured training bytes of FedPC, FedAvg, SplitNN beside the closed forms", run)
