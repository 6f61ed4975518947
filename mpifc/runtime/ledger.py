"""The communication ledger: one row per message that crossed between ranks.

Who records a row: the **receiver**, once the whole message (header and payload) has arrived. It
then knows everything: the sender's clock at send time (``t_send`` travels in the header), its
own clock at receipt (``t_recv``) and the byte counts MPI reports for each part
(``Status.Get_count(MPI.BYTE)``), so a row's ``payload_bytes + header_bytes`` is exactly what MPI
moved for that message. The sender only counts messages and bytes per destination
(:attr:`CommLedger.sent`), which lets :meth:`LedgerSummary.unreceived` spot messages never
received. The phase of a row is the receiver's phase at receipt.

Clocks are ``time.time()`` (seconds since the epoch): on one node every rank reads the same clock;
across nodes they agree only as far as NTP keeps them, so ``t_recv - t_send`` is exact on one node
and approximate across nodes.

Rows live in a preallocated buffer that grows by doubling, viewed as a numpy structured array:
recording a message is one ``struct.pack_into`` into that buffer, no Python object per message.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpifc.atomic import OutputKind, atomic_write_text
from mpifc.runtime.kinds import kind_by_id

ROW_DTYPE = np.dtype([
    ("phase", np.uint16),          # index into the recording rank's phase table
    ("kind", np.uint16),           # MessageKind.kind_id
    ("src", np.int32),
    ("dst", np.int32),
    ("payload_bytes", np.int64),   # bytes of the data itself
    ("header_bytes", np.int64),    # bytes of the typed header (kind, dtype, shape, t_send)
    ("n_mpi_messages", np.int32),  # MPI messages the logical message took (1 inline, 2+ otherwise)
    ("t_send", np.float64),        # sender's time.time() when it posted the message, s
    ("t_recv", np.float64),        # receiver's time.time() when the message was complete, s
])

# The same layout as ROW_DTYPE (packed, little-endian fields as on the hosts mpifc runs on):
# record() writes a row with one pack_into.
_ROW_STRUCT = struct.Struct("=HHiiqqidd")
_ROW_BYTES = _ROW_STRUCT.size
if _ROW_BYTES != ROW_DTYPE.itemsize:  # pragma: no cover - a platform with other alignment rules
    raise ImportError(f"ledger row struct is {_ROW_BYTES} bytes, ROW_DTYPE {ROW_DTYPE.itemsize}")

CSV_COLUMNS = ("phase", "kind", "payload_class", "src", "dst", "payload_bytes", "header_bytes",
               "total_bytes", "n_mpi_messages", "t_send", "t_recv", "latency_s")


def is_ledger_file(path: str | Path) -> bool:
    """Whether ``path`` is a ledger CSV, judged by its header line (:data:`CSV_COLUMNS`)."""
    try:
        with open(path, "rb") as f:
            return f.readline(1024).rstrip(b"\r\n") == ",".join(CSV_COLUMNS).encode()
    except OSError:
        return False


LEDGER_OUTPUT = OutputKind("a ledger (per-message CSV)", is_ledger_file)
"""``--ledger``: may replace only an earlier ledger."""


class CommLedger:
    """Per-rank message ledger.

    Args:
        rank: this rank in the job's communicator.
        size: number of ranks (sizes the per-destination send counters).
        capacity: initial number of rows; doubles when full.
    """

    def __init__(self, rank: int, size: int, capacity: int = 1024) -> None:
        self.rank = rank
        self.size = size
        self._buf = bytearray(max(capacity, 1) * _ROW_BYTES)
        self._rows = np.frombuffer(self._buf, dtype=ROW_DTYPE)
        self._capacity = len(self._rows)
        self._n = 0
        self._pack = _ROW_STRUCT.pack_into
        self._phases: list[str] = ["default"]
        self._phase_index: dict[str, int] = {"default": 0}
        self.phase_id = 0
        # _sent[d] = [messages, payload bytes, header bytes] this rank sent to rank d (plain ints:
        # cheaper to bump per message than numpy scalars).
        self._sent = [[0, 0, 0] for _ in range(size)]

    # -- phases -------------------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        """Rows recorded from now on belong to phase ``name`` (e.g. ``"structure"``, ``"upward"``)."""
        pid = self._phase_index.get(name)
        if pid is None:
            pid = len(self._phases)
            if pid > np.iinfo(np.uint16).max:
                raise ValueError("too many ledger phases (more than 65535 distinct names)")
            self._phases.append(name)
            self._phase_index[name] = pid
        self.phase_id = pid

    @property
    def phase(self) -> str:
        """Name of the current phase."""
        return self._phases[self.phase_id]

    @property
    def phase_names(self) -> list[str]:
        """This rank's phase table: row ``phase`` field indexes into it."""
        return list(self._phases)

    # -- recording (hot path) -----------------------------------------------------------------
    def record(self, kind_id: int, src: int, payload_bytes: int, header_bytes: int,
               n_mpi_messages: int, t_send: float, t_recv: float) -> None:
        """Append one received message (this rank is the destination)."""
        n = self._n
        if n == self._capacity:
            self._grow()
        self._pack(self._buf, n * _ROW_BYTES, self.phase_id, kind_id, src, self.rank, payload_bytes, header_bytes,
                   n_mpi_messages, t_send, t_recv)
        self._n = n + 1

    def _grow(self) -> None:
        # A new buffer (the old one may be exported to views of rows handed out earlier).
        buf = bytearray(2 * len(self._buf))
        buf[: len(self._buf)] = self._buf
        self._buf = buf
        self._rows = np.frombuffer(buf, dtype=ROW_DTYPE)
        self._capacity = len(self._rows)

    def count_sent(self, dst: int, payload_bytes: int, header_bytes: int) -> None:
        """Count one message this rank sent to ``dst``."""
        s = self._sent[dst]
        s[0] += 1
        s[1] += payload_bytes
        s[2] += header_bytes

    @property
    def sent(self) -> np.ndarray:
        """``(size, 3)`` int64: messages, payload bytes, header bytes this rank sent to each rank."""
        return np.array(self._sent, dtype=np.int64).reshape(self.size, 3)

    # -- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def rows(self) -> np.ndarray:
        """The recorded rows, a view ``(n_rows,)`` of :data:`ROW_DTYPE`."""
        return self._rows[: self._n]

    def local_table(self) -> "LedgerTable":
        """This rank's rows with phase names resolved."""
        return LedgerTable.from_parts([(self.rows.copy(), self.phase_names, self.sent.copy(), self.rank)])

    def write_csv(self, path: str | Path) -> Path:
        """Write this rank's rows (LEAF style, atomically); use :meth:`gather` for the whole job."""
        return self.local_table().write_csv(path)

    def summary(self) -> "LedgerSummary":
        """Per-link / per-phase / per-kind totals of this rank's rows."""
        return self.local_table().summary()

    def gather(self, transport: Any, root: int = 0) -> "LedgerTable | None":
        """Collect every rank's rows on ``root`` (collective: every rank must call it), through
        ``transport`` (:meth:`~mpifc.runtime.transport.Transport.gather_obj`: polled, so the
        heartbeats keep running while a slow rank is awaited).

        The gather itself is bookkeeping after the job's protocol and is not recorded.

        Returns:
            The merged :class:`LedgerTable` on ``root``, ``None`` elsewhere.
        """
        parts = transport.gather_obj((self.rows.copy(), self.phase_names, self.sent.copy(), self.rank), root=root)
        if parts is None:
            return None
        return LedgerTable.from_parts(parts)

    def messages(self) -> int:
        """Messages this rank has received and sent so far (a progress count for the heartbeats)."""
        return self._n + sum(s[0] for s in self._sent)


@dataclass
class LedgerTable:
    """All rows of a job (or of one rank), with phase names made global.

    Attributes:
        rows: ``(n_rows,)`` of :data:`ROW_DTYPE`, ``phase`` indexing :attr:`phases`; sorted by
            ``t_recv``.
        phases: global phase names.
        sent: ``(n_ranks, n_ranks, 3)`` int64: ``sent[s, d] = (messages, payload bytes, header
            bytes)`` that rank ``s`` sent to ``d`` (rows for ranks not gathered are zero).
    """

    rows: np.ndarray
    phases: list[str]
    sent: np.ndarray

    @classmethod
    def from_parts(cls, parts: list[tuple[np.ndarray, list[str], np.ndarray, int]]) -> "LedgerTable":
        """Merge per-rank ``(rows, phase_names, sent, rank)`` tuples, remapping phase ids."""
        phases: list[str] = []
        index: dict[str, int] = {}
        merged = []
        n_ranks = max(len(p[2]) for p in parts) if parts else 0
        sent = np.zeros((n_ranks, n_ranks, 3), dtype=np.int64)
        for rows, names, rank_sent, rank in parts:
            remap = np.zeros(max(len(names), 1), dtype=np.uint16)
            for i, name in enumerate(names):
                if name not in index:
                    index[name] = len(phases)
                    phases.append(name)
                remap[i] = index[name]
            r = rows.copy()
            r["phase"] = remap[r["phase"]]
            merged.append(r)
            sent[rank, : len(rank_sent)] = rank_sent
        all_rows = np.concatenate(merged) if merged else np.zeros(0, dtype=ROW_DTYPE)
        all_rows = all_rows[np.argsort(all_rows["t_recv"], kind="stable")]
        return cls(rows=all_rows, phases=phases, sent=sent)

    def kind_names(self) -> list[str]:
        """Kind name of each row (``"id:<n>"`` for ids not registered on this rank)."""
        out = []
        cache: dict[int, str] = {}
        for kid in self.rows["kind"].tolist():
            if kid not in cache:
                try:
                    cache[kid] = kind_by_id(kid).name
                except KeyError:
                    cache[kid] = f"id:{kid}"
            out.append(cache[kid])
        return out

    def to_csv_text(self) -> str:
        """LEAF-style CSV: one row per message, kinds and phases by name."""
        buf = io.StringIO()
        import csv

        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        kinds = self.kind_names()
        for r, kname in zip(self.rows.tolist(), kinds):
            phase, kid, src, dst, pb, hb, nm, ts, tr = r
            try:
                pclass = kind_by_id(kid).payload
            except KeyError:
                pclass = "unknown"
            w.writerow((self.phases[phase], kname, pclass, src, dst, pb, hb, pb + hb, nm,
                        f"{ts:.6f}", f"{tr:.6f}", f"{tr - ts:.6e}"))
        return buf.getvalue()

    def write_csv(self, path: str | Path) -> Path:
        """Write :meth:`to_csv_text` atomically to ``path``; returns the path."""
        return atomic_write_text(path, self.to_csv_text())

    def summary(self) -> "LedgerSummary":
        """Totals per link ``(src, dst)``, per phase and per kind."""
        return LedgerSummary.of(self)


@dataclass
class LedgerSummary:
    """Per-link, per-phase and per-kind totals of a :class:`LedgerTable`.

    Each entry of the three lists is a dict with the group's key fields and ``messages``,
    ``payload_bytes``, ``header_bytes``, ``total_bytes``.
    """

    per_link: list[dict[str, Any]]
    per_phase: list[dict[str, Any]]
    per_kind: list[dict[str, Any]]
    unreceived: list[dict[str, Any]]

    @classmethod
    def of(cls, table: LedgerTable) -> "LedgerSummary":
        rows = table.rows
        kinds = np.asarray(table.kind_names(), dtype=object)

        def group(keys: list[np.ndarray], names: list[str]) -> list[dict[str, Any]]:
            out: dict[tuple, list[int]] = {}
            for i, key in enumerate(zip(*[k.tolist() for k in keys])):
                acc = out.setdefault(key, [0, 0, 0])
                acc[0] += 1
                acc[1] += int(rows["payload_bytes"][i])
                acc[2] += int(rows["header_bytes"][i])
            return [dict(zip(names, key), messages=m, payload_bytes=p, header_bytes=h, total_bytes=p + h)
                    for key, (m, p, h) in sorted(out.items())]

        per_link = group([rows["src"], rows["dst"]], ["src", "dst"])
        phase_names = np.asarray(table.phases, dtype=object)[rows["phase"]] if len(rows) else np.zeros(0, object)
        per_phase = group([phase_names], ["phase"])
        per_kind = group([kinds], ["kind"])
        # Messages a sender counted but no receiver recorded (only meaningful for gathered tables).
        received = {(d["src"], d["dst"]): d["messages"] for d in per_link}
        unreceived = []
        n = table.sent.shape[0]
        for s in range(n):
            for d in range(n):
                m = int(table.sent[s, d, 0])
                if m and m != received.get((s, d), 0):
                    unreceived.append({"src": s, "dst": d, "sent": m, "received": received.get((s, d), 0)})
        return cls(per_link=per_link, per_phase=per_phase, per_kind=per_kind, unreceived=unreceived)

    def to_csv_text(self) -> str:
        """One CSV: ``group,key,messages,payload_bytes,header_bytes,total_bytes`` with ``group`` in
        ``link`` (key ``src->dst``), ``phase``, ``kind``."""
        buf = io.StringIO()
        import csv

        w = csv.writer(buf, lineterminator="\n")
        w.writerow(("group", "key", "messages", "payload_bytes", "header_bytes", "total_bytes"))
        for d in self.per_link:
            w.writerow(("link", f"{d['src']}->{d['dst']}", d["messages"], d["payload_bytes"],
                        d["header_bytes"], d["total_bytes"]))
        for d in self.per_phase:
            w.writerow(("phase", d["phase"], d["messages"], d["payload_bytes"], d["header_bytes"], d["total_bytes"]))
        for d in self.per_kind:
            w.writerow(("kind", d["kind"], d["messages"], d["payload_bytes"], d["header_bytes"], d["total_bytes"]))
        return buf.getvalue()

    def write_csv(self, path: str | Path) -> Path:
        """Write :meth:`to_csv_text` atomically."""
        return atomic_write_text(path, self.to_csv_text())

    def to_table(self) -> str:
        """Human-readable text table (per link, then per phase)."""
        lines = [f"{'link':>10} {'messages':>9} {'payload B':>12} {'header B':>10} {'total B':>12}"]
        for d in self.per_link:
            lines.append(f"{str(d['src']) + '->' + str(d['dst']):>10} {d['messages']:>9} "
                         f"{d['payload_bytes']:>12} {d['header_bytes']:>10} {d['total_bytes']:>12}")
        lines.append(f"{'phase':>10} {'messages':>9} {'payload B':>12} {'header B':>10} {'total B':>12}")
        for d in self.per_phase:
            lines.append(f"{d['phase']:>10} {d['messages']:>9} {d['payload_bytes']:>12} "
                         f"{d['header_bytes']:>10} {d['total_bytes']:>12}")
        for d in self.unreceived:
            lines.append(f"warning: rank {d['src']} sent {d['sent']} messages to rank {d['dst']}, "
                         f"which received {d['received']}")
        return "\n".join(lines)
