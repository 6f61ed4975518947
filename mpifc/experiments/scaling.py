"""``scaling``: FedPC training over a sweep of rank counts, and a projection to many clients.

* strong scaling: the same rows split over ``R - 1`` clients (horizontal, iid);
* weak scaling: a fixed number of training rows per client, so the data grow with ``R``;

per rank count: job wall seconds (launch included), critical-path and total training seconds,
training bytes and messages (ledger), test log-likelihood (gathered evaluation) and the largest
peak RSS of any rank (the ranks' module reports, :func:`mpifc.experiments.jobs.peak_rss`).

An alpha-beta model ``t(b) = alpha + b / beta`` is fitted to the ping-pong latencies of
``launch/bench/transport.py`` (its CSV, or a short run of it) and projects communication time
to 1,024 and 10,000 clients:

* training (one-pass, models gathered at the root): ``|C| (m alpha + B / beta)`` with m messages
  and B bytes per client (slopes of the weak-scaling sweep): the root's link is the bottleneck;
* one query batch (upward pass, a likelihood vector of ``batch x classes`` float64 per client):
  flat ``|C| t(b)``; tree with S intermediate servers ``ceil(|C| / S) t(b) + S t(b)`` (the S
  servers receive in parallel), at the given S and at the best ``S = sqrt(|C|)``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpifc.errors import UserError
from mpifc.experiments import registry
from mpifc.experiments.jobs import ShardCache, ShardSpec, capped_hp, evaluate_fc, train_fc_cached
from mpifc.experiments.launcher import REPO, Launcher
from mpifc.experiments.paper import TABLE4
from mpifc.experiments.report import markdown_table, provenance, short_error
from mpifc.experiments.store import OK, Cell, ResultStore, aggregate, run_cells, save_figure, write_csv, \
    write_h5_table

PROJECT_CLIENTS = (1024, 10_000)
QUERY_BATCH, QUERY_CLASSES = 10_000, 2
TEST_FRACTION = 0.2  # data_prep's default held-out share (first guess; corrected per data set)
METRICS = ("wall_seconds", "train_seconds_critical_path", "train_seconds_total", "bytes_train", "messages_train",
           "test_ll", "rows_per_client", "peak_rss_mb_max")


def default_dataset() -> str:
    from data_prep.files import default_data_root

    return "adult" if (Path(default_data_root()) / "adult").exists() else "breast-cancer"


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Fit ``t = alpha + b / beta`` by relative least squares; returns (alpha s, beta bytes/s)."""
    b = np.asarray(sizes, np.float64)
    t = np.asarray(seconds, np.float64)
    if b.size < 2:
        raise UserError("alpha-beta fit needs at least two message sizes")
    # Relative residuals: plain least squares would let the biggest messages decide alpha too.
    a = np.stack([np.ones_like(b), b], axis=1) / t[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha <= 0:
        # Noise can push the intercept below zero, and a latency cannot be negative.
        alpha = 0.5 * float(t.min())
    inv_beta = max(float(inv_beta), 1e-15)
    return float(alpha), 1.0 / inv_beta


def read_transport_csv(path: Path) -> tuple[list[float], list[float]]:
    """(bytes, one-way seconds of the mpifc transport) from the transport benchmark's CSV."""
    import csv

    sizes, secs = [], []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            sizes.append(float(r["bytes"]))
            secs.append(float(r["mpifc_latency_us"]) * 1e-6)
    return sizes, secs


def transport_samples(out: Path, launcher: Launcher, csv_path: str | Path | None, quick: bool) -> tuple[Path, str]:
    """The transport CSV to fit: the given one, one from an earlier run, else a short ping-pong."""
    if csv_path:
        p = Path(csv_path)
        if not p.exists():
            raise UserError(f"--transport-csv {p}: no such file")
        return p, "given"
    p = Path(out).resolve() / "transport.csv"  # absolute: the ping-pong job runs from the repository root
    if p.exists():
        return p, "earlier run"
    max_bytes = 1 << 18 if quick else 1 << 24
    launcher.run(2, [str(REPO / "launch" / "bench" / "transport.py"), "--reps", "3", "--max-bytes", str(max_bytes),
                     "--out", str(p)])
    return p, "measured now (ping-pong, 2 ranks)"


def project(alpha: float, beta: float, per_client_bytes: float, per_client_messages: float,
            clients: Sequence[int], servers: int) -> list[dict[str, Any]]:
    """Projected communication seconds per client count (see the module doc)."""
    q = QUERY_BATCH * QUERY_CLASSES * 8
    tq = alpha + q / beta
    rows = []
    for c in clients:
        s_best = max(1, int(round(math.sqrt(c))))
        rows.append({"clients": c,
                     "train_flat_s": c * (per_client_messages * alpha + per_client_bytes / beta),
                     "query_flat_s": c * tq,
                     "query_tree_s": (math.ceil(c / servers) + servers) * tq,
                     "query_tree_best_s": (math.ceil(c / s_best) + s_best) * tq,
                     "servers": servers, "best_servers": s_best})
    return rows


def _mb(v: Any) -> str:
    return "–" if v is None or not math.isfinite(float(v)) else f"{float(v):.0f}"


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        ranks: Sequence[int] | None = None, max_rows: int | None = None, shards: str | Path | None = None,
        timeout: float | None = None, progress: bool = True, launcher: Launcher | None = None,
        modes: Sequence[str] = ("strong", "weak"), rows_per_client: int | None = None, assign: str | None = None,
        servers: int | None = None, transport_csv: str | Path | None = None, **_: Any) -> dict[str, Any]:
    """Run (or resume) the sweep into ``out_dir``.

    Args:
        ranks: rank counts (default 2,4,8,16,32; quick 2,3).
        max_rows: strong scaling's rows (default: all quick, 20,000 otherwise).
        rows_per_client: weak scaling's training rows per client (default 40 quick, 1,000).
        assign, servers: ``tree`` runs with ``servers`` intermediate server ranks (clients =
            R - 1 - S); the projection uses ``servers`` (default 32) either way.
    """
    out = Path(out_dir)
    store = ResultStore(out)
    dataset = (list(datasets) if datasets else [default_dataset() if not quick else "breast-cancer"])[0]
    ranks = sorted(ranks or ((2, 3) if quick else (2, 4, 8, 16, 32)))
    bad = [m for m in modes if m not in ("strong", "weak")]
    if bad:
        raise UserError(f"scaling: unknown mode(s) {bad}; known: strong, weak")
    assign = assign or "flat"
    n_srv = int(servers or 0) if assign == "tree" else 0
    if assign == "tree" and n_srv < 1:
        raise UserError("scaling --assign tree needs --servers S >= 1")
    # quick: all of breast cancer (569 rows), so the 3-rank point is table7's quick run, reused
    strong_rows = max_rows if max_rows is not None else (None if quick else 20_000)
    rpc = rows_per_client or (40 if quick else 1000)
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 6 * 3600))
    cells = []
    for mode in modes:
        for r in ranks:
            k = r - 1 - n_srv
            if k < 1:
                raise UserError(f"--ranks: {r} ranks leave no client with {n_srv} intermediate servers")
            cells += [Cell(dataset, mode, k, f"fedpc-{assign}", s) for s in seeds]

    def work(cell: Cell) -> dict[str, Any]:
        rows = strong_rows if cell.setting == "strong" else int(math.ceil(rpc * cell.clients / (1 - TEST_FRACTION)))
        d = cache.get(ShardSpec(cell.dataset, "horizontal", cell.clients, cell.seed, max_rows=rows))
        if cell.setting == "weak":
            # A data set with its own test file (adult: a third) holds out more than the default
            # share: size the rows again from the held-out share these shards actually have.
            from data_prep.shards import load_manifest

            m = load_manifest(d)
            n_train, n_test = int(m.raw["n_train"]), int(m.raw["n_test"])
            want = int(math.ceil(rpc * cell.clients * (n_train + n_test) / max(1, n_train)))
            if n_train < rpc * cell.clients and want > rows:
                d = cache.get(ShardSpec(cell.dataset, "horizontal", cell.clients, cell.seed, max_rows=want))
        thr, mis, glue = TABLE4["horizontal"].get(cell.dataset, (0.4, 100, "random"))
        tr = train_fc_cached(launch, d, cache.runs, seed=cell.seed, glue=glue, assign=assign, servers=n_srv,
                             hp=capped_hp({"threshold": thr, "min_instances_slice": mis}, d))
        ev = evaluate_fc(d, Path(tr["model_path"]))
        from data_prep.shards import load_manifest

        n_train = sum(int(c["n_train"]) for c in load_manifest(d).clients)
        return {"ranks": tr["ranks"], "wall_seconds": tr["job_seconds"],
                "train_seconds_critical_path": tr["train_seconds_critical_path"],
                "train_seconds_total": tr["train_seconds_total"], "bytes_train": tr["bytes_train"],
                "messages_train": tr["messages_train"], "test_ll": ev["test_ll"], "rows": n_train,
                "rows_per_client": n_train / cell.clients, "cached_run": tr["cached"],
                # the largest peak RSS of any rank (MB; absent from runs cached before it was kept)
                "peak_rss_mb_max": tr.get("peak_rss_mb_max")}

    records, counts = run_cells(store, cells, work, "scaling", progress)
    agg = aggregate(records, METRICS)
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]

    csv_path, source = transport_samples(out, launch, transport_csv, quick)
    alpha, beta = fit_alpha_beta(*read_transport_csv(csv_path))
    ok = sorted((a for a in agg if a["status"] == OK), key=lambda a: (a["setting"], a["clients"]))
    fit_rows = [a for a in ok if a["setting"] == "weak"] or ok
    if len({a["clients"] for a in fit_rows}) >= 2:
        cl = np.array([a["clients"] for a in fit_rows], np.float64)
        per_b = float(np.polyfit(cl, [a["bytes_train_mean"] for a in fit_rows], 1)[0])
        per_m = float(np.polyfit(cl, [a["messages_train_mean"] for a in fit_rows], 1)[0])
    elif fit_rows:
        per_b = fit_rows[0]["bytes_train_mean"] / fit_rows[0]["clients"]
        per_m = fit_rows[0]["messages_train_mean"] / fit_rows[0]["clients"]
    else:
        per_b = per_m = math.nan
    proj = project(alpha, beta, max(per_b, 0.0), max(per_m, 0.0), PROJECT_CLIENTS, int(servers or 32))
    files += [write_csv(out / "projection.csv", proj), write_h5_table(out / "projection.h5", proj)]

    sweep = [[a["setting"], a["clients"] + 1 + n_srv, a["clients"], f"{a['rows_per_client_mean']:.0f}",
              f"{a['wall_seconds_mean']:.2f}", f"{a['train_seconds_critical_path_mean']:.3f}",
              f"{a['train_seconds_total_mean']:.3f}", f"{a['bytes_train_mean']:.0f}",
              f"{a['messages_train_mean']:.0f}", f"{a['test_ll_mean']:.3f}", _mb(a.get("peak_rss_mb_max_mean"))]
             if a["status"] == OK
             else [a["setting"], a["clients"] + 1 + n_srv, a["clients"], short_error(a), *["–"] * 7] for a in
             sorted(agg, key=lambda a: (a["setting"], a["clients"]))]
    md = provenance(f"Scaling sweep: FedPC one-pass training on {dataset}", seeds, quick, {
        "strong": f"{strong_rows or 'all'} rows in total (80% train) over R - 1 clients",
        "weak": f"{rpc} training rows per client",
        "assign": f"{assign}" + (f", {n_srv} intermediate servers" if n_srv else ""),
        "alpha-beta": f"alpha = {alpha * 1e6:.1f} us, beta = {beta / 1e6:.1f} MB/s from {csv_path} ({source})",
        "per client (weak slope)": f"{per_b:.0f} bytes, {per_m:.1f} messages of training traffic",
        "projection": "training gathers every client PC at the root under both ψ (tree's intermediate servers "
                      "are idle while training), so flat and tree differ only in the query batch",
    }) + "\n" + markdown_table(["mode", "ranks", "clients", "rows/client", "wall s", "critical path s", "total s",
                                "bytes", "messages", "test LL", "max rank RSS MB"], sweep)
    head = ["clients", "train (flat)", "query batch flat", f"query batch tree S={proj[0]['servers']}",
            "query batch tree S=sqrt(C)"]
    md += "\n\nProjected communication time (s):\n\n" + markdown_table(
        head, [[p["clients"], f"{p['train_flat_s']:.3g}", f"{p['query_flat_s']:.3g}",
               f"{p['query_tree_s']:.3g}", f"{p['query_tree_best_s']:.3g}"] for p in proj]) + "\n"
    from mpifc.atomic import atomic_write_text

    files.append(atomic_write_text(out / "scaling.md", md))
    note = (f"{dataset}, strong: {strong_rows or 'all'} rows in total, weak: {rpc} training rows per client, "
            f"assign {assign}, seeds {','.join(str(s) for s in seeds)}" + (" -- quick (smoke test)" if quick else ""))
    files.append(plot(out / "scaling.png", agg, alpha, beta, max(per_b, 0.0), max(per_m, 0.0), int(servers or 32),
                      n_srv, note))
    return {"files": [str(f) for f in files], "counts": counts, "markdown": md, "records": records, "aggregate": agg,
            "alpha": alpha, "beta": beta, "projection": proj}


def plot(path: Path, agg: list[dict[str, Any]], alpha: float, beta: float, per_b: float, per_m: float,
         servers: int, n_srv: int = 0, note: str = "") -> Path:
    """Four panels: seconds, traffic, test LL against ranks; projected communication time.

    Seconds are on a log scale: a job's wall time (start-up included) and its critical path differ
    by an order of magnitude. ``note`` (data, rows, seeds) is the title's second line; legends sit
    below their axes.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 10), layout="constrained")
    (a1, a2), (a3, a4) = fig.subplots(2, 2)
    a2b = a2.twinx()
    all_ranks: set[int] = set()
    for mode, ls in (("strong", "-"), ("weak", "--")):
        rows = sorted((a for a in agg if a["setting"] == mode and a["status"] == OK), key=lambda a: a["clients"])
        if not rows:
            continue
        r = [a["clients"] + 1 + n_srv for a in rows]
        all_ranks.update(r)
        a1.plot(r, [a["wall_seconds_mean"] for a in rows], ls, marker="o", label=f"{mode}: job wall")
        a1.plot(r, [a["train_seconds_critical_path_mean"] for a in rows], ls, marker="s",
                label=f"{mode}: critical path")
        a2.plot(r, [a["bytes_train_mean"] for a in rows], ls, marker="o", label=f"{mode}: bytes")
        a2b.plot(r, [a["messages_train_mean"] for a in rows], ls, marker="x", color="tab:gray",
                 label=f"{mode}: messages")
        a3.plot(r, [a["test_ll_mean"] for a in rows], ls, marker="o", label=mode)
    a1.set_ylabel("seconds (log)")
    a1.set_yscale("log")
    a1.set_title("training time", fontsize=9)
    a2.set_title("training traffic", fontsize=9)
    a3.set_title("test log-likelihood", fontsize=9)
    a2.set_ylabel("training bytes (o)")
    a2b.set_ylabel("messages (x)")
    a3.set_ylabel("test log-likelihood [nats]")
    for ax in (a1, a2, a3):
        ax.set_xlabel("ranks")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(all_ranks), [str(x) for x in sorted(all_ranks)], minor=False)
        ax.set_xticks([], minor=True)
        ax.grid(alpha=0.3, which="both" if ax is a1 else "major")
    a1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    h2, l2 = a2.get_legend_handles_labels()
    h2b, l2b = a2b.get_legend_handles_labels()
    a2.legend(h2 + h2b, l2 + l2b, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    a3.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    cs = np.unique(np.logspace(0, 4, 40).astype(int))
    p = project(alpha, beta, per_b, per_m, cs.tolist(), servers)
    a4.loglog(cs, [x["train_flat_s"] for x in p], label="training (flat)")
    a4.loglog(cs, [x["query_flat_s"] for x in p], label="query batch, flat")
    a4.loglog(cs, [x["query_tree_s"] for x in p], label=f"query batch, tree S={servers}")
    a4.loglog(cs, [x["query_tree_best_s"] for x in p], label="query batch, tree S=sqrt(C)")
    for c in PROJECT_CLIENTS:
        a4.axvline(c, color="black", lw=0.6, ls=":")
    a4.set_xlabel("clients")
    a4.set_ylabel("projected communication seconds")
    a4.set_title(f"alpha={alpha * 1e6:.1f} us, beta={beta / 1e6:.0f} MB/s", fontsize=9)
    a4.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    a4.grid(alpha=0.3, which="both")
    fig.suptitle("FedPC scaling sweep" + (f"\n{note}" if note else ""), fontsize=10)
    return save_figure(fig, path)


registry.register("scaling", "rank-count sweep (strong/weak) with an alpha-beta projection to 10,000 clients", run)
