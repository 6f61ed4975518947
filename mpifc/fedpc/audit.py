"""Privacy audit: record what every rank sends, check it against its declared shape, search it
for what must not leave a client, and stop the message before it leaves.

Installed on a :class:`~mpifc.runtime.transport.Transport` instance (never on the class), it wraps
``isend``/``isend_obj`` so every message is checked before it is handed to MPI. Per message:

* ``kind``, ``payload`` (class), ``dst``, ``shape``, ``dtype``, ``bytes``;
* ``shape_ok``: whether the payload fits its kind's declared shape
  (:data:`mpifc.fedpc.protocol.PAYLOAD_SHAPES`; a kind with no declaration does not);
* ``per_sample``: ``"train rows"`` / ``"test rows"`` when the payload carries one entry per row of
  the sender's training (test) rows: an axis of that length, a flat array of a multiple of it,
  or, in a pickled object, a sequence of that length; ``"declared"`` for a kind declared
  per-sample (``rows`` axes: query passes, exact vertical EM, cluster ids) whose rows are not the
  sender's own; else null. Byte blobs (serialized models) are opaque here;
* ``contains_raw_row``: whether the bytes hold a raw row of the sender (its float64 bytes at any
  byte offset; rows of two values or more, with a real column, whose values fewer than ``k``
  rows share: the level codes of discrete rows occur in any discrete leaf) and
  ``contains_raw_column``: a raw column as a whole (for row sets of at least :data:`MIN_ROWS`
  rows);
* ``rare_values``: how many distinct values that fewer than ``k`` of the sender's rows hold
  (:data:`~mpifc.circuit.privacy.MIN_LEAF_ROWS`, in its real columns, over its training,
  validation and test rows) the message holds, found by :func:`~mpifc.circuit.privacy.find_values`:
  their float64 bytes and those of their float32 rounding at any byte offset of the message (in
  a pickled object also big-endian, as pickle stores a Python float), and
  their float32 bytes in every float32 array it carries (a model blob is decoded for that);
  ``rare_columns``: the columns holding them. Discrete and categorical columns hold level codes,
  whose set the schema declares, and are not searched.

A message with a raw row, a raw column or a rare value is a **finding**. By default
(``findings="fail"``) the audit does not send it: the sender writes its audit file and raises
:class:`~mpifc.errors.PrivacyFinding` (one line, exit code 3; the job writes no model, ledger or
answer). ``findings="record"`` (``--audit-findings record``) sends it and records it; the model
then says so in its meta (``privacy.audit_findings``).

The summary (:meth:`SendAudit.summary`, in every rank's file and merged over ranks into
``audit-summary.json`` by :func:`merge`; docs/formats.md) lists, per message kind, the messages,
bytes and what was found in them; the per-sample kinds with whether the job allows them (the job
says which it does and why: ``--glue cooccurrence`` sends cluster ids, a query pass sends values
per query row); and the shape violations.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from mpifc.atomic import OutputKind, atomic_write_text
from mpifc.circuit.privacy import MIN_LEAF_ROWS, find_values, rare_values, sorted_member, value_patterns
from mpifc.errors import PrivacyFinding
from mpifc.fedpc.protocol import PAYLOAD_SHAPES
from mpifc.runtime.kinds import as_kind

MIN_ROWS = 16
"""Row sets smaller than this are searched for whole rows and exact per-sample axes only: a
column of a few values, or a flat array of a few entries, matches by chance."""

FINDINGS = ("fail", "record")
"""What a finding does: ``fail`` (the default) stops the message and the job; ``record`` lets
it go and records it (the model's meta says so)."""

_HASH_SEED = 0x6D706966  # fixed: the row search is a pure function of the rows and the bytes


_KEY_WORDS = 16
"""Words of a row the search key reads (spread over the row); a window whose key equals a row's
is then compared word for word, so the search stays exact and costs ``O(min(d, 16))`` passes."""


class _RowSearch:
    """Finds any of a set of rows (``(n, d)`` float64, ``d >= 2``) at any byte offset of a
    buffer: one multiply-add key per position and alignment over at most :data:`_KEY_WORDS`
    words of the window, spread over it, compared against the rows' keys; candidates checked
    word for word (``O(min(d, 16))`` passes over the buffer, whatever ``n`` and ``d``)."""

    def __init__(self, rows: np.ndarray) -> None:
        self.words = np.ascontiguousarray(rows, dtype=np.float64).view(np.uint64)
        d = self.words.shape[1]
        # evenly spaced and distinct (at least one word apart); no np.unique, which imports numpy.ma
        self.pos = np.linspace(0, d - 1, min(d, _KEY_WORDS)).round().astype(np.int64)
        self.mult = np.random.default_rng(_HASH_SEED).integers(1, 2**63, size=self.pos.size,
                                                               dtype=np.uint64) | np.uint64(1)
        with np.errstate(over="ignore"):
            keys = (self.words[:, self.pos] * self.mult).sum(axis=1, dtype=np.uint64)
        order = np.argsort(keys, kind="stable")
        self.keys, self.order = keys[order], order

    def found(self, buf: np.ndarray) -> bool:
        n, d = self.words.shape
        for off in range(8):
            m = (buf.size - off) // 8
            if m < d:
                continue
            w = buf[off: off + 8 * m].view("<u8")
            key = np.zeros(m - d + 1, dtype=np.uint64)
            with np.errstate(over="ignore"):
                for p, mult in zip(self.pos, self.mult):
                    key += w[p: m - d + 1 + p] * mult
            for i in np.flatnonzero(sorted_member(key, self.keys)):
                lo, hi = np.searchsorted(self.keys, key[i], "left"), np.searchsorted(self.keys, key[i], "right")
                window = w[i: i + d]
                if any(np.array_equal(window, self.words[self.order[r]]) for r in range(lo, hi)):
                    return True
        return False


class SendAudit:
    """Per-rank send recorder; :meth:`protect` registers the rows this rank must never send.

    Args:
        rank: this rank.
        allowed: per-sample kinds this job may send, ``{kind name: why}``.
        findings: one of :data:`FINDINGS`.
        k: values held by fewer rows than this are searched for.
        directory: where :meth:`write` puts this rank's file (a finding in ``fail`` mode writes
            it, and a summary of this rank alone, before the error is raised).
        who: how the one-line error names this rank (e.g. ``"client 1 (rank 2)"``).
        payloads: the payload classes it checks and records (None: every message).
    """

    def __init__(self, rank: int, allowed: dict[str, str] | None = None, findings: str = "fail",
                 k: int = MIN_LEAF_ROWS, directory: str | Path | None = None, who: str | None = None,
                 payloads: set[str] | None = None) -> None:
        if findings not in FINDINGS:
            raise ValueError(f"findings must be one of {FINDINGS}, got {findings!r}")
        self.payloads = None if payloads is None else set(payloads)
        self.rank = rank
        self.allowed = dict(allowed or {})
        self.findings = findings
        self.k = int(k)
        self.directory = directory
        self.who = who or f"rank {rank}"
        self.records: list[dict[str, Any]] = []
        self.raw_shapes: list[list[int]] = []
        self._rows: dict[int, list[np.ndarray]] = {}
        self._row_search: dict[int, _RowSearch] | None = None
        self._cols: dict[int, list[np.ndarray]] = {}
        self._col_search: list[_RowSearch] | None = None
        self._counts: dict[int, str] = {}
        self._values: list[tuple[np.ndarray, list[str]]] = []
        self._rare: tuple[np.ndarray, np.ndarray, list[str]] | None = None
        self._patterns: tuple[np.ndarray, np.ndarray] | None = None
        self.moment_coincidences = 0  # moments equal to a rare value before the release guard moved them

    def protect(self, rows: np.ndarray, what: str = "train", real: Any = None,
                names: list[str] | None = None) -> None:
        """Add rows (``(n, d)``) whose bytes must not appear in any sent message; ``what`` names
        the row set (``"train"``, ``"test"``) in per-sample findings. ``real`` (``(d,)`` bools,
        default all) marks the columns whose values are searched when fewer than ``k`` rows
        (over every row set protected) hold them; ``names`` names the columns in findings."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        self.raw_shapes.append(list(rows.shape))
        if rows.ndim != 2:
            return
        n, d = rows.shape
        if n >= 1:
            self._counts.setdefault(n, f"{what} rows")
        mask = np.ones(d, dtype=bool) if real is None else np.asarray(real, dtype=bool)
        if d >= 2 and n and mask.any():
            self._rows.setdefault(d, []).append(rows)
            self._row_search = None
        if n >= MIN_ROWS:
            self._cols.setdefault(n, []).append(rows.T)
            self._col_search = None
        if n and mask.any():
            cols = np.flatnonzero(mask)
            label = list(names) if names is not None else [f"column {j}" for j in range(d)]
            self._values.append((rows[:, cols], [label[j] for j in cols]))
            self._rare = self._patterns = None

    def rare(self) -> np.ndarray:
        """The sorted values fewer than ``k`` of the protected rows hold (real columns)."""
        return self._rare_table()[0]

    def _rare_table(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(rare values sorted, index of a column holding each, column names)."""
        if self._rare is None:
            names = sorted({nm for _, nms in self._values for nm in nms})
            pos = {nm: i for i, nm in enumerate(names)}
            # a column's values, over every protected row set, in one block per column name
            per: dict[str, list[np.ndarray]] = {}
            for block, nms in self._values:
                for j, nm in enumerate(nms):
                    per.setdefault(nm, []).append(block[:, j])
            if not per:
                self._rare = (np.empty(0), np.empty(0, dtype=np.int64), names)
            else:
                table = np.full((max(sum(len(c) for c in cs) for cs in per.values()), len(names)), np.nan)
                for nm, cs in per.items():
                    col = np.concatenate(cs)
                    table[: col.size, pos[nm]] = col
                vals = rare_values(table, k=self.k)
                # the first column holding each value: (value, column) pairs sorted by value,
                # then column, searched once (np.isin on floats would import numpy.ma, a cost
                # every client rank pays once)
                flat = table.T.reshape(-1)
                col_of = np.repeat(np.arange(len(names), dtype=np.int64), table.shape[0])
                kept = ~np.isnan(flat)
                flat, col_of = flat[kept], col_of[kept]
                order = np.lexsort((col_of, flat))
                flat, col_of = flat[order], col_of[order]
                where = np.full(vals.size, -1, dtype=np.int64)
                if flat.size:
                    at = np.minimum(np.searchsorted(flat, vals), flat.size - 1)
                    held = flat[at] == vals
                    where[held] = col_of[at[held]]
                self._rare = (vals, where, names)
            self._patterns = value_patterns(self._rare[0])
        return self._rare

    def install(self, transport: Any) -> None:
        orig_isend, orig_isend_obj = transport.isend, transport.isend_obj

        def isend(x: Any, dest: int, kind: Any):
            if self._checks(kind):
                arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
                self._check(self._record(kind, dest, arr, None, np.ascontiguousarray(arr).tobytes()))
            return orig_isend(x, dest, kind)

        def isend_obj(obj: Any, dest: int, kind: Any):
            if self._checks(kind):
                self._check(self._record(kind, dest, None, obj, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))
            return orig_isend_obj(obj, dest, kind)

        transport.isend, transport.isend_obj = isend, isend_obj

    def _checks(self, kind: Any) -> bool:
        return self.payloads is None or as_kind(kind).payload in self.payloads

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

    def _has_raw_row(self, buf: np.ndarray) -> bool:
        if not self._rows:
            return False
        if self._row_search is None:
            self._row_search = {}
            for d, blocks in self._rows.items():
                # a row that k rows or more share is nobody's in particular
                pats, counts = np.unique(np.concatenate(blocks), axis=0, return_counts=True)
                if np.any(counts < self.k):
                    self._row_search[d] = _RowSearch(pats[counts < self.k])
        return any(s.found(buf) for s in self._row_search.values())

    def _has_raw_column(self, buf: np.ndarray) -> bool:
        """Whether a whole column of a protected row set (its float64 bytes) is in ``buf`` at any
        byte offset: a column is searched as a row of the transposed set."""
        if self._col_search is None:
            self._col_search = [_RowSearch(np.concatenate(blocks)) for blocks in self._cols.values()]
        return any(s.found(buf) for s in self._col_search)

    def _record(self, kind: Any, dest: int, arr: np.ndarray | None, obj: Any, data: bytes) -> dict[str, Any]:
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
        buf = np.frombuffer(data, dtype=np.uint8)
        rare, rare32, columns = 0, 0, []
        vals, where, names = self._rare_table()
        if vals.size:
            f32 = _float32_arrays(arr if not blob else None, obj, buf if blob and k.payload == "model_parameters" else None)
            found = find_values(buf, self._patterns, f32, big_endian=arr is None)  # a pickle's floats
            hit = np.sort(np.concatenate([found["float64"], found["float32"]]))
            hit = hit[np.concatenate([[True], hit[1:] != hit[:-1]])] if hit.size else hit  # distinct (no NaN)
            if hit.size:
                rare, rare32 = int(hit.size), int(found["float32"].size)
                # the values hit: bit for bit, or through their float32 rounding (np.isin, by
                # binary search in the sorted hits)
                with np.errstate(over="ignore"):
                    held = sorted_member(vals, hit) | sorted_member(vals.astype(np.float32),
                                                                    np.sort(hit.astype(np.float32)))
                columns = sorted({names[int(j)] for j in where[held] if j >= 0})
        rec = {"src": self.rank, "dst": int(dest), "kind": k.name, "payload": k.payload,
               "shape": None if shape is None else list(shape), "dtype": "pickle" if arr is None else str(arr.dtype),
               "bytes": len(data), "shape_ok": problem is None, "shape_problem": problem, "per_sample": per_sample,
               "contains_raw_row": self._has_raw_row(buf),
               "contains_raw_column": self._has_raw_column(buf),
               "rare_values": rare, "rare_float32": rare32, "rare_columns": columns}
        rec["finding"] = bool(rec["contains_raw_row"] or rec["contains_raw_column"] or rec["rare_values"])
        self.records.append(rec)
        return rec

    def _check(self, rec: dict[str, Any]) -> None:
        """Stop a message with a finding (``findings="fail"``): write this rank's file and raise."""
        if not rec["finding"] or self.findings != "fail":
            return
        what = []
        if rec["contains_raw_row"]:
            what.append("a raw row")
        if rec["contains_raw_column"]:
            what.append("a raw column")
        if rec["rare_values"]:
            cols = rec["rare_columns"]
            shown = ", ".join(repr(c) for c in cols[:3]) + (", ..." if len(cols) > 3 else "")
            what.append(f"{rec['rare_values']} value(s) that fewer than {self.k} of its rows hold"
                        + (f" (column {shown})" if cols else ""))
        where = ""
        if self.directory is not None:
            try:
                self.write(self.directory, summary_file=True)
                where = f"; see {Path(self.directory) / 'audit-summary.json'}"
            except OSError:
                pass
        raise PrivacyFinding(f"privacy audit: {self.who} was about to send {rec['kind']} to rank {rec['dst']} "
                             f"holding {' and '.join(what)}; it was not sent and no model is written{where} "
                             f"(--audit-findings record sends it and records that in the model)")

    def summary(self) -> dict[str, Any]:
        """Per message kind what was sent and found, per-sample kinds (messages, bytes, rows,
        allowed and why), shape violations, counts of messages with findings; over this rank's
        sends."""
        per_sample: dict[str, dict[str, Any]] = {}
        kinds: dict[str, dict[str, Any]] = {}
        for r in self.records:
            e = kinds.setdefault(r["kind"], {"messages": 0, "bytes": 0, "raw_rows": 0, "raw_columns": 0,
                                             "rare_values": 0, "rare_float32": 0, "rare_columns": [],
                                             "findings": 0})
            e["messages"] += 1
            e["bytes"] += r["bytes"]
            e["raw_rows"] += int(r["contains_raw_row"])
            e["raw_columns"] += int(r["contains_raw_column"])
            e["rare_values"] += r["rare_values"]
            e["rare_float32"] += r["rare_float32"]
            e["rare_columns"] = sorted(set(e["rare_columns"]) | set(r["rare_columns"]))
            e["findings"] += int(r["finding"])
            if r["per_sample"] is None:
                continue
            p = per_sample.setdefault(r["kind"], {"messages": 0, "bytes": 0, "rows": [],
                                                  "allowed": r["kind"] in self.allowed,
                                                  "why": self.allowed.get(r["kind"], "not allowed in this job")})
            p["messages"] += 1
            p["bytes"] += r["bytes"]
            if r["per_sample"] not in p["rows"]:
                p["rows"].append(r["per_sample"])
        return {
            "k": self.k, "findings_mode": self.findings,
            "protected_rare_values": int(self.rare().size) if self._values else 0,
            "messages": len(self.records), "bytes": int(sum(r["bytes"] for r in self.records)),
            "kinds": kinds, "per_sample": per_sample,
            "shape_violations": [{k: r[k] for k in ("kind", "dst", "shape", "dtype", "shape_problem")}
                                 for r in self.records if not r["shape_ok"]],
            "raw_rows": sum(1 for r in self.records if r["contains_raw_row"]),
            "raw_columns": sum(1 for r in self.records if r["contains_raw_column"]),
            "rare_values": sum(r["rare_values"] for r in self.records),
            "findings": sum(1 for r in self.records if r["finding"]),
            "moment_coincidences": int(self.moment_coincidences),
        }

    def write(self, directory: str | Path, path: str | Path | None = None, summary_file: bool = False) -> Path:
        """This rank's audit file: ``directory/audit-rank<R>.json``, or ``path`` (its staged
        partial file, :mod:`mpifc.runtime.outputs`); with ``summary_file`` also an
        ``audit-summary.json`` of this rank alone (a job stopped by a finding has no other ranks'
        files to merge)."""
        path = Path(directory) / f"audit-rank{self.rank}.json" if path is None else Path(path)
        out = atomic_write_text(path, json.dumps({"rank": self.rank, "raw_shapes": self.raw_shapes,
                                                  "summary": self.summary(), "sent": self.records}, indent=0))
        if summary_file:
            merge(directory, ranks={self.rank: self.summary()}, stopped=self.records[-1] if self.records else None)
        return out


def _float32_arrays(arr: np.ndarray | None, obj: Any, blob: np.ndarray | None) -> list[np.ndarray]:
    """The float32 arrays a message carries: the payload itself, those in a pickled object, or
    the datasets and attributes of a model blob (decoded; an undecodable blob has none)."""
    out: list[np.ndarray] = []
    if arr is not None and arr.dtype == np.float32:
        out.append(arr)
    if obj is not None:
        _collect_float32(obj, out, 0)
    if blob is not None:
        from mpifc.errors import UserError
        from mpifc.federated.wire_format import model_from_bytes

        try:
            group = model_from_bytes(blob, lazy=True).group
        except UserError:
            return out
        _collect_float32(group, out, 0)
    return out


def _collect_float32(obj: Any, out: list[np.ndarray], depth: int) -> None:
    if depth > 16:
        return
    if isinstance(obj, np.ndarray):
        if obj.dtype == np.float32:
            out.append(obj)
        elif obj.dtype == object:
            for v in obj.reshape(-1):
                _collect_float32(v, out, depth + 1)
        return
    if isinstance(obj, np.float32):
        out.append(np.asarray([obj]))
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "_members") and hasattr(obj, "attrs"):  # a decoded model blob (WireGroup)
        items = list(obj.attrs.values()) + list(obj._members.values())
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    for v in items:
        _collect_float32(v, out, depth + 1)


_KIND_KEYS = ("messages", "bytes", "raw_rows", "raw_columns", "rare_values", "rare_float32", "findings")


def merge(directory: str | Path, files: list[Path] | None = None, to: str | Path | None = None,
          ranks: dict[int, dict[str, Any]] | None = None, stopped: dict[str, Any] | None = None) -> Path:
    """``audit-summary.json``: every rank's summary merged (per message kind and per-sample kind,
    by sending rank).

    ``files``: the ranks' audit files (default: ``audit-rank*.json`` in ``directory``); ``ranks``
    gives the summaries instead of reading files; ``to``: where to write the summary (default
    ``directory/audit-summary.json``); ``stopped``: the message a finding stopped
    (docs/formats.md)."""
    d = Path(directory)
    if ranks is None:
        ranks = {}
        for p in (sorted(d.glob("audit-rank*.json")) if files is None else files):
            doc = json.loads(p.read_text())
            ranks[int(doc["rank"])] = doc.get("summary") or {}
    per_sample: dict[str, dict[str, Any]] = {}
    kinds: dict[str, dict[str, Any]] = {}
    for rank, s in sorted(ranks.items()):
        for kind, e in (s.get("per_sample") or {}).items():
            m = per_sample.setdefault(kind, {"messages": 0, "bytes": 0, "ranks": [], "rows": [],
                                             "allowed": e["allowed"], "why": e["why"]})
            m["messages"] += e["messages"]
            m["bytes"] += e["bytes"]
            m["ranks"].append(rank)
            m["rows"] = sorted(set(m["rows"]) | set(e["rows"]))
            m["allowed"] = m["allowed"] and e["allowed"]
        for kind, e in (s.get("kinds") or {}).items():
            m = kinds.setdefault(kind, {**{key: 0 for key in _KIND_KEYS}, "rare_columns": [], "ranks": []})
            for key in _KIND_KEYS:
                m[key] += int(e.get(key, 0))
            m["ranks"].append(rank)
            m["rare_columns"] = sorted(set(m["rare_columns"]) | {f"rank {rank}: {c}" for c in e.get("rare_columns", [])})
    out = {"ranks": sorted(ranks),
           "k": max((int(s.get("k", MIN_LEAF_ROWS)) for s in ranks.values()), default=MIN_LEAF_ROWS),
           "findings_mode": next((s["findings_mode"] for s in ranks.values() if "findings_mode" in s), "fail"),
           "findings": sum(s.get("findings", 0) for s in ranks.values()),
           "stopped": None if stopped is None else {key: stopped[key] for key in
                                                    ("src", "dst", "kind", "contains_raw_row", "contains_raw_column",
                                                     "rare_values", "rare_columns")},
           "kinds": kinds, "per_sample": per_sample,
           "shape_violations": {str(r): s.get("shape_violations", []) for r, s in ranks.items()
                                if s.get("shape_violations")},
           "raw_rows": sum(s.get("raw_rows", 0) for s in ranks.values()),
           "raw_columns": sum(s.get("raw_columns", 0) for s in ranks.values()),
           "rare_values": sum(s.get("rare_values", 0) for s in ranks.values()),
           "moment_coincidences": sum(s.get("moment_coincidences", 0) for s in ranks.values())}
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


# -- model files ---------------------------------------------------------------------------------
_RAW_FIELDS = ("levels", "impute", "mean", "std", "encoding_missing")
"""Codec fields (per column of ``meta["codec"]["preprocessing"]``) in the user's units."""


def shard_rare_values(directory: str | Path, k: int = MIN_LEAF_ROWS) -> np.ndarray:
    """The values, in model units, that fewer than ``k`` rows of a shard set hold in a real
    feature: every client's training and validation rows and the test set, pooled per feature
    (what the model file, readable by every client, must not hold)."""
    from data_prep.shards import load_manifest, read_client, read_test

    m = load_manifest(directory)
    per: dict[str, list[np.ndarray]] = {}
    real: set[str] = set()
    for c in range(m.n_clients):
        shard = read_client(directory, c)
        for j, (f, mt) in enumerate(zip(shard.features, shard.meta_types)):
            if mt == "real":
                real.add(f)
                per.setdefault(f, []).extend([shard.x_train[:, j], shard.x_valid[:, j]])
    test = read_test(directory)
    for j, f in enumerate(test.features):
        if f in real:
            per[f].append(test.x[:, j])
    cols = [np.concatenate(v) for v in per.values()]
    if not cols:
        return np.empty(0)
    table = np.full((max(c.size for c in cols), len(cols)), np.nan)
    for j, c in enumerate(cols):
        table[: c.size, j] = c
    return rare_values(table, k=k)


def _h5_float32(path: Path) -> list[np.ndarray]:
    import h5py

    out: list[np.ndarray] = []

    def visit(_name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.dtype == np.float32:
            out.append(obj[()])
        for v in obj.attrs.values():
            if isinstance(v, (np.ndarray, np.float32)) and np.asarray(v).dtype == np.float32:
                out.append(np.asarray(v))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def codec_values(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The numbers a model's codec stores: ``(user units, model units)``. User units: each
    column's levels, imputed value, mean and standard deviation, normal-score knots and tail
    scales, category encodings; model units: the normal-score knots' images."""
    pre = ((meta.get("codec") or {}).get("preprocessing") or {}).get("columns") or {}
    raw: list[float] = []
    model: list[float] = []

    def numbers(v: Any, into: list[float]) -> None:
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, (int, float)):
            into.append(float(v))
        elif isinstance(v, (list, tuple)):
            for e in v:
                numbers(e, into)
        elif isinstance(v, dict):
            for e in v.values():
                numbers(e, into)

    for entry in pre.values():
        for key in _RAW_FIELDS:
            numbers(entry.get(key), raw)
        numbers(entry.get("encoding"), raw)
        ns = entry.get("normal_score") or {}
        numbers([ns.get("x"), ns.get("scale_lo"), ns.get("scale_hi")], raw)
        numbers(ns.get("z"), model)
    return np.asarray(raw, dtype=np.float64), np.asarray(model, dtype=np.float64)


def model_findings(model: str | Path, shards: str | Path, raw_rare: np.ndarray | None = None,
                   k: int = MIN_LEAF_ROWS) -> dict[str, Any]:
    """What a model file holds of values that fewer than ``k`` rows hold.

    Args:
        model: the model file (HDF5).
        shards: the shard set it was trained on (:func:`shard_rare_values` of it, model units).
        raw_rare: the rare values of the source table in the user's units (the codec is
            checked against them too), e.g. ``rare_values`` of the prepared table's numeric
            columns; None: the codec is checked in model units only.

    Returns:
        ``{"file": n, "file_float32": n, "codec_model_units": n, "codec_user_units": n}``: how
        many distinct rare values the file's bytes hold (float64 at any offset, or in a float32
        dataset), and how many the codec's numbers hold (:func:`codec_values`).
    """
    from mpifc.federated.serialize import load_fc

    path = Path(model)
    rare = shard_rare_values(shards, k)
    found = find_values(path.read_bytes(), value_patterns(rare), _h5_float32(path)) if rare.size else \
        {"float64": np.empty(0), "float32": np.empty(0)}
    raw, units = codec_values(load_fc(path, load_models=False).meta)
    return {"file": int(np.unique(np.concatenate([found["float64"], found["float32"]])).size),
            "file_float32": int(found["float32"].size),
            "codec_model_units": int(np.isin(units, rare).sum() + np.isin(raw, rare).sum()),
            "codec_user_units": 0 if raw_rare is None else int(np.isin(raw, raw_rare).sum())}
