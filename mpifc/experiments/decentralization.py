"""Experiment driver for issue 8: the cost of decentralisation in vertical FL.

Parts are registered in :data:`PARTS`; :func:`run` runs the requested ones into one output folder.

* ``exact`` (:func:`run_part1`): the paper's Examples V-A and V-B computed exactly by
  :mod:`mpifc.analysis.decentralization`. Writes the Fig. 2 and Fig. 3 redraws (PNG), their
  curve values and Table I (CSV). All values are in nats.
* ``empirical`` (:func:`run_empirical`): the four settings measured on real vertical data with
  FedPCs (CL) and per-agent LearnSPN PCs (DL), by :mod:`mpifc.analysis.decentralization_empirical`.
  Writes one CSV row per (dataset, clients, setting), the empirical Table I costs (CSV), a markdown
  report and a bar chart (PNG). Cross-entropies in nats, sizes in bytes.
"""
from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mpifc.analysis import decentralization as dz
from mpifc.analysis import decentralization_empirical as dze
from mpifc.atomic import atomic_write_bytes
from mpifc.errors import UserError

FIG2_PNG = "fig2_two_agents.png"
FIG2_CSV = "fig2_two_agents.csv"
FIG3_PNG = "fig3_three_agents_private.png"
FIG3_CSV = "fig3_three_agents_private.csv"
TABLE1_CSV = "table1_costs.csv"

FIG3_R = 0.5  # the paper's Fig. 3 setting
TABLE1_R = 0.5  # independent features: where the costs of Table I are largest in Example V-A

_STYLE = {"CL/CI": ("tab:blue", "-"), "CL/DI": ("tab:orange", "--"),
          "DL/CI": ("tab:green", "-."), "DL/DI": ("tab:red", ":")}


# ---------------------------------------------------------------------------------------------
# Atomic writers: a reader never sees a half-written file.
# ---------------------------------------------------------------------------------------------

def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Write ``rows`` under ``header`` atomically; floats with 17 significant digits."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in rows:
        w.writerow([f"{v:.17g}" if isinstance(v, float) else v for v in row])
    atomic_write_bytes(path, buf.getvalue().encode())


def _save_figure(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


# ---------------------------------------------------------------------------------------------
# Curves.
# ---------------------------------------------------------------------------------------------

def fig2_curves(n_points: int) -> list[dict[str, float]]:
    """Example V-A losses at ``n_points`` values of ``I(X1; X2)`` evenly spaced in ``[0, log 2]``.

    Only ``r >= 1/2`` is swept: ``r`` and ``1 - r`` give the same ``I(X1; X2)`` and, since the two
    Beta priors mirror each other, the same losses (tested).
    """
    rows = []
    for mi in np.linspace(0.0, dz.LOG2, n_points):
        r = dz.r_for_mutual_info(float(mi))
        losses, _ = dz.example_va(r)
        rows.append({"r": r, "mi_nats": dz.mutual_info_two_features(r), **losses.as_dict()})
    return rows


def fig3_curves(n_points: int, r: float = FIG3_R) -> list[dict[str, float]]:
    """Example V-B eps-private losses at ``n_points`` eps evenly spaced in ``[0, max leak]``."""
    rows = []
    for eps in np.linspace(0.0, dz.max_leak(r), n_points):
        point = dz.example_vb(r, float(eps))
        rows.append({"eps_nats": point.eps, "s": point.s, "max_leak_nats": max(point.leaks),
                     **point.losses.as_dict()})
    return rows


def table1_rows(r: float = TABLE1_R) -> list[dict[str, Any]]:
    """Table I for Example V-A at ``r``: each cost as a loss difference and as its CMI (agent 1)."""
    losses, joint = dz.example_va(r)
    costs = dz.table_i_costs(losses)
    cmi = dz.table_i_cmi(joint, ("x1", "x2"), k=0)
    return [{"a": a, "b": b, "cost_nats": costs[(a, b)], "cmi_nats": cmi[(a, b)]}
            for (a, b) in dz.TABLE_I]


def _plot(rows: list[dict[str, float]], x_key: str, quantity: str, title: str, path: Path) -> None:
    # A bare Figure renders with Agg and touches no pyplot/backend global state.
    from matplotlib.figure import Figure

    x = [row[x_key] for row in rows]
    fig = Figure(figsize=(5.2, 3.8))
    ax = fig.subplots()
    for s in dz.SETTINGS:
        color, ls = _STYLE[s]
        ax.plot(x, [row[s] for row in rows], color=color, ls=ls, marker="o", ms=3, label=s)
    ax.set_xlabel(f"{quantity} [nats]")
    ax.set_ylabel("predictive loss R [nats]")
    ax.set_title(title, fontsize=10, pad=10)
    # The paper's axes appear to be in bits; a secondary axis makes the two comparable.
    top = ax.secondary_xaxis("top", functions=(lambda v: v / dz.LOG2, lambda v: v * dz.LOG2))
    top.set_xlabel(f"{quantity} [bits]", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# Parts.
# ---------------------------------------------------------------------------------------------

def run_part1(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """Examples V-A and V-B exactly: Fig. 2 and Fig. 3 redraws (PNG), curves and Table I (CSV).

    Args:
        out_dir: output folder, created if missing.
        quick: fewer curve points (5 instead of 21), for the test suite.

    Returns:
        Summary numbers (nats) and the paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_points = 5 if quick else 21

    fig2 = fig2_curves(n_points)
    write_csv(out / FIG2_CSV, ["r", "mi_nats", *dz.SETTINGS],
              [[row[k] for k in ("r", "mi_nats", *dz.SETTINGS)] for row in fig2])
    _plot(fig2, "mi_nats", "I(X1; X2)",
          "Fig. 2 redraw: two agents, no privacy (N = 3)", out / FIG2_PNG)

    fig3 = fig3_curves(n_points)
    keys3 = ("eps_nats", "s", "max_leak_nats", *dz.SETTINGS)
    write_csv(out / FIG3_CSV, list(keys3), [[row[k] for k in keys3] for row in fig3])
    _plot(fig3, "eps_nats", "privacy level eps",
          f"Fig. 3 redraw: three agents, eps-private (r = {FIG3_R}, N = 3)", out / FIG3_PNG)

    table = table1_rows()
    write_csv(out / TABLE1_CSV, ["a", "b", "cost_nats", "cmi_nats"],
              [[row[k] for k in ("a", "b", "cost_nats", "cmi_nats")] for row in table])

    return {
        "fig2_independent": {s: fig2[0][s] for s in dz.SETTINGS},
        "fig2_identical": {s: fig2[-1][s] for s in dz.SETTINGS},
        "fig3_eps0": {s: fig3[0][s] for s in dz.SETTINGS},
        "fig3_eps_max": {s: fig3[-1][s] for s in dz.SETTINGS},
        "fig3_eps_max_nats": fig3[-1]["eps_nats"],
        "table1": {f"{row['a']}-{row['b']}": row["cost_nats"] for row in table},
        "files": [str(out / name) for name in (FIG2_PNG, FIG2_CSV, FIG3_PNG, FIG3_CSV, TABLE1_CSV)],
    }


# ---------------------------------------------------------------------------------------------
# Part 2: the four settings on real data.
# ---------------------------------------------------------------------------------------------

EMPIRICAL_CSV = "empirical_settings.csv"
EMPIRICAL_COSTS_CSV = "empirical_table1_costs.csv"
EMPIRICAL_MD = "empirical.md"
EMPIRICAL_PNG = "empirical_settings.png"
EMPIRICAL_CLUSTERS_CSV = "empirical_cl_clusters.csv"

EMPIRICAL_HEADER = ("dataset", "clients", "setting", "cross_entropy_nats", "accuracy", "train_bytes",
                    "infer_bytes", "infer_bytes_closed_form", "worst_agent", "per_agent_nats",
                    "n_train", "n_test")


@dataclass(frozen=True)
class EmpiricalCase:
    """One (dataset, number of clients) cell; ``max_rows`` caps the table before the split."""

    dataset: str
    clients: int
    max_rows: int | None


def empirical_cases(quick: bool) -> list[EmpiricalCase]:
    """Breast cancer (embedded), Income (adult) and credit, with 2 and 3 clients; quick: one case.

    Adult and credit are capped so that the whole run stays within minutes on two shared cores
    (LearnSPN is the cost; test rows are 20 % of the capped table).
    """
    if quick:
        return [EmpiricalCase("breast-cancer", 2, 300)]
    return [EmpiricalCase(d, k, m) for d, m in (("breast-cancer", None), ("adult", 3000), ("credit", 3000))
            for k in (2, 3)]


def cluster_grid(quick: bool) -> tuple[int, ...]:
    """FedPC cluster counts K whose CL losses are reported besides the main one (sensitivity)."""
    return (1,) if quick else (1, 2, 4, 8)


def empirical_case_data(case: EmpiricalCase, seed: int = 0
                        ) -> tuple[list[dze.ClientBlock], dze.Schema, np.ndarray]:
    """The vertical split with the label on every client, as agent blocks (data stay in memory)."""
    import data_prep

    prepared = data_prep.prepare(dataset=case.dataset, setting="vertical", clients=case.clients, seed=seed,
                                 label_owner="all", max_rows=case.max_rows)
    meta = prepared.feature_meta()
    target = prepared.table.target
    if target is None:
        raise UserError(f"{case.dataset}: no target column; the four settings need labels")
    schema = dze.Schema(target, int(meta[target]["n_categories"]),
                        {f: m["meta_type"] for f, m in meta.items()},
                        {f: int(m["n_categories"] or 0) for f, m in meta.items()},
                        tuple(prepared.feature_order))
    blocks = []
    for i in range(prepared.n_clients):
        sh = prepared.client_shard(i)
        blocks.append(dze.ClientBlock(sh.index, tuple(sh.features), sh.x_train, sh.ids_train, sh.x_test))
    y_train = blocks[0].x_train[:, blocks[0].features.index(target)].astype(np.int64)
    return blocks, schema, y_train


def _fmt(v: float) -> str:
    return f"{v:.4f}"


def empirical_markdown(cases: list[tuple[EmpiricalCase, dict[str, dze.SettingResult], dict[str, Any]]],
                       cfg: dze.FedPCConfig) -> str:
    """Per case: the four settings, then the costs shaped like Table I, then eq. 14 departures."""
    lines = ["# Cost of decentralisation on real data (issue 8, part 2)", "",
             "Test cross-entropy in nats (DI settings: worst agent), bytes as float64 payloads. "
             f"CL = one-pass FedPC (label from client 0, {cfg.glue} glue, "
             f"{cfg.n_clusters} clusters per client, LearnSPN {cfg.learnspn}); DL = one LearnSPN per agent "
             "on (X_k, Y), combined under DL/CI by a product of experts.", ""]
    for case, res, extras in cases:
        lines += [f"## {case.dataset}, {case.clients} clients "
                  f"({extras['n_train']} train / {extras['n_test']} test rows)", "",
                  "| setting | cross-entropy | accuracy | train bytes | inference bytes | worst agent |",
                  "|---|---|---|---|---|---|"]
        for s in dz.SETTINGS:
            r = res[s]
            lines.append(f"| {s} | {_fmt(r.cross_entropy)} | {r.accuracy:.3f} | {r.train_bytes} | "
                         f"{r.infer_bytes} | {'' if r.worst_agent is None else r.worst_agent} |")
        lines.append(f"| (label prior only) | {_fmt(extras['label_prior_ce'])} | | | | |")
        costs = dze.empirical_costs(res)
        lines += ["", "Costs C^{a-b} = R^a - R^b (nats; a = column, b = row, as in Table I):", "",
                  "| b \\ a | " + " | ".join(dz.SETTINGS) + " |", "|---" * (len(dz.SETTINGS) + 1) + "|"]
        for b in dz.SETTINGS:
            cells = [_fmt(costs[(a, b)]) if (a, b) in costs else "-" for a in dz.SETTINGS]
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        sens = extras.get("cl_by_clusters") or {}
        if sens:
            lines += ["", "CL losses by FedPC clusters per client (sensitivity): " + "; ".join(
                f"{k}: CL/CI {_fmt(ci)}, CL/DI {_fmt(max(di))}" for k, (ci, di) in sens.items()) + "."]
        zero = extras.get("zero_likelihood_rows") or {}
        if any(zero.values()):
            lines += ["", "WARNING: test rows with zero likelihood for every class "
                      f"(posterior undefined): {zero}."]
        dep = dze.eq14_departures(res)
        lines += ["", "eq. 14: " + ("holds." if not dep else "departs: " + "; ".join(dep) + "."), ""]
    lines += [
        "Why the measured ordering can depart from eq. 14: eq. 14 compares Bayes-optimal predictors "
        "(posteriors of one true model given more or less data). Here every setting uses a different "
        "*learned* model: the FedPC ties clients only through Assumption 2's cluster latent (k-means "
        "clusters and their co-occurrence), whereas a DL agent fits LearnSPN on (X_k, Y) directly, so a "
        "DL model can beat the CL model (misspecification); the product of experts assumes the "
        "agents' features independent given Y, which over-counts shared evidence (CI can lose to DI); and "
        "every loss is a finite-test-set estimate (sampling noise of a few hundredths of a nat on small "
        "test sets).", ""]
    return "\n".join(lines)


def _plot_empirical(cases: list[tuple[EmpiricalCase, dict[str, dze.SettingResult], dict[str, Any]]],
                    path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.0, 1.4 * len(cases) + 2.5), 3.8))
    ax = fig.subplots()
    width = 0.8 / len(dz.SETTINGS)
    x = np.arange(len(cases))
    for i, s in enumerate(dz.SETTINGS):
        ax.bar(x + (i - 1.5) * width, [res[s].cross_entropy for _, res, _ in cases], width,
               color=_STYLE[s][0], label=s)
    ax.set_xticks(x, [f"{c.dataset}\n{c.clients} clients" for c, _, _ in cases], fontsize=8)
    ax.set_ylabel("test cross-entropy [nats]")
    ax.set_title("Four settings on real data (DI: worst agent)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    _save_figure(fig, path)


def run_empirical(out_dir: str | Path, quick: bool = False, seed: int = 0,
                  cases: Sequence[EmpiricalCase] | None = None,
                  config: dze.FedPCConfig | None = None) -> dict[str, Any]:
    """Part 2: CL/CI, CL/DI, DL/CI, DL/DI on real vertical data; CSV, markdown and PNG.

    Args:
        out_dir: output folder, created if missing.
        quick: breast cancer only, 2 clients, 300 rows (for the test suite).
        cases: override the cases (datasets that are absent raise :class:`UserError`).

    Returns:
        ``{"results": {"<dataset>/<K>": {setting: {...}}}, "eq14": {...}, "files": [...]}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config or dze.FedPCConfig(seed=seed)
    done = []
    for case in (list(cases) if cases is not None else empirical_cases(quick)):
        blocks, schema, y_train = empirical_case_data(case, seed)
        res, extras = dze.four_settings(blocks, schema, y_train, cfg)
        sens = {cfg.n_clusters: (res["CL/CI"].cross_entropy, res["CL/DI"].per_agent)}
        for k in cluster_grid(quick):
            if k not in sens:
                sens[k] = dze.cl_losses(blocks, schema, replace(cfg, n_clusters=k, n_products=max(k, 1)))
        extras["cl_by_clusters"] = dict(sorted(sens.items()))
        done.append((case, res, extras))

    rows = []
    cost_rows = []
    for case, res, extras in done:
        for s in dz.SETTINGS:
            r = res[s]
            rows.append([case.dataset, case.clients, s, r.cross_entropy, r.accuracy, r.train_bytes,
                         r.infer_bytes, r.closed_form_infer_bytes if s in ("CL/CI", "DL/CI") else 0,
                         "" if r.worst_agent is None else r.worst_agent,
                         ";".join(f"{v:.6f}" for v in r.per_agent), extras["n_train"], extras["n_test"]])
        for (a, b), c in dze.empirical_costs(res).items():
            cost_rows.append([case.dataset, case.clients, a, b, c])
    write_csv(out / EMPIRICAL_CSV, EMPIRICAL_HEADER, rows)
    write_csv(out / EMPIRICAL_COSTS_CSV, ["dataset", "clients", "a", "b", "cost_nats"], cost_rows)
    write_csv(out / EMPIRICAL_CLUSTERS_CSV,
              ["dataset", "clients", "n_clusters", "cl_ci_nats", "cl_di_worst_nats", "cl_di_per_agent_nats"],
              [[c.dataset, c.clients, k, ci, max(di), ";".join(f"{v:.6f}" for v in di)]
               for c, _, extras in done for k, (ci, di) in extras["cl_by_clusters"].items()])
    md = empirical_markdown(done, cfg)
    atomic_write_bytes(out / EMPIRICAL_MD, md.encode())
    _plot_empirical(done, out / EMPIRICAL_PNG)
    return {
        "results": {f"{c.dataset}/{c.clients}": {s: vars(r).copy() for s, r in res.items()}
                    for c, res, _ in done},
        "eq14": {f"{c.dataset}/{c.clients}": dze.eq14_departures(res) for c, res, _ in done},
        "markdown": md,
        "cl_by_clusters": {f"{c.dataset}/{c.clients}": e["cl_by_clusters"] for c, _, e in done},
        "files": [str(out / n) for n in (EMPIRICAL_CSV, EMPIRICAL_COSTS_CSV, EMPIRICAL_CLUSTERS_CSV,
                                         EMPIRICAL_MD, EMPIRICAL_PNG)],
    }


PARTS: dict[str, Callable[..., dict[str, Any]]] = {"exact": run_part1, "empirical": run_empirical}


def run(out_dir: str | Path, quick: bool = False, parts: Sequence[str] = ("exact",)
        ) -> dict[str, dict[str, Any]]:
    """Run the requested parts into ``out_dir``; returns each part's summary by name."""
    missing = [p for p in parts if p not in PARTS]
    if missing:
        raise UserError(f"decentralization: unknown or not yet implemented part(s) {missing}; "
                        f"available: {sorted(PARTS)}")
    return {p: PARTS[p](out_dir, quick=quick) for p in parts}


def experiment_main(args: argparse.Namespace) -> int:
    """CLI handler; reads ``args.out``, ``args.quick`` and ``args.parts``, all optional."""
    out = getattr(args, "out", None) or "results/decentralization"
    parts = getattr(args, "parts", None) or tuple(PARTS)
    summaries = run(out, quick=bool(getattr(args, "quick", False)), parts=parts)
    for name, summary in summaries.items():
        for path in summary.get("files", []):
            print(f"decentralization[{name}]: wrote {path}")
    return 0
