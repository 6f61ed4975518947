"""Experiment driver for issue 8: the cost of decentralisation in vertical FL.

Parts are registered in :data:`PARTS`; :func:`run` runs the requested ones into one output folder.

* ``exact`` (:func:`run_part1`): the paper's Examples V-A and V-B computed exactly by
  :mod:`mpifc.analysis.decentralization`. Writes the Fig. 2 and Fig. 3 redraws (PNG), their
  curve values and Table I (CSV). All values are in nats.
* ``empirical`` (part 2, FedPCs on real data): not written yet; add it to :data:`PARTS`.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mpifc.analysis import decentralization as dz
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

def _atomic_write_bytes(path: Path, data: bytes) -> None:
    # A pid-named sibling (not mkstemp) so the file gets the umask's mode, like a plain open().
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Write ``rows`` under ``header`` atomically; floats with 17 significant digits."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in rows:
        w.writerow([f"{v:.17g}" if isinstance(v, float) else v for v in row])
    _atomic_write_bytes(path, buf.getvalue().encode())


def _save_figure(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    _atomic_write_bytes(path, buf.getvalue())


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


PARTS: dict[str, Callable[..., dict[str, Any]]] = {"exact": run_part1}


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
