"""A communicator proxy that records MPI's own byte count of every message it receives.

Used by tests to check the ledger against ``Status.Get_count(MPI.BYTE)`` without trusting the
transport's bookkeeping: before each receive the transport posts (``Irecv``) or matches
(``Improbe``), the proxy looks at the incoming message with a blocking ``Probe`` of its own and
notes the size MPI reports. (Only for tests with known senders: it probes before receiving.)
"""
from __future__ import annotations

from typing import Any

from mpi4py import MPI


class CountingComm:
    """Forwards everything to ``comm``; ``counts`` lists ``(source, tag, bytes)`` per MPI message."""

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm = comm
        self.counts: list[tuple[int, int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def Improbe(self, source: int, tag: int, status: MPI.Status | None = None) -> Any:
        st = MPI.Status() if status is None else status
        msg = self._comm.Improbe(source, tag, st)
        if msg is not None:
            self.counts.append((st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)))
        return msg

    def Irecv(self, buf: Any, source: int, tag: int) -> MPI.Request:
        st = MPI.Status()
        self._comm.Probe(source, tag, st)
        self.counts.append((st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)))
        return self._comm.Irecv(buf, source, tag)
