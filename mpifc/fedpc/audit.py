"""Privacy audit hook: record what every rank sends, check it against its declared shape, and find
per-sample and raw data in it.

Installed on a :class:`~mpifc.runtime.transport.Transport` instance (never on the class), it wraps
``isend``/``isend_obj`` so every message is recorded before it leaves. Per message:

* ``kind``, ``payload`` (class), ``dst``, ``shape``, ``dtype``, ``bytes``;
* ``shape_ok``: whether the payload fits its kind's declared shape
  (:data:`mpifc.fedpc.protocol.PAYLOAD_SHAPES`; a kind with no declaration does not);
* ``per_sample``: ``"train rows"`` / ``"test rows"`` when the payload carries one entry per row of
  the sender's training (test) rows: an axis of that length, a flat array of a multiple of it,
  or, in a pickled object, a sequence of that length; ``"declared"`` for a kind declared
  per-sample (``rows`` axes: query passes, exact vertical EM, cluster ids) whose rows are not the
  sender's own; else null. Byte blobs (serialized models) are opaque here;
* ``contains_raw_row``: whether the bytes contain any raw row of the sender (its float64 bytes,
  for rows of two values or more) and ``contains_raw_column``: any raw column as a whole (its
  float64 bytes, for row sets of at least :data:`MIN_ROWS` rows; this also covers clients with
  a single column, whose 8-byte rows occur by chance in any message).

The summary (:meth:`SendAudit.summary`, in every rank's file and merged over ranks into
``audit-summary.json`` by :func:`merge`) lists the per-sample kinds with their messages and bytes
and whether the job allows them (the job says which it does and why: ``--glue cooccurrence``
sends cluster ids, a query pass sends values per query row), the shape violations, and the
messages with raw rows or columns.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from mpifc.atomic import OutputKind, atomic_write_text
from mpifc.fedpc.protocol import PAYLOAD_SHAPES
from mpifc.runtime.kinds import as_kind

MIN_ROWS = 16
"""Row sets smaller than this are searched for whole rows and exact per-sample axes only: a
column of a few values, or a flat array of a few entries, matches by chance."""


class SendAudit:
    """Per-rank send recorder; :meth:`protect` registers the rows this rank must never send.

    Args:
        rank: this rank.
        allowed: per-sample kinds this job may send, ``{kind name: why}``.
    """

    def __init__(self, rank: int, allowed: dict[str, str] | None = None) -> None:
        self.rank = rank
        self.allowed = dict(allowed or {})
        self.records: list[dict[str, Any]] = []
        self.raw_shapes: list[list[int]] = []
        self._row_bytes: list[bytes] = []
        self._col_bytes: list[bytes] = []
        self._counts: dict[int, str] = {}

    def protect(self, rows: np.ndarray, what: str = "train") -> None:
        """Add rows (``(n, d)``) whose bytes must not appear in any sent message; ``what`` names
        the row set (``"train"``, ``"test"``) in per-sample findings."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        self.raw_shapes.append(list(rows.shape))
        if rows.ndim != 2:
            return
        n, d = rows.shape
        if n >= 1:
            self._counts.setdefault(n, f"{what} rows")
        if d >= 2:
            self._row_bytes.extend(r.tobytes() for r in rows)
        if n >= MIN_ROWS:
            self._col_bytes.extend(np.ascontiguousarray(rows[:, j]).tobytes() for j in range(d))

    def install(self, transport: Any) -> None:
        orig_isend, orig_isend_obj = transport.isend, transport.isend_obj

        def isend(x: Any, dest: int, kind: Any):
            arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
            self._record(kind, dest, arr, None, np.ascontiguousarray(arr).tobytes())
            return orig_isend(x, dest, kind)

        def isend_obj(obj: Any, dest: int, kind: Any):
            self._record(kind, dest, None, obj, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            return orig_isend_obj(obj, dest, kind)

        transport.isend, transport.isend_obj = isend, isend_obj

    # -- findings ----------------------------------------------------------------------------
    def _rows_of_shape(self, shape: tuple[int, ...]) -> str | None:
        for n, what in self._counts.items():
            if any(a == n for a in shape):
                return what
            if len(shape) == 1 and n >= MIN_ROWS and shape[0] >= n and shape[0] % n == 0:
                return what
        return None

    def _rows_of_object(self, obj: Any, depth: int = 0) -> str | None:
        if depth > 6:
            return None
        if isinstance(obj, np.ndarray):
            return self._rows_of_shape(obj.shape) if obj.dtype != np.uint8 else None
        if isinstance(obj, dict):
            items = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            found = self._counts.get(len(obj)) if len(obj) >= 2 else None
            if found is not None:
                return found
            items = list(obj)
        else:
            items = [v for v in getattr(obj, "__dict__", {}).values()]
        for v in items:
            found = self._rows_of_object(v, depth + 1)
            if found is not None:
                return found
        return None

    def _record(self, kind: Any, dest: int, arr: np.ndarray | None, obj: Any, data: bytes) -> None:
        k = as_kind(kind)
        spec = PAYLOAD_SHAPES.get(k.name)
        shape = None if arr is None else tuple(int(a) for a in arr.shape)
        if spec is None:
            problem = "no declared shape for this kind"
        else:
            problem = spec.problem(shape, None if arr is None else arr.dtype.kind)
        blob = arr is not None and arr.dtype == np.uint8 and spec is not None and not spec.per_sample
        if arr is None:
            per_sample = self._rows_of_object(obj)
        elif blob:
            per_sample = None  # serialized bytes: what they hold is checked by content below
        else:
            per_sample = self._rows_of_shape(shape)
        if per_sample is None and spec is not None and spec.per_sample:
            per_sample = "declared"
        self.records.append({
            "src": self.rank, "dst": int(dest), "kind": k.name, "payload": k.payload,
            "shape": None if shape is None else list(shape), "dtype": "pickle" if arr is None else str(arr.dtype),
            "bytes": len(data), "shape_ok": problem is None, "shape_problem": problem, "per_sample": per_sample,
            "contains_raw_row": any(rb in data for rb in self._row_bytes) if self._row_bytes else False,
            "contains_raw_column": any(cb in data for cb in self._col_bytes) if self._col_bytes else False})

    def summary(self) -> dict[str, Any]:
        """Per-sample kinds (messages, bytes, rows, allowed and why), shape violations, messages
        with raw rows or columns; over this rank's sends."""
        per_sample: dict[str, dict[str, Any]] = {}
        for r in self.records:
            if r["per_sample"] is None:
                continue
            e = per_sample.setdefault(r["kind"], {"messages": 0, "bytes": 0, "rows": [],
                                                  "allowed": r["kind"] in self.allowed,
                                                  "why": self.allowed.get(r["kind"], "not allowed in this job")})
            e["messages"] += 1
            e["bytes"] += r["bytes"]
            if r["per_sample"] not in e["rows"]:
                e["rows"].append(r["per_sample"])
        return {
            "messages": len(self.records), "bytes": int(sum(r["bytes"] for r in self.records)),
            "per_sample": per_sample,
            "shape_violations": [{k: r[k] for k in ("kind", "dst", "shape", "dtype", "shape_problem")}
                                 for r in self.records if not r["shape_ok"]],
            "raw_rows": sum(1 for r in self.records if r["contains_raw_row"]),
            "raw_columns": sum(1 for r in self.records if r["contains_raw_column"]),
        }

    def write(self, directory: str | Path, path: str | Path | None = None) -> Path:
        """Write this rank's audit file: ``directory/audit-rank<R>.json``, or ``path`` (its staged
        partial file, :mod:`mpifc.runtime.outputs`)."""
        path = Path(directory) / f"audit-rank{self.rank}.json" if path is None else Path(path)
        return atomic_write_text(path, json.dumps({"rank": self.rank, "raw_shapes": self.raw_shapes,
                                                   "summary": self.summary(), "sent": self.records}, indent=0))


def merge(directory: str | Path, files: list[Path] | None = None, to: str | Path | None = None) -> Path:
    """``audit-summary.json``: every rank's summary merged (per-sample kinds by sending rank).

    ``files``: the ranks' audit files (default: ``audit-rank*.json`` in ``directory``); ``to``:
    where to write the summary (default ``directory/audit-summary.json``)."""
    d = Path(directory)
    ranks = {}
    for p in (sorted(d.glob("audit-rank*.json")) if files is None else files):
        doc = json.loads(p.read_text())
        ranks[int(doc["rank"])] = doc.get("summary") or {}
    per_sample: dict[str, dict[str, Any]] = {}
    for rank, s in sorted(ranks.items()):
        for kind, e in (s.get("per_sample") or {}).items():
            m = per_sample.setdefault(kind, {"messages": 0, "bytes": 0, "ranks": [], "rows": [],
                                             "allowed": e["allowed"], "why": e["why"]})
            m["messages"] += e["messages"]
            m["bytes"] += e["bytes"]
            m["ranks"].append(rank)
            m["rows"] = sorted(set(m["rows"]) | set(e["rows"]))
            m["allowed"] = m["allowed"] and e["allowed"]
    out = {"ranks": sorted(ranks), "per_sample": per_sample,
           "shape_violations": {str(r): s.get("shape_violations", []) for r, s in ranks.items()
                                if s.get("shape_violations")},
           "raw_rows": sum(s.get("raw_rows", 0) for s in ranks.values()),
           "raw_columns": sum(s.get("raw_columns", 0) for s in ranks.values())}
    return atomic_write_text(d / "audit-summary.json" if to is None else to, json.dumps(out, indent=1))


def is_audit_file(path: str | Path) -> bool:
    """Whether ``path`` is an audit file (a rank's or the summary), judged by its JSON content."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and ("rank" in doc or "ranks" in doc)


AUDIT_OUTPUT = OutputKind("an audit file", is_audit_file, members=r"audit-(summary|rank\d+)\.json")
"""``--audit DIR``: the files it writes in DIR, each may replace only an earlier audit file."""
