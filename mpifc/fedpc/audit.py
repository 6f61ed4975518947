"""Privacy audit hook: record what every rank sends, and whether it carries a raw row.

Installed on a :class:`~mpifc.runtime.transport.Transport` instance (never on the class), it
wraps ``isend``/``isend_obj`` so every message is recorded before it leaves: kind, payload class,
destination, shape, dtype, and whether the payload bytes contain any of this rank's raw data rows
(each row's float64 bytes searched in the message bytes). Rows are written per rank as JSON.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from mpifc.atomic import atomic_write_text
from mpifc.runtime.kinds import as_kind


class SendAudit:
    """Per-rank send recorder; :meth:`protect` registers the rows this rank must never send."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.records: list[dict[str, Any]] = []
        self.raw_shapes: list[list[int]] = []
        self._row_bytes: list[bytes] = []

    def protect(self, rows: np.ndarray) -> None:
        """Add rows (``(n, d)``) whose bytes must not appear in any sent message."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        self.raw_shapes.append(list(rows.shape))
        if rows.ndim == 2 and rows.shape[1] >= 2:
            self._row_bytes.extend(r.tobytes() for r in rows)

    def install(self, transport: Any) -> None:
        orig_isend, orig_isend_obj = transport.isend, transport.isend_obj

        def isend(x: Any, dest: int, kind: Any):
            arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
            self._record(kind, dest, list(arr.shape), str(arr.dtype), np.ascontiguousarray(arr).tobytes())
            return orig_isend(x, dest, kind)

        def isend_obj(obj: Any, dest: int, kind: Any):
            self._record(kind, dest, None, "pickle", pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            return orig_isend_obj(obj, dest, kind)

        transport.isend, transport.isend_obj = isend, isend_obj

    def _record(self, kind: Any, dest: int, shape: list[int] | None, dtype: str, data: bytes) -> None:
        k = as_kind(kind)
        raw = any(rb in data for rb in self._row_bytes) if self._row_bytes else False
        self.records.append({"src": self.rank, "dst": int(dest), "kind": k.name, "payload": k.payload,
                             "shape": shape, "dtype": dtype, "bytes": len(data), "contains_raw_row": raw})

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / f"audit-rank{self.rank}.json"
        return atomic_write_text(path, json.dumps({"rank": self.rank, "raw_shapes": self.raw_shapes,
                                                   "sent": self.records}, indent=0))
