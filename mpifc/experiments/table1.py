"""Table 1: test log-likelihood and relative runtime, centralized LearnSPN against FedPC.

Cells per (dataset, seed): ``central/learnspn`` (LearnSPN on the one-client shards, timed in
this process) and ``fedpc`` in each setting (horizontal 5 clients with a label split, vertical
2, hybrid 2; Table 4's hyperparameters), trained as an MPI job and evaluated gathered. The
relative runtime of a seed is FedPC's critical-path training seconds over the centralized
seconds of the same dataset and seed. Both runs use the same seed, so the same train/test rows.

MNIST (EiNet leaves) runs only when the ``einet`` learner has a fitting function and the data
are present; otherwise its cells are recorded as not run, with the reason.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mpifc.experiments import paper, registry
from mpifc.experiments.jobs import ShardCache, ShardSpec, capped_hp, central_learnspn, evaluate_fc, \
    train_fc_cached
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.report import fmt, markdown_table, paper_fmt, provenance, short_error
from mpifc.experiments.store import NOT_RUN, OK, Cell, ResultStore, aggregate, run_cells, save_figure, write_csv, \
    write_h5_table

DATASETS = ("breast-cancer", "adult", "credit", "mnist")
SETTINGS = ("horizontal", "vertical", "hybrid")
QUICK_CLIENTS = {"horizontal": 3, "vertical": 2, "hybrid": 2}
QUICK_ROWS = 300
METRICS = ("test_ll", "relative_runtime", "train_seconds_critical_path", "central_seconds", "bytes_train")


def einet_unavailable() -> str | None:
    """Why the MNIST row cannot run here, or ``None`` when it can."""
    try:
        import mpifc.circuit.einet as einet
    except ImportError as e:
        return f"mpifc.circuit.einet cannot be imported ({e})"
    if not any(hasattr(einet, f) for f in ("fit_einet", "learn_einet")):
        return "learner 'einet' is not usable: mpifc.circuit.einet has no fit_einet/learn_einet yet"
    from data_prep.files import default_data_root

    if not (Path(default_data_root()) / "mnist").exists():
        return "MNIST data not found under the data root"
    return None


def hyperparameters(dataset: str, setting: str) -> tuple[dict[str, Any], str, str]:
    """(learner hyperparameters, glue, learner) for a cell: Table 4, EiNet for MNIST."""
    if dataset == "mnist":
        return {}, "random" if setting == "horizontal" else "combinatorial", "einet"
    thr, mis, glue = paper.TABLE4[setting][dataset]
    return {"threshold": thr, "min_instances_slice": mis}, glue, "learnspn"


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        settings: Sequence[str] | None = None, max_rows: int | None = None, shards: str | Path | None = None,
        timeout: float | None = None, progress: bool = True, launcher: Launcher | None = None,
        **_: Any) -> dict[str, Any]:
    """Run (or resume) Table 1 into ``out_dir``; returns the summary (files, counts, markdown)."""
    out = Path(out_dir)
    store = ResultStore(out)
    datasets = list(datasets or (("breast-cancer",) if quick else DATASETS))
    settings = list(settings or SETTINGS)
    rows = max_rows if max_rows is not None else (QUICK_ROWS if quick else None)
    clients = QUICK_CLIENTS if quick else paper.TABLE1_CLIENTS
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 6 * 3600))
    no_einet = einet_unavailable() if "mnist" in datasets else None

    cells = []
    for ds in datasets:
        for seed in seeds:
            cells.append(Cell(ds, "central", 1, "learnspn", seed))
            cells += [Cell(ds, st, clients[st], "fedpc", seed) for st in settings]

    def work(cell: Cell) -> dict[str, Any]:
        if cell.dataset == "mnist" and no_einet:
            return {"status": NOT_RUN, "reason": no_einet}
        if cell.dataset == "mnist" and cell.setting == "central":
            return {"status": NOT_RUN, "reason": "a centralized EiNet reference is not wired into table1 yet"}
        if cell.setting == "central":
            hp, _, _ = hyperparameters(cell.dataset, "horizontal")
            d = cache.get(ShardSpec(cell.dataset, "central", 1, cell.seed, max_rows=rows))
            hp = capped_hp(hp, d)
            res = central_learnspn(d, hp["threshold"], hp["min_instances_slice"], cell.seed)
            return {"test_ll": res["test_ll"], "central_seconds": res["seconds"], "rows": res["rows"], "hp": hp}
        hp, glue, learner = hyperparameters(cell.dataset, cell.setting)
        split = "label" if cell.setting == "horizontal" else "iid"
        d = cache.get(ShardSpec(cell.dataset, cell.setting, cell.clients, cell.seed, split=split, max_rows=rows))
        hp = capped_hp(hp, d)
        tr = train_fc_cached(launch, d, cache.runs, learner=learner, glue=glue, seed=cell.seed, hp=hp)
        ev = evaluate_fc(d, Path(tr["model_path"]))
        return {"test_ll": ev["test_ll"], "accuracy": ev.get("accuracy"),
                "train_seconds_critical_path": tr["train_seconds_critical_path"],
                "train_seconds_total": tr["train_seconds_total"], "bytes_train": tr["bytes_train"],
                "messages_train": tr["messages_train"], "n_parameters": tr["n_parameters"], "ranks": tr["ranks"],
                "hp": hp, "glue": glue, "learner": learner, "split": split, "shards": str(d),
                "model": tr["model_path"], "ledger": tr["ledger_path"], "cached_run": tr["cached"]}

    records, counts = run_cells(store, cells, work, "table1", progress)
    add_relative_runtime(records)
    return write_outputs(out, records, counts, seeds, quick, datasets, settings, rows)


def add_relative_runtime(records: list[dict[str, Any]]) -> None:
    """Set each FedPC record's ``relative_runtime`` from the central cell of its dataset and seed."""
    central = {(r["dataset"], r["seed"]): r.get("central_seconds") for r in records
               if r["setting"] == "central" and r.get("status") == OK}
    for r in records:
        if r["setting"] == "central":
            r["relative_runtime"] = 1.0 if r.get("status") == OK else None
        elif r.get("status") == OK:
            c = central.get((r["dataset"], r["seed"]))
            r["relative_runtime"] = r["train_seconds_critical_path"] / c if c else None


def write_outputs(out: Path, records: list[dict[str, Any]], counts: dict[str, int], seeds: Sequence[int],
                  quick: bool, datasets: Sequence[str], settings: Sequence[str], rows: int | None) -> dict[str, Any]:
    agg = aggregate(records, METRICS)
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    by = {(a["dataset"], a["setting"]): a for a in agg}
    header = ["dataset", "", "LL cent.", *[f"LL {s}" for s in settings], *[f"rel. runtime {s}" for s in settings]]
    table = []
    for ds in datasets:
        name = paper.PAPER_NAMES.get(ds, ds)
        ours = [name, "ours"]
        for st in ("central", *settings):
            a = by.get((ds, st))
            ours.append(fmt(a["test_ll_mean"], a["test_ll_std"]) if a and a["status"] == OK else short_error(a))
        for st in settings:
            a = by.get((ds, st))
            ours.append(fmt(a["relative_runtime_mean"], a["relative_runtime_std"]) if a and a["status"] == OK
                        else "–")
        pl = paper.TABLE1_LL.get(ds, {})
        pr = paper.TABLE1_RUNTIME.get(ds, {})
        table.append(ours)
        table.append([name, "paper", *[paper_fmt(pl.get(st), 1) for st in ("central", *settings)],
                      *[paper_fmt(pr.get(st)) for st in settings]])
    clients = QUICK_CLIENTS if quick else paper.TABLE1_CLIENTS
    md = provenance("Table 1: log-likelihood and relative runtime", seeds, quick, {
        "clients": ", ".join(f"{s} {clients[s]}" for s in settings) + " (horizontal: label split)",
        "rows per dataset": rows or "all",
        "log-likelihood": "mean test log-likelihood per row in nats, target column included",
        "relative runtime": "FedPC critical-path training seconds / centralized LearnSPN seconds, same run",
        "hyperparameters": "Table 4 (threshold, glue); min_instances_slice capped at 10% of the smallest "
                           "client's training rows (see cells' hp)",
    }) + "\n" + markdown_table(header, table) + "\n"
    files.append(_write_md(out / "table1.md", md))
    files.append(plot(out / "table1.png", agg, datasets, settings))
    return {"files": [str(f) for f in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg}


def _write_md(path: Path, text: str) -> Path:
    from mpifc.runtime.atomic import atomic_write_text

    return atomic_write_text(path, text)


def plot(path: Path, agg: list[dict[str, Any]], datasets: Sequence[str], settings: Sequence[str]) -> Path:
    """Two panels: FedPC LL minus centralized LL, and relative runtime; ours beside the paper's."""
    from matplotlib.figure import Figure

    by = {(a["dataset"], a["setting"]): a for a in agg}
    labels, gap_ours, gap_paper, rt_ours, rt_paper, gap_err, rt_err = [], [], [], [], [], [], []
    for ds in datasets:
        c = by.get((ds, "central"))
        pc = paper.TABLE1_LL.get(ds, {}).get("central")
        for st in settings:
            a = by.get((ds, st))
            labels.append(f"{paper.PAPER_NAMES.get(ds, ds)}\n{st}")
            ok = a is not None and a["status"] == OK and c is not None and c["status"] == OK
            gap_ours.append(a["test_ll_mean"] - c["test_ll_mean"] if ok else float("nan"))
            gap_err.append(a["test_ll_std"] if ok else 0.0)
            p = paper.TABLE1_LL.get(ds, {}).get(st)
            gap_paper.append(p[0] - pc[0] if p and pc else float("nan"))
            rt_ours.append(a["relative_runtime_mean"] if a and a["status"] == OK else float("nan"))
            rt_err.append(a["relative_runtime_std"] if a and a["status"] == OK else 0.0)
            q = paper.TABLE1_RUNTIME.get(ds, {}).get(st)
            rt_paper.append(q[0] if q else float("nan"))
    fig = Figure(figsize=(max(6.0, 1.1 * len(labels) + 2), 6.5))
    ax1, ax2 = fig.subplots(2, 1)
    xs = list(range(len(labels)))
    w = 0.38
    ax1.bar([x - w / 2 for x in xs], gap_ours, w, yerr=gap_err, label="ours", color="tab:blue")
    ax1.bar([x + w / 2 for x in xs], gap_paper, w, label="paper", color="tab:gray")
    ax1.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("LL(FedPC) − LL(central) [nats]")
    ax1.legend(fontsize=8)
    ax2.bar([x - w / 2 for x in xs], rt_ours, w, yerr=rt_err, label="ours", color="tab:green")
    ax2.bar([x + w / 2 for x in xs], rt_paper, w, label="paper", color="tab:gray")
    ax2.axhline(1.0, color="black", lw=0.8, ls="--")
    ax2.set_ylabel("relative runtime (central = 1)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Table 1: FedPC against centralized LearnSPN", fontsize=10)
    return save_figure(fig, path)


registry.register("table1", "Table 1: log-likelihood and relative runtime, LearnSPN vs FedPC", run)
