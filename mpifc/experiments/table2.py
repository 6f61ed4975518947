"""Table 2: bits per dimension against the number of clients, each client an EiNet.

Cells per (clients, seed): the images are split horizontally at random (``--split iid``) over
1, 2, 4, 8 and 16 clients; every client fits an EiNet (``--learner einet``, :func:`fit_einet`)
on its shard, and the one-pass FedPC is the mixture of the client EiNets, weighted by their row
counts (one MPI job per cell, ``mpifc train``). One client is the centralized
EiNet of the same size as each client's.

The total data are fixed, so with more clients each EiNet sees fewer rows while the mixture
holds more parameters (the paper's Table 6 grows the model the same way). Every client EiNet has
the same small size and runs the same number of full-batch EM iterations (``batch_size=0``), so
each is trained to near convergence on its shard whatever the number of clients: the single
EiNet is then limited by its capacity, not by training (online EM with a fixed number of epochs
gives a client with a 16th of the rows a 16th of the M-steps). Bits per dimension
are those of the pixels: ``-log p(x) / (D ln 2)`` over the ``D`` pixel columns of the test
images, the label column marginalised (NaN) in the gathered FedPC.

The paper's Table 2 reports CelebA, ImageNet32 and ImageNet64 (GPU-sized PD EiNets with up to
billions of parameters); those values are printed beside ours for the trend, not as a match.
MNIST is what this machine runs; ``data_prep`` also loads ImageNet32 (``imagenet32``) and a
folder of images (``image-folder``, e.g. CelebA) for a user who has them.

Client EiNets here use random binary trees (the shards carry the label column beside the
pixels, so a Poon-Domingos grid does not cover the client's scope) with discretised Gaussian
leaves over the 256 pixel levels (appendix E.2; ours sum to exactly one).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpifc.experiments import registry
from mpifc.experiments.jobs import ShardCache, ShardSpec, train_fc_cached
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.report import fmt, markdown_table, provenance, short_error
from mpifc.experiments.store import NOT_RUN, OK, Cell, ResultStore, aggregate, run_cells, save_figure, write_csv, \
    write_h5_table

CLIENTS = (1, 2, 4, 8, 16)
QUICK_CLIENTS = (1, 2, 4)
METRICS = ("bpd", "test_ll_pixels", "n_parameters", "train_seconds_critical_path", "job_seconds", "bytes_train",
           "rows_per_client")

# The full run: MNIST subsampled to FULL_ROWS rows (stratified, the dataset's own 6:1 train/test
# split kept), one small client EiNet size for every client count, trained by full-batch EM
# (``batch_size=0``) for ``epochs`` iterations: every client runs the same number of EM
# iterations to (near) convergence whatever its shard size, so the smallest shards are not
# under-trained (online EM with fixed epochs gives a 16th of the data a 16th of the M-steps).
FULL_ROWS = 10_000
FULL_EINET: dict[str, Any] = {"leaf": "discretized_gaussian", "num_sums": 4, "depth": 3, "repetitions": 2,
                              "epochs": 15, "batch_size": 0, "online_em_frequency": 1,
                              "online_em_stepsize": 1.0, "dtype": "float32"}
QUICK_ROWS = 700
QUICK_EINET: dict[str, Any] = {"leaf": "discretized_gaussian", "num_sums": 2, "depth": 2, "repetitions": 1,
                               "epochs": 1, "batch_size": 100, "online_em_frequency": 1,
                               "online_em_stepsize": 0.5, "dtype": "float32"}
# Seconds the server waits for a client's message: a client fits its whole EiNet before it
# reports (minutes on a loaded 2-core machine), so the runtime's 300 s default is too short.
TRAIN_DEADLINE = 3600.0
# A rank holding torch and its EiNet needs about this much memory; 16 clients run only when
# (clients + 1) ranks fit into the memory available.
RANK_BYTES = 600 * 2**20

# The paper's Table 2 (bpd, mean and std over 5 seeds); no one-client FedPC row in the paper.
PAPER_DATASETS = ("CelebA", "Imagenet32", "Imagenet64")
PAPER: dict[int, tuple[tuple[float, float], ...]] = {
    2: ((4.14, 0.07), (4.50, 0.03), (3.84, 0.03)),
    4: ((4.10, 0.07), (4.34, 0.04), (3.69, 0.04)),
    8: ((3.98, 0.06), (4.29, 0.03), (3.61, 0.04)),
    16: ((3.87, 0.04), (4.18, 0.04), (3.54, 0.06)),
}
PAPER_EINET = ((4.93, 0.09), (5.35, 0.06), (5.38, 0.06))


def available_memory() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes, or ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_reason(clients: int) -> str | None:
    """Why ``clients`` clients do not fit here (16 only "where memory allows"), else ``None``."""
    if clients < 16:
        return None
    avail = available_memory()
    need = (clients + 1) * RANK_BYTES
    if avail is not None and avail < need:
        return f"{clients + 1} ranks need about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"
    return None


def pixel_bpd(shards: Path, model: Path, batch: int = 2000) -> dict[str, Any]:
    """Bits per dimension of the test images under the gathered FedPC, the label marginalised.

    Returns:
        ``bpd`` (over the pixel columns), ``test_ll_pixels`` (nats per image), ``pixels``,
        ``n_test``.
    """
    from data_prep.shards import load_manifest, read_test
    from mpifc.federated.evaluate import log_likelihood
    from mpifc.federated.serialize import load_fc

    m = load_manifest(shards)
    fc = load_fc(str(model), load_models=True)
    test = read_test(shards)
    pixels = [j for j, f in enumerate(test.features) if f != m.target]
    lls = []
    for lo in range(0, test.x.shape[0], batch):
        cols = {f: test.x[lo:lo + batch, j].astype(np.float64) for j, f in enumerate(test.features)}
        if m.target is not None and m.target in cols:
            cols[m.target] = np.full(len(cols[m.target]), np.nan)
        lls.append(np.asarray(log_likelihood(fc, cols), dtype=np.float64))
    ll = float(np.concatenate(lls).mean())
    return {"bpd": -ll / (len(pixels) * math.log(2.0)), "test_ll_pixels": ll, "pixels": len(pixels),
            "n_test": int(test.x.shape[0])}


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        clients: Sequence[int] | None = None, ranks: Sequence[int] | None = None, max_rows: int | None = None,
        shards: str | Path | None = None, timeout: float | None = None, progress: bool = True,
        launcher: Launcher | None = None, einet: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    """Run (or resume) Table 2 into ``out_dir``; returns the summary (files, counts, markdown).

    ``clients`` (or the CLI's ``--ranks``, read as client counts here) overrides 1/2/4/8/16;
    ``einet`` overrides the client EiNet's hyperparameters (:func:`fit_einet` keywords).
    """
    out = Path(out_dir)
    store = ResultStore(out)
    ds_list = [d for d in (datasets or ("mnist",)) if d not in ("breast-cancer", "adult", "credit")] or ["mnist"]
    counts_list = list(clients or ranks or (QUICK_CLIENTS if quick else CLIENTS))
    rows = max_rows if max_rows is not None else (QUICK_ROWS if quick else FULL_ROWS)
    hp = {**(QUICK_EINET if quick else FULL_EINET), **(einet or {})}
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 4 * 3600))
    cells = [Cell(ds, "horizontal", k, "fedpc-einet", s) for ds in ds_list for s in seeds for k in counts_list]

    def work(cell: Cell) -> dict[str, Any]:
        why = memory_reason(cell.clients)
        if why:
            return {"status": NOT_RUN, "reason": f"memory: {why}"}
        d = cache.get(ShardSpec(cell.dataset, "horizontal", cell.clients, cell.seed, split="iid", max_rows=rows))
        tr = train_fc_cached(launch, d, cache.runs, learner="einet", glue="random", clusters=1, seed=cell.seed,
                             hp=hp, extra=["--deadline", str(TRAIN_DEADLINE)])
        ev = pixel_bpd(d, Path(tr["model_path"]))
        from data_prep.shards import load_manifest

        n_rows = [int(c["n_train"]) for c in load_manifest(d).clients]
        return {**ev, "n_parameters": tr.get("n_parameters"),
                "train_seconds_critical_path": tr.get("train_seconds_critical_path"),
                "train_seconds_total": tr.get("train_seconds_total"), "job_seconds": tr.get("job_seconds"),
                "bytes_train": tr.get("bytes_train"), "messages_train": tr.get("messages_train"),
                "ranks": tr.get("ranks"), "rows_per_client": float(np.mean(n_rows)), "rows_train": sum(n_rows),
                "hp": hp, "shards": str(d), "model": tr["model_path"], "ledger": tr.get("ledger_path"),
                "cached_run": tr.get("cached")}

    records, counts = run_cells(store, cells, work, "table2", progress)
    return write_outputs(out, records, counts, seeds, quick, rows, hp)


def write_outputs(out: Path, records: list[dict[str, Any]], counts: dict[str, int], seeds: Sequence[int],
                  quick: bool, rows: int | None, hp: dict[str, Any]) -> dict[str, Any]:
    agg = sorted(aggregate(records, METRICS), key=lambda a: (a["dataset"], a["clients"]))
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    header = ["clients", "dataset", "bpd (ours)", "params (ours)", "rows/client", "train s (crit. path)",
              *[f"{p} (paper)" for p in PAPER_DATASETS]]
    table = []
    for a in agg:
        ok = a["status"] == OK
        paper = PAPER.get(a["clients"])
        table.append([a["clients"], a["dataset"],
                      fmt(a["bpd_mean"], a["bpd_std"], 3) if ok else short_error(a),
                      f"{a['n_parameters_mean']:,.0f}" if ok and math.isfinite(a["n_parameters_mean"]) else "–",
                      f"{a['rows_per_client_mean']:,.0f}" if ok else "–",
                      fmt(a["train_seconds_critical_path_mean"], a["train_seconds_critical_path_std"], 1)
                      if ok else "–",
                      *([fmt(*p, 2) for p in paper] if paper else ["–"] * len(PAPER_DATASETS))])
    table.append(["EiNet (paper)", "–", "–", "–", "–", "–", *[fmt(*p, 2) for p in PAPER_EINET]])
    trend = bpd_trend(agg)
    md = provenance("Table 2: bits per dimension against the number of clients", seeds, quick, {
        "data": f"{', '.join(sorted({a['dataset'] for a in agg}))}, {rows or 'all'} rows (stratified, own "
                "train/test split kept), split horizontally at random (iid) over the clients",
        "FedPC": "one-pass mixture of the client EiNets, weights = client row counts (mpifc train --learner einet)",
        "client EiNet": ", ".join(f"{k}={v}" for k, v in hp.items()) + " (random binary trees; the same size "
                        "for every client count)",
        "EM": (f"full-batch EM, {hp.get('epochs')} iterations per client whatever its shard size"
               if not hp.get("batch_size") else
               f"online EM, {hp.get('epochs')} epochs of mini-batches of {hp.get('batch_size')} rows"),
        "bpd": "-log p(pixels) / (D ln 2) on the test images, label marginalised; lower is better",
        "paper columns": "the paper's Table 2 (other datasets, GPU-sized models): the trend, not a match",
        "trend here": trend,
    }) + "\n" + markdown_table(header, table) + "\n"
    from mpifc.atomic import atomic_write_text

    files.append(atomic_write_text(out / "table2.md", md))
    files.append(plot(out / "table2.png", agg))
    return {"files": [str(f) for f in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg, "trend": trend}


def bpd_trend(agg: Sequence[dict[str, Any]]) -> str:
    """One line: does bpd fall as clients grow (per dataset, over the finished cells)?"""
    parts = []
    for ds in sorted({a["dataset"] for a in agg}):
        pts = [(a["clients"], a["bpd_mean"]) for a in agg
               if a["dataset"] == ds and a["status"] == OK and math.isfinite(a["bpd_mean"])]
        pts.sort()
        if len(pts) < 2:
            parts.append(f"{ds}: fewer than two client counts finished")
            continue
        steps = [b[1] - a[1] for a, b in zip(pts, pts[1:])]
        word = ("improves (falls) at every step" if all(s < 0 for s in steps) else
                "gets worse (rises) at every step" if all(s > 0 for s in steps) else "is not monotone")
        parts.append(f"{ds}: bpd {word} from {pts[0][0]} to {pts[-1][0]} clients "
                     f"({pts[0][1]:.3f} -> {pts[-1][1]:.3f})")
    return "; ".join(parts) or "no finished cells"


def plot(path: Path, agg: Sequence[dict[str, Any]]) -> Path:
    """bpd against clients (log2 axis): ours with std bars, the paper's three datasets dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    for ds in sorted({a["dataset"] for a in agg}):
        pts = sorted((a["clients"], a["bpd_mean"], a["bpd_std"]) for a in agg
                     if a["dataset"] == ds and a["status"] == OK and math.isfinite(a["bpd_mean"]))
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                        capsize=3, label=f"{ds} (ours)")
    ks = sorted(PAPER)
    for i, name in enumerate(PAPER_DATASETS):
        ax.plot(ks, [PAPER[k][i][0] for k in ks], ls="--", marker="x", alpha=0.6, label=f"{name} (paper)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("clients")
    ax.set_ylabel("bits per dimension (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Table 2: FedPC of client EiNets, bpd vs clients", fontsize=10)
    return save_figure(fig, path)


registry.register("table2", "Table 2: bits per dimension vs number of clients (client EiNets, MNIST)", run)
