"""Result cells on disk: one JSON per (dataset, setting, clients, method, seed), resumable.

A cell whose JSON says ``"status": "ok"`` is finished and skipped on resume; failed cells are
written too (with the error) so a table can show them, and are retried on the next run. Every
file is written atomically (temp file + rename), so a killed run never leaves half a result.
"""
from __future__ import annotations

import csv
import io
import json
import math
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from mpifc.errors import UserError
from mpifc.atomic import atomic_h5, atomic_write_bytes, atomic_write_text

OK, FAILED, NOT_RUN = "ok", "failed", "not-run"


@dataclass(frozen=True)
class Cell:
    """One unit of work of an experiment.

    Attributes:
        dataset: data_prep dataset name.
        setting: ``central``, ``horizontal``, ``vertical``, ``hybrid`` (or an experiment's own).
        clients: number of clients (ranks = clients + servers).
        method: what is trained, e.g. ``fedpc``, ``central-learnspn``, ``fedavg``.
        seed: data-split and model seed.
    """

    dataset: str
    setting: str
    clients: int
    method: str
    seed: int

    @property
    def group(self) -> tuple[str, str, int, str]:
        """The cell without its seed: what mean ± std is taken over."""
        return (self.dataset, self.setting, self.clients, self.method)

    def relpath(self) -> Path:
        return Path("cells") / self.dataset / f"{self.setting}-{self.clients}" / f"{self.method}-seed{self.seed}.json"


class ResultStore:
    """The cells of one experiment under ``out_dir/cells``."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)

    def path(self, cell: Cell) -> Path:
        return self.out / cell.relpath()

    def load(self, cell: Cell) -> dict[str, Any] | None:
        p = self.path(cell)
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # unreadable: treated as not done, recomputed

    def done(self, cell: Cell) -> bool:
        rec = self.load(cell)
        return rec is not None and rec.get("status") == OK

    def save(self, cell: Cell, status: str, result: dict[str, Any]) -> dict[str, Any]:
        rec = {**asdict(cell), "status": status, **result}
        atomic_write_text(self.path(cell), json.dumps(_jsonable(rec), indent=1, sort_keys=True) + "\n")
        return rec


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else v
    return v


def run_cells(store: ResultStore, cells: Sequence[Cell], work: Callable[[Cell], dict[str, Any]],
              desc: str, progress: bool = True) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run ``work(cell)`` for every unfinished cell; a failing cell is recorded, not raised.

    ``work`` may return ``{"status": NOT_RUN, "reason": ...}`` for a cell that cannot run here.
    :class:`UserError` is re-raised: bad input stops the run instead of filling a table with it.

    Returns:
        Every cell's record (finished earlier or now) and counts ``{"ran", "skipped", "failed"}``.
    """
    from tqdm import tqdm

    records, counts = [], {"ran": 0, "skipped": 0, "failed": 0}
    bar = tqdm(cells, desc=desc, unit="cell", disable=not progress, leave=False)
    for cell in bar:
        bar.set_postfix_str(f"{cell.dataset} {cell.setting}-{cell.clients} {cell.method} s{cell.seed}")
        if store.done(cell):
            records.append(store.load(cell))
            counts["skipped"] += 1
            continue
        try:
            result = work(cell)
            status = result.pop("status", OK)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - one broken method must not sink the table
            status = FAILED
            result = {"error": f"{type(e).__name__}: {e}"[-4000:], "traceback": traceback.format_exc()[-4000:]}
            counts["failed"] += 1
        counts["ran"] += 1
        records.append(store.save(cell, status, result))
    return records, counts


# ---------------------------------------------------------------------------- aggregation
def mean_std(values: Iterable[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count of the finite values."""
    v = np.array([x for x in values if x is not None and math.isfinite(float(x))], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, int(v.size)


def aggregate(records: Sequence[dict[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Mean ± std over seeds of each metric, per (dataset, setting, clients, method).

    A group's ``status`` is ``ok`` when at least one seed finished, else the first seed's status;
    ``error`` keeps the first failure's message.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["setting"], int(r["clients"]), r["method"]), []).append(r)
    rows = []
    for (ds, st, cl, me), recs in groups.items():
        ok = [r for r in recs if r.get("status") == OK]
        row: dict[str, Any] = {"dataset": ds, "setting": st, "clients": cl, "method": me,
                               "seeds": len(ok), "status": OK if ok else recs[0].get("status")}
        bad = [r for r in recs if r.get("status") != OK]
        if bad:
            row["error"] = bad[0].get("error") or bad[0].get("reason")
        for m in metrics:
            mu, sd, n = mean_std(r.get(m) for r in ok)
            row[f"{m}_mean"], row[f"{m}_std"] = mu, sd
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ file formats
def write_csv(path: str | Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Rows as CSV (columns: given, else the union in first-seen order), atomically."""
    cols = list(columns) if columns else _columns(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_cell_text(r.get(c)) for c in cols])
    return atomic_write_text(path, buf.getvalue())


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, (dict, list)) and k != "traceback":
                cols.setdefault(k, None)
    return list(cols)


def _cell_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


def write_h5_table(path: str | Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Rows as an HDF5 file with one 1-D dataset per column (float64, int64 or UTF-8 strings).

    Written to a temp file in the same folder, then renamed over ``path``.
    """
    import h5py

    cols = list(columns) if columns else _columns(rows)
    with atomic_h5(path) as f:
        f.attrs["columns"] = json.dumps(cols)
        for c in cols:
            vals = [r.get(c) for r in rows]
            if all(isinstance(v, (bool, int, np.integer)) for v in vals) and vals:
                f.create_dataset(c, data=np.asarray(vals, dtype=np.int64))
            elif all(v is None or isinstance(v, (int, float, np.number)) for v in vals):
                f.create_dataset(c, data=np.asarray([math.nan if v is None else v for v in vals], np.float64))
            else:
                f.create_dataset(c, data=["" if v is None else str(v) for v in vals],
                                 dtype=h5py.string_dtype())
    return Path(path)


def save_figure(fig: Any, path: str | Path) -> Path:
    """A matplotlib figure as PNG, atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
