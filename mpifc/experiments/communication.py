"""``commcost``: measured training bytes of FedPC one-pass, FedAvg and SplitNN beside the closed forms.

On the same shards: horizontal FedPC against FedAvg (K rounds), vertical FedPC against SplitNN
(E epochs). Each job writes its per-message ledger; the measured payload bytes are set beside
the closed forms of :mod:`mpifc.analysis.commcost` for the same |C|, M, K, E, F, S:

* FedAvg and SplitNN: the ledger's payload bytes of phase ``train`` against the exact form;
* FedPC: the payload of the kinds the paper counts (``fc.train.model``, ``fc.train.counts`` and,
  with ``cooccurrence`` glue, ``fc.train.cluster_ids``) against
  :func:`~mpifc.analysis.commcost.fedpc_sent_bytes`: the paper's ``|C| (M + 1)`` (horizontal)
  or ``K M |C| + P`` (vertical) with ``M`` the bytes of the arrays each client PC is made of
  (parameters and structure, :func:`~mpifc.analysis.commcost.model_array_bytes`, read from the
  trained model) and the counts as int64 rows. What the wire format adds around those arrays
  (``format B``: measured - formula), the runtime's per-message headers and every other
  message (declarations, plans, timings: ``control B``) are columns of their own. The paper's
  form with M = parameter count x 4 bytes is listed too; the gap is the structure arrays.

The figure is appendix D's Fig. 5 redrawn from the formulas, with our measured runs added; the
markdown says where the "100x below FedAvg, 1000x below SplitNN" claims hold.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from mpifc.experiments import registry
from mpifc.experiments.jobs import ShardCache, ShardSpec, capped_hp, run_fedavg, run_splitnn, train_fc_cached
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.paper import TABLE4, is_image_set
from mpifc.experiments.report import fmt, markdown_table, provenance, short_error
from mpifc.experiments.store import OK, Cell, ResultStore, aggregate, run_cells, write_csv, write_h5_table
from mpifc.experiments.table7 import budgets

FEDPC_KINDS = ("fc.train.model", "fc.train.counts")
CLUSTERS, PRODUCTS = 2, 4
DEFAULTS_METHOD = "fedpc-defaults"
"""Cells of ``mpifc train`` on default flags (no setting but the seed): every byte it sends."""


def default_grid(quick: bool) -> list[tuple[str, int]]:
    """(setting, clients) of the default-flag cells: every setting (``--quick``: the two that
    table7's quick FC[PC] runs share with it, so they cost no job)."""
    return [("horizontal", 2), ("vertical", 2)] if quick else [("central", 1), ("horizontal", 5), ("vertical", 2),
                                                               ("hybrid", 2)]


def fedpc_default_bytes(launch: Launcher, shards: Path, runs: Path, seed: int) -> dict[str, Any]:
    """``mpifc train SHARDS --seed S`` (default flags): its training bytes (every message, headers
    included, as the summary counts them), per phase from the ledger, and its test accuracy and
    macro F1 (gathered evaluation)."""
    from mpifc.experiments.jobs import evaluate_fc

    tr = train_fc_cached(launch, shards, runs, seed=seed, preset="adaptive")
    phases: dict[str, int] = {}
    with open(tr["ledger_path"], newline="") as f:
        for r in csv.DictReader(f):
            if r["phase"] not in ("teardown",) and r["kind"] != "fc.train.done":
                phases[r["phase"]] = phases.get(r["phase"], 0) + int(r["total_bytes"])
    ev = evaluate_fc(shards, Path(tr["model_path"]))
    return {"measured_total_bytes": int(tr["bytes_train"]), "measured_bytes": int(tr["bytes_train"]),
            "em_bytes": phases.get("em", 0), "gather_bytes": phases.get("gather", 0),
            "em_iterations": len(tr.get("em_train_ll") or []), "glue": tr.get("glue"),
            "accuracy": ev.get("accuracy"), "f1_macro": ev.get("f1"), "test_ll": ev.get("test_ll"),
            "ledger": tr["ledger_path"], "cached_run": tr["cached"]}


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


def fedpc_bytes(shards: Path, model: Path, ledger: Path, glue: str, setting: str, n_clients: int,
                n_parameters: int) -> dict[str, Any]:
    """A FedPC training run's ledger bytes against the closed form with M = the PCs' array bytes.

    ``M_i`` is read from the trained model (the server wrote the PCs it received), so the
    formula knows nothing of the wire format: the agreement checks that the PCs travel as their
    arrays and little else.
    """
    from mpifc.analysis import commcost as cc
    from mpifc.federated.serialize import load_fc

    kinds = FEDPC_KINDS + (("fc.train.cluster_ids",) if glue == "cooccurrence" else ())
    counted = ledger_bytes(ledger, kinds)
    every = ledger_bytes(ledger)
    from mpifc.federated.wire_format import model_to_bytes

    fc = load_fc(model)
    sizes = [cc.model_array_bytes(n.leaf.model) for n in fc.leaves]
    # what the wire format puts around each PC's arrays (its header), from the blobs themselves
    wire = sum(int(model_to_bytes(n.leaf.model).nbytes) for n in fc.leaves) - sum(sizes)
    id_rows, id_size = 0, None
    if glue == "cooccurrence" and setting != "horizontal":
        from data_prep.shards import load_manifest
        from mpifc.federated.one_pass import cluster_id_dtype

        id_rows = sum(int(c["n_train"]) for c in load_manifest(shards).clients)
        id_size = cluster_id_dtype(int(fc.meta["n_clusters"])).itemsize  # the plan's K, as trained
    formula = cc.fedpc_sent_bytes(sizes, cluster_id_rows=id_rows, cluster_id_itemsize=id_size)
    if setting == "horizontal":
        paper = cc.fedpc_horizontal_bytes(n_clients, max(1, n_parameters // n_clients))
    else:
        paper = cc.fedpc_vertical_bytes(n_clients, max(1, n_parameters // (n_clients * CLUSTERS)), CLUSTERS,
                                        PRODUCTS)
    return {"measured_bytes": counted["payload_bytes"], "formula_bytes": formula,
            "ratio": counted["payload_bytes"] / formula, "format_bytes": counted["payload_bytes"] - formula,
            "wire_header_bytes": wire, "header_bytes": counted["total_bytes"] - counted["payload_bytes"],
            "control_bytes": every["total_bytes"] - counted["total_bytes"], "measured_total_bytes": every["total_bytes"],
            "paper_form_bytes": paper, "n_parameters": n_parameters, "n_pcs": len(sizes),
            "model_array_bytes": sum(sizes), "bytes_per_parameter": sum(sizes) / max(1, n_parameters),
            "messages": counted["messages"], "ledger": str(ledger)}


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        max_rows: int | None = None, shards: str | Path | None = None, timeout: float | None = None,
        progress: bool = True, launcher: Launcher | None = None, **_: Any) -> dict[str, Any]:
    """Run (or resume) the communication-cost study into ``out_dir``."""
    from mpifc.analysis import commcost as cc

    out = Path(out_dir)
    store = ResultStore(out)
    datasets = [d for d in (datasets or ("breast-cancer",)) if not is_image_set(d)]
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
            cells += [Cell(ds, s, c, DEFAULTS_METHOD, seed) for s, c in default_grid(quick)]

    def work(cell: Cell) -> dict[str, Any]:
        # The baselines are the same runs as table7's (same shards and budgets): with a shared
        # shard cache they are reused, not rerun. FedPC is not: table7's FC[PC] runs mpifc
        # train's adaptive defaults, this study keeps Table 4's fixed settings and glue.
        d = cache.get(ShardSpec(cell.dataset, cell.setting, cell.clients, cell.seed, max_rows=rows))
        if cell.method == DEFAULTS_METHOD:
            return fedpc_default_bytes(launch, d, cache.runs, cell.seed)
        if cell.method == "fedpc":
            thr, mis, glue = TABLE4[cell.setting].get(cell.dataset, (0.4, 100, "combinatorial"))
            hp = capped_hp({"threshold": thr, "min_instances_slice": mis}, d)
            tr = train_fc_cached(launch, d, cache.runs, glue=glue, clusters=CLUSTERS, products=PRODUCTS,
                                 seed=cell.seed, hp=hp)
            return {**fedpc_bytes(d, Path(tr["model_path"]), Path(tr["ledger_path"]), glue, cell.setting,
                                  cell.clients, int(tr["n_parameters"])), "cached_run": tr["cached"]}
        if cell.method == "fedavg":
            res = run_fedavg(launch, d, cache.runs, cell.seed, rounds=rounds)
            formula = cc.fedavg_bytes(cell.clients, res["n_parameters"], rounds, itemsize=res["itemsize"])
            extra = {"rounds": rounds, "n_parameters": res["n_parameters"]}
        else:
            res = run_splitnn(launch, d, cache.runs, cell.seed, epochs=epochs, cut=cut)
            formula = cc.splitnn_bytes(cell.clients, cut, res["n_train"], epochs,
                                       itemsize=res.get("itemsize", cc.FLOAT32), n_classes=res["n_classes"])
            extra = {"epochs": epochs, "cut": cut, "samples": res["n_train"]}
        every = ledger_bytes(Path(res["ledger_path"]))
        return {"measured_bytes": res["payload_bytes_train"], "formula_bytes": formula,
                "ratio": res["payload_bytes_train"] / formula, "format_bytes": res["payload_bytes_train"] - formula,
                "header_bytes": res["bytes_train"] - res["payload_bytes_train"],
                "control_bytes": every["total_bytes"] - res["bytes_train"], "measured_total_bytes": every["total_bytes"],
                "messages": res["messages_train"], "accuracy": res.get("accuracy"), "ledger": res["ledger_path"],
                "cached_run": res["cached"], **extra}

    records, counts = run_cells(store, cells, work, "commcost", progress)
    return write_outputs(out, records, counts, seeds, quick, datasets, rounds, epochs, cut)


AGG_METRICS = ("measured_bytes", "formula_bytes", "ratio", "format_bytes", "wire_header_bytes", "header_bytes",
               "control_bytes",
               "measured_total_bytes", "paper_form_bytes", "bytes_per_parameter", "em_bytes", "accuracy", "f1_macro")


def _measured_note(records: list[dict[str, Any]], quick: bool) -> str:
    """The plot's second title line: what the measured points ran with, read from the cells."""
    def values(method: str, key: str) -> str:
        vs = sorted({r[key] for r in records if r.get("method") == method and r.get(key) is not None})
        return "/".join(str(v) for v in vs) or "?"

    clients = "/".join(str(c) for c in sorted({r["clients"] for r in records if r.get("clients")})) or "?"
    note = (f"measured (ours, x): |C|={clients}, FedAvg K={values('fedavg', 'rounds')} rounds, "
            f"SplitNN E={values('splitnn', 'epochs')} epochs F={values('splitnn', 'cut')}")
    return note + (" -- quick (smoke test)" if quick else "")


def defaults_rows(agg: list[dict[str, Any]], datasets: Sequence[str], epochs: int) -> list[list[Any]]:
    """One row per default-flag cell: our bytes beside FedAvg's and SplitNN's (``epochs``
    epochs) on the dataset."""
    by = {(a["dataset"], a["setting"], a["method"]): a for a in agg}
    out = []
    for ds in datasets:
        fedavg, split = by.get((ds, "horizontal", "fedavg")), by.get((ds, "vertical", "splitnn"))
        okb = lambda a: a is not None and a["status"] == OK  # noqa: E731
        for a in (a for a in agg if a["dataset"] == ds and a["method"] == DEFAULTS_METHOD):
            if a["status"] != OK:
                out.append([ds, a["setting"], a["clients"], short_error(a)] + ["–"] * 7)
                continue
            ours = a["measured_total_bytes_mean"]
            acc = "–" if a.get("accuracy_mean") is None else f"{a['accuracy_mean']:.3f} / {a['f1_macro_mean']:.3f}"
            s_b = split["measured_total_bytes_mean"] if okb(split) else None
            out.append([ds, a["setting"], a["clients"], f"{ours:.0f}", _n(a, "em_bytes"), acc,
                        _n(fedavg, "measured_total_bytes") if okb(fedavg) else "–",
                        f"{s_b:.0f}" if s_b else "–",
                        f"{split['accuracy_mean']:.3f}" if okb(split) and split.get("accuracy_mean") is not None else "–",
                        f"{s_b / ours:.1f}x" if s_b else "–",
                        f"{s_b / epochs / ours:.2f}x" if s_b and epochs else "–"])
    return out


def _n(a: dict[str, Any], key: str) -> str:
    v = a.get(f"{key}_mean")
    return "–" if v is None or v != v else f"{v:.0f}"


def write_outputs(out: Path, records: list[dict[str, Any]], counts: dict[str, int], seeds: Sequence[int],
                  quick: bool, datasets: Sequence[str], rounds: int, epochs: int, cut: int) -> dict[str, Any]:
    """cells/summary CSV+HDF5, ``commcost.md`` (measured vs formula, where the claims hold) and the figure."""
    import dataclasses

    from mpifc.analysis import commcost as cc

    agg = aggregate(records, AGG_METRICS)
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    by = {(a["dataset"], a["setting"], a["method"]): a for a in agg}
    table, points = [], []
    for a in agg:
        if a["method"] == DEFAULTS_METHOD:
            continue
        ok = a["status"] == OK
        table.append([a["dataset"], a["setting"], a["clients"], a["method"],
                      _n(a, "measured_bytes") if ok else short_error(a), _n(a, "formula_bytes"),
                      fmt(a["ratio_mean"], a["ratio_std"], 3) if ok else "–", _n(a, "format_bytes"),
                      _n(a, "wire_header_bytes"), _n(a, "header_bytes"), _n(a, "control_bytes"), _n(a, "measured_total_bytes"),
                      _n(a, "paper_form_bytes")])
        if ok:
            points.append(cc.MeasuredPoint(a["setting"], a["method"], f"{a['dataset']}\n(ours)",
                                           int(a["measured_bytes_mean"]), int(a["formula_bytes_mean"])))
    ratios = []
    bpp = []
    for ds in datasets:
        h, f = by.get((ds, "horizontal", "fedpc")), by.get((ds, "horizontal", "fedavg"))
        v, s = by.get((ds, "vertical", "fedpc")), by.get((ds, "vertical", "splitnn"))
        if h and f and h["status"] == OK and f["status"] == OK:
            r = f["measured_bytes_mean"] / h["measured_bytes_mean"]
            ratios.append([f"{ds} (measured, K={rounds} rounds)", "FedAvg / FedPC (horizontal)", f"{r:.1f}x",
                           "yes" if r >= 100 else "no"])
        if v and s and v["status"] == OK and s["status"] == OK:
            r = s["measured_bytes_mean"] / v["measured_bytes_mean"]
            ratios.append([f"{ds} (measured, E={epochs} epochs, F={cut})", "SplitNN / FedPC (vertical)",
                           f"{r:.1f}x", "yes" if r >= 1000 else "no"])
        bpp += [x["bytes_per_parameter_mean"] for x in (h, v)
                if x and x["status"] == OK and x.get("bytes_per_parameter_mean") == x.get("bytes_per_parameter_mean")]
    readings = [("M scalars of 4 B, M = one client PC", cc.PAPER),
                ("M = the whole vertical FedPC", dataclasses.replace(cc.PAPER, m_is_total=True))]
    if bpp:
        b = float(max(bpp))
        readings.append((f"FedPC at {b:.1f} B/parameter (measured here: structure arrays included)",
                         dataclasses.replace(cc.PAPER, fedpc_bytes_per_param=b)))
    claims = []
    for name, sc in readings:
        for c in cc.claim_rows(sc):
            claims.append([name, f"S={c['samples']:.0e} M={c['params']:.0e}", f"{c['fedavg_over_fedpc']:.3g}x",
                           "yes" if c["fedavg_claim"] else "no", f"{c['splitnn_over_fedpc']:.3g}x",
                           "yes" if c["splitnn_claim"] else "no", f"{c['splitnn_claim_from_samples']:.2g}"])
    sc = cc.PAPER
    md = provenance("Communication cost of training: measured against closed forms", seeds, quick, {
        "runs": f"FedPC with Table 4's settings and glue (K={CLUSTERS}, P={PRODUCTS}); FedAvg K={rounds} rounds and "
                f"SplitNN E={epochs} epochs F={cut}, the same runs as table7's",
        "measured": "ledger payload bytes (FedPC: fc.train.model + fc.train.counts [+ cluster_ids]; baselines: "
                    "phase train)",
        "formula": "mpifc.analysis.commcost; FedPC: sum of the client PCs' array bytes (parameters + structure, "
                   "read from the trained model) + 24 B of counts per PC; baselines: float32, down and up",
        "format B": "measured - formula: what the wire format adds around the arrays; 'wire header B' is that "
                    "overhead computed from the blobs, summed over the PCs (mpifc.federated.serialize wire "
                    "version 2: magic, version, header length and binary header per PC)",
        "headers B / control B": "runtime per-message headers of the counted messages / every other message",
        "paper form": "|C|(M+1) or KM|C|+P with M = parameter count, 4 B each (no structure)",
    }) + "\n" + markdown_table(["dataset", "setting", "clients", "method", "measured payload B", "formula B",
                                "measured / formula", "format B", "wire header B", "headers B", "control B", "total B",
                                "paper form B"], table)
    md += "\n\nMeasured ratios:\n\n" + markdown_table(["where", "ratio", "value", "claim holds"], ratios)
    md += ("\n\nDefault flags (``mpifc train SHARDS --seed S``), every byte of training (headers and control "
           "included) beside the baselines' training bytes on the same dataset and rows (FedAvg: the horizontal "
           f"split, K={rounds} rounds; SplitNN: the vertical split, E={epochs} epochs, F={cut}; one SplitNN epoch "
           "is its bytes / E):\n\n")
    md += markdown_table(["dataset", "setting", "clients", "ours B", "of which EM B", "ours acc / F1", "FedAvg B",
                          "SplitNN B", "SplitNN acc", "SplitNN B / ours", "SplitNN epoch B / ours"],
                         defaults_rows(agg, datasets, epochs))
    md += (f"\n\nThe claims at paper-like sizes (closed forms; |C|={sc.n_clients}, FedAvg K={sc.rounds} rounds, "
           f"SplitNN E={sc.epochs} F={sc.cut}, FedPC K={sc.clusters} clusters, P={sc.products}, down+up):\n\n")
    md += markdown_table(["reading", "size", "FedAvg/FedPC", ">= 100x", "SplitNN/FedPC", ">= 1000x",
                          "S where 1000x starts"], claims) + "\n"
    from mpifc.atomic import atomic_write_text

    files.append(atomic_write_text(out / "commcost.md", md))
    files.append(cc.plot_appendix_d(out / "commcost.png", measured=points,
                                    measured_note=_measured_note(records, quick)))
    return {"files": [str(p) for p in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg}


registry.register("commcost", "measured training bytes of FedPC, FedAvg, SplitNN beside the closed forms", run)
