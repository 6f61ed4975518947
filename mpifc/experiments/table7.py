"""Table 7: accuracy and macro F1 of federated classifiers in every FL setting.

Methods per (dataset, setting, clients, seed):

* ``fc-pc``: FedPC with LearnSPN leaves, trained as ``mpifc train`` trains it with no flag but
  the seed (the adaptive defaults, :mod:`mpifc.federated.defaults`: per-PC LearnSPN settings from
  its rows, the class glue, and on vertical data exact EM), classifying by arg-max of
  ``log p(x, y = c)``; ``fc-dt``: FC[DT], one tree per client averaged at the root. FC[DT] needs
  the label on every client, so its vertical shards give every client the target column (the
  paper does not say how it labelled vertical trees; this is recorded in the table);
* ``fedavg`` (horizontal) and ``splitnn`` (vertical): MLPs on mpifc's runtime. TabNet is not
  used: ``pytorch-tabnet`` 4.1.0 imports pandas without declaring it, so it does not install
  cleanly beside our torch (:func:`tabnet_note` says what was found on this machine);
* ``hgb``: centralized HistGradientBoosting on the joined training rows, the ceiling (one cell
  per dataset and seed, setting ``central``);
* FedTree: not reproduced (no Python package); the paper's numbers are listed.

Samples are split at random (appendix E.1: binary tasks); a method that fails is recorded in
its cell and shown in the table instead of stopping it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mpifc.experiments import paper, registry
from mpifc.experiments.paper import is_image_set
from mpifc.experiments.jobs import (ShardCache, ShardSpec, central_hgb, evaluate_fc, run_fedavg, run_splitnn,
                                    train_fc_cached)
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.report import fmt, markdown_table, paper_fmt, provenance, short_error
from mpifc.experiments.store import OK, Cell, ResultStore, aggregate, run_cells, save_figure, write_csv, \
    write_h5_table

DATASETS = ("breast-cancer", "credit", "adult")
GRID = (("horizontal", 5), ("horizontal", 10), ("vertical", 2), ("vertical", 3), ("hybrid", 2), ("hybrid", 3))
QUICK_GRID = (("horizontal", 2), ("vertical", 2))
QUICK_ROWS = None  # breast cancer is small: all 569 rows keep the test set (114 rows) stable
METHODS = {"horizontal": ("fc-pc", "fc-dt", "fedavg"), "vertical": ("fc-pc", "fc-dt", "splitnn"),
           "hybrid": ("fc-pc", "fc-dt")}
LABELS = {"fc-pc": "FC[PC]", "fc-dt": "FC[DT]", "fedavg": "FedAvg-MLP", "splitnn": "SplitNN-MLP",
          "hgb": "central HistGB", "fedtree": "FedTree"}
METRICS = ("accuracy", "f1", "bytes_train")


def tabnet_note() -> str:
    """Why the baselines are MLPs, as found here (recorded in the markdown)."""
    import importlib.util

    if importlib.util.find_spec("pytorch_tabnet") is None:
        found = "not installed"
    elif importlib.util.find_spec("pandas") is None:
        found = "installed, but its undeclared dependency pandas is missing"
    else:
        found = "installed, but not used, for the same network in every setting"
    return (f"MLPs instead of TabNet: pytorch-tabnet 4.1.0 needs pandas without declaring it, so it does not "
            f"install cleanly (here: {found})")


def label_owner(cell: Cell) -> int | str | None:
    """The cell's ``label_owner`` shard option (None: the partition's default).

    FC[DT] needs the label on every client (vertical: ``"all"``); FC[PC] takes the shards as
    ``data_prep`` writes them (vertical: one label owner; hybrid: the label in every client's
    shared block).
    """
    if cell.method == "fc-dt" and cell.setting == "vertical":
        return "all"
    return None


FC_PC_NOTE = ("mpifc train's adaptive defaults (mpifc.federated.defaults), the command a user runs: every "
              "client PC's LearnSPN settings follow from its rows and meta-types; the class glue: a client "
              "that holds the label splits its rows by class, so the prediction uses every client's "
              "columns; vertical: the other clients' rows in k-means clusters (K = 4 for 2-3 clients) tied "
              "to the classes by 10 iterations of exact distributed EM (per-sample values and flows over "
              "the aligned rows); hybrid and horizontal: the label on every client")


def cell_config(cell: Cell) -> dict[str, Any]:
    """What an FC cell's result depends on beyond its key, as recorded: FC[PC] the preset
    (``adaptive``: mpifc train's defaults), FC[DT] its glue and K; both the label owner.

    A stored cell whose record differs (e.g. an FC[PC] run with Table 4's fixed settings, whose
    records carry no preset) is not reused.
    """
    if cell.method not in ("fc-pc", "fc-dt"):
        return {}
    owner = label_owner(cell)
    owner = "default" if owner is None else owner
    if cell.method == "fc-pc":
        return {"preset": "adaptive", "label_owner": owner}
    return {"glue": paper.learnspn_hp(cell.setting, cell.dataset)[1], "clusters": paper.T7_DEFAULT_CLUSTERS,
            "label_owner": owner}


def recorded_config(cell: Cell, rec: dict[str, Any]) -> dict[str, Any]:
    """:func:`cell_config` as a stored record states it (FC[PC] without a preset: Table 4's
    fixed settings; FC[DT] without glue/K: Table 4's glue, K = 2)."""
    if cell.method not in ("fc-pc", "fc-dt"):
        return {}
    if cell.method == "fc-pc":
        return {"preset": rec.get("preset", "table4"), "label_owner": rec.get("label_owner")}
    return {"glue": rec.get("glue", paper.learnspn_hp(cell.setting, cell.dataset)[1]),
            "clusters": rec.get("clusters", paper.T7_DEFAULT_CLUSTERS), "label_owner": rec.get("label_owner")}


class ConfigCheckedStore(ResultStore):
    """Table 7's cells: a finished cell counts as done only if it ran the current configuration."""

    def done(self, cell: Cell) -> bool:
        rec = self.load(cell)
        return rec is not None and rec.get("status") == OK and recorded_config(cell, rec) == cell_config(cell)


def budgets(quick: bool) -> dict[str, int]:
    """FedAvg rounds and SplitNN epochs (the paper's TabNet budgets are not stated)."""
    return {"rounds": 3, "epochs": 2} if quick else {"rounds": 50, "epochs": 20}


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        settings: Sequence[str] | None = None, max_rows: int | None = None, shards: str | Path | None = None,
        timeout: float | None = None, progress: bool = True, launcher: Launcher | None = None,
        grid: Sequence[tuple[str, int]] | None = None, methods: Sequence[str] | None = None,
        run_missing: bool = True, **_: Any) -> dict[str, Any]:
    """Run (or resume) Table 7 into ``out_dir``; returns the summary (files, counts, markdown).

    Args:
        grid: (setting, clients) pairs (default: the paper's, or a 2-client quick grid).
        methods: restrict to these methods (default: all that apply to a setting).
        run_missing: ``False``: run nothing, only tabulate the cells already in ``out_dir``
            (e.g. after runs over parts of the grid; each row says over how many seeds).
    """
    out = Path(out_dir)
    store = ConfigCheckedStore(out)
    datasets = [d for d in (datasets or (("breast-cancer",) if quick else DATASETS)) if not is_image_set(d)]
    grid = [g for g in (grid or (QUICK_GRID if quick else GRID)) if not settings or g[0] in settings]
    rows = max_rows if max_rows is not None else (QUICK_ROWS if quick else None)
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 6 * 3600))
    b = budgets(quick)

    cells = []
    for ds in datasets:
        for seed in seeds:
            if not methods or "hgb" in methods:
                cells.append(Cell(ds, "central", 1, "hgb", seed))
            for st, k in grid:
                cells += [Cell(ds, st, k, m, seed) for m in METHODS[st] if not methods or m in methods]

    if not run_missing:
        cells = [c for c in cells if store.done(c)]

    def work(cell: Cell) -> dict[str, Any]:
        if cell.method == "hgb":
            d = cache.get(ShardSpec(cell.dataset, "central", 1, cell.seed, max_rows=rows))
            res = central_hgb(d, cell.seed)
            return {"accuracy": res["accuracy"], "f1": res["f1"], "bytes_train": 0, "wall_seconds": res["wall_seconds"]}
        owner = label_owner(cell)
        d = cache.get(ShardSpec(cell.dataset, cell.setting, cell.clients, cell.seed, max_rows=rows, label_owner=owner))
        if cell.method in ("fc-pc", "fc-dt"):
            conf = cell_config(cell)
            if cell.method == "fc-pc":
                tr = train_fc_cached(launch, d, cache.runs, learner="learnspn", preset="adaptive", seed=cell.seed)
                used = {"glue_used": tr.get("glue"), "clusters_used": tr.get("clusters")}
            else:
                tr = train_fc_cached(launch, d, cache.runs, learner="dt", glue=conf["glue"],
                                     clusters=conf["clusters"], seed=cell.seed)
                used = {}
            model = Path(tr["model_path"])
            ev = evaluate_fc(d, model, npz=model.with_suffix(".test.npz"))
            return {"accuracy": ev["accuracy"], "f1": ev["f1"], "f1_binary": ev.get("f1_binary"),
                    "test_ll": ev["test_ll"], "bytes_train": tr["bytes_train"],
                    "train_seconds_critical_path": tr["train_seconds_critical_path"], "ranks": tr["ranks"],
                    **conf, **used, "model": str(model), "ledger": tr["ledger_path"],
                    "predictions": str(model.with_suffix(".test.npz")), "cached_run": tr["cached"]}
        if cell.method == "fedavg":
            res = run_fedavg(launch, d, cache.runs, cell.seed, rounds=b["rounds"])
        else:
            res = run_splitnn(launch, d, cache.runs, cell.seed, epochs=b["epochs"])
        return {"accuracy": res["accuracy"], "f1": res["f1"], "bytes_train": res["bytes_train"],
                "wall_seconds": res.get("wall_seconds"), "n_parameters": res.get("n_parameters"), "ledger": res["ledger_path"], "cached_run": res["cached"], **b}

    records, counts = run_cells(store, cells, work, "table7", progress)
    return write_outputs(out, records, counts, seeds, quick, datasets, grid, rows)


def write_outputs(out: Path, records: list[dict[str, Any]], counts: dict[str, int], seeds: Sequence[int],
                  quick: bool, datasets: Sequence[str], grid: Sequence[tuple[str, int]], rows: int | None
                  ) -> dict[str, Any]:
    agg = aggregate(records, METRICS)
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    by = {(a["dataset"], a["setting"], a["clients"], a["method"]): a for a in agg}
    header = ["setting", "method (clients)"]
    for ds in datasets:
        name = paper.PAPER_NAMES.get(ds, ds)
        header += [f"{name} acc. (ours)", f"{name} acc. (paper)", f"{name} F1 (ours)", f"{name} F1 (paper)"]
    table = []
    for st, k in grid:
        for m in (*METHODS[st], "fedtree"):
            row = [st, f"{LABELS[m]} ({k} cl.)"]
            for ds in datasets:
                a = by.get((ds, st, k, m))
                for metric in ("accuracy", "f1"):
                    if m == "fedtree":
                        row.append("not reproduced")
                    elif a and a["status"] == OK:
                        row.append(fmt(a[f"{metric}_mean"], a[f"{metric}_std"]))
                    else:
                        row.append(short_error(a, 60) if a else "–")
                    row.append(paper_fmt(paper.table7_paper(st, m, k, ds, metric)))
            table.append(row)
    row = ["central", LABELS["hgb"]]
    for ds in datasets:
        a = by.get((ds, "central", 1, "hgb"))
        for metric in ("accuracy", "f1"):
            row += [fmt(a[f"{metric}_mean"], a[f"{metric}_std"]) if a and a["status"] == OK else short_error(a), "–"]
    table.append(row)
    b = budgets(quick)
    md = provenance("Table 7: classification in federated settings", seeds, quick, {
        "methods run": ", ".join(LABELS[m] for m in LABELS if any(r["method"] == m for r in records))
                       + " (other rows: '–')",
        "rows per dataset": f"at most {rows} (stratified subsample; smaller sets whole)" if rows else "all",
        "F1": "macro F1 for every method (the paper's credit baselines at 0.48 imply macro)",
        "baselines": f"{tabnet_note()}; FedAvg-MLP {b['rounds']} rounds x 1 local epoch, SplitNN-MLP "
                     f"{b['epochs']} epochs",
        "FC[DT] vertical": "every client holds the label column (label_owner=all)",
        "FC[PC]": FC_PC_NOTE,
        "preprocessing": "as the paper's appendix E.1 (target-encoded categoricals, median imputation, "
                         "standardized features); rows: see above (the paper used every row)",
        "FedTree": "not reproduced (no Python implementation); paper values listed from its Table 7",
    }) + "\n" + markdown_table(header, table) + "\n"
    matches = paper_matches(agg, datasets, grid)
    if matches:
        tally = {}
        for r in matches:
            n, k = tally.get(r[0], (0, 0))
            tally[r[0]] = (n + (r[-1] == "yes"), k + 1)
        md += ("\nFC[PC] against the paper (matches = ours >= paper - one std, the larger of the two stds):\n\n"
               + markdown_table(["dataset", "setting", "metric", "seeds", "ours", "paper", "matches"], matches)
               + "\n\nMatches: " + ", ".join(f"{ds} {n}/{k}" for ds, (n, k) in tally.items()) + "\n")
    from mpifc.atomic import atomic_write_text

    files.append(atomic_write_text(out / "table7.md", md))
    ran = {r["method"] for r in records if r.get("status") == OK}
    budget = [f"FedAvg K={b['rounds']} rounds"] * ("fedavg" in ran) + [f"SplitNN E={b['epochs']} epochs"] * ("splitnn" in ran)
    note = (f"seeds {','.join(str(s) for s in seeds)}; rows: {f'at most {rows}' if rows else 'all'}"
            + "".join(f"; {x}" for x in budget) + (" -- quick (smoke test)" if quick else ""))
    files.append(plot(out / "table7.png", agg, datasets, grid, note))
    return {"files": [str(f) for f in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg}


def paper_matches(agg: list[dict[str, Any]], datasets: Sequence[str], grid: Sequence[tuple[str, int]]
                  ) -> list[list[str]]:
    """FC[PC] cells beside the paper's: does ours match or beat it within one standard deviation?"""
    by = {(a["dataset"], a["setting"], a["clients"], a["method"]): a for a in agg}
    rows = []
    for ds in datasets:
        for st, k in grid:
            a = by.get((ds, st, k, "fc-pc"))
            if not a or a["status"] != OK:
                continue
            for metric in ("accuracy", "f1"):
                p = paper.table7_paper(st, "fc-pc", k, ds, metric)
                if not p:
                    continue
                mu, sd = a[f"{metric}_mean"], a[f"{metric}_std"]
                ok = mu >= p[0] - max(p[1], sd if sd == sd else 0.0)
                rows.append([ds, f"{st} {k}", metric, str(a["seeds"]), fmt(mu, sd), paper_fmt(p), "yes" if ok else "no"])
    return rows


def plot(path: Path, agg: list[dict[str, Any]], datasets: Sequence[str], grid: Sequence[tuple[str, int]],
         note: str = "") -> Path:
    """F1 per method and setting, one panel per dataset (the paper's Fig. 4), paper values as ticks.

    ``note`` (seeds, rows, budgets) heads the figure; each panel's legend sits right of its axes.
    """
    from matplotlib.figure import Figure

    by = {(a["dataset"], a["setting"], a["clients"], a["method"]): a for a in agg}
    fig = Figure(figsize=(max(6.0, 1.4 * len(grid) * 2), 3.2 * len(datasets)), layout="constrained")
    axes = fig.subplots(len(datasets), 1, squeeze=False)[:, 0]
    colors = {"fc-pc": "tab:blue", "fc-dt": "tab:orange", "fedavg": "tab:red", "splitnn": "tab:purple"}
    for ax, ds in zip(axes, datasets):
        x = 0.0
        ticks, names = [], []
        for st, k in grid:
            ms = METHODS[st]
            for j, m in enumerate(ms):
                a = by.get((ds, st, k, m))
                ok = a is not None and a["status"] == OK
                # a method not run here gets no bar and no legend entry (its paper tick stays)
                ax.bar(x + j * 0.25, a["f1_mean"] if ok else 0.0, 0.25, yerr=a["f1_std"] if ok else None,
                       color=colors[m], label=LABELS[m] if ok else None)
                p = paper.table7_paper(st, m, k, ds, "f1")
                if p:
                    ax.plot([x + j * 0.25 - 0.1, x + j * 0.25 + 0.1], [p[0], p[0]], color="black", lw=2)
            ticks.append(x + 0.25 * (len(ms) - 1) / 2)
            names.append(f"{st}\n{k} cl.")
            x += 0.25 * len(ms) + 0.4
        h = by.get((ds, "central", 1, "hgb"))
        if h and h["status"] == OK:
            ax.axhline(h["f1_mean"], color="tab:gray", ls="--", lw=1, label=LABELS["hgb"])
        ax.set_xticks(ticks)
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("macro F1")
        ax.set_title(f"{paper.PAPER_NAMES.get(ds, ds)} (black ticks: paper)", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="y", alpha=0.3)
    if note:
        fig.suptitle(f"Table 7, macro F1: {note}", fontsize=9)
    return save_figure(fig, path)


registry.register("table7", "Table 7: accuracy and F1 of FC[PC], FC[DT], FedAvg, SplitNN, HistGB", run)
