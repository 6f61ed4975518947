"""Byte-counted point-to-point transport over mpi4py.

Arrays (numpy, or torch tensors, moved to the CPU) travel with the uppercase buffer API behind a
small typed header (see :mod:`mpifc.runtime.wire`); small payloads ride inside the header message
so a small message costs one MPI message. Pickling is only for small control objects
(:meth:`Transport.send_obj`), and those are counted too.

Why a large message is two MPI messages (header, then payload) and not one. One MPI message
carrying both without copying the payload needs a derived datatype over the two buffers
(``Create_hindexed`` at ``MPI.BOTTOM``). Measured with the MPICH 5 wheel on one node, such a
*send* is 2.5-5x slower than a plain ``Send`` for 1-8 MiB (a non-contiguous send buffer loses the
single-copy CMA path and goes through MPICH's packed pipeline), while the eager header message
costs no measurable bandwidth. Copying header and payload into one staging buffer costs more
than it saves. So the payload is sent from the caller's own memory, and the receiver keeps the
time between the two messages short instead (below).

Waiting and deadlines. A waiting rank spins briefly, then sleeps: MPI's own blocking wait
polls on a core for as long as the wait lasts, which on a node with more ranks than cores takes
the core from the very rank being waited for (and a rank idle for minutes would burn a core).

* Receives of one kind from one rank (or from any rank) and payload chunks wait *inside MPI*
  (``Wait``, in :meth:`Transport._guarded`), as fast as raw mpi4py, while a watchdog thread holds
  their limits (:mod:`mpifc.runtime.watchdog`): after ``spin_s`` it cancels a header receive
  (which is then posted again and polled from Python with sleeps of at most ``max_sleep_s``), at
  the deadline it cancels any receive, and it aborts the job if a receive cannot be cancelled.
* Sends and barriers cannot be cancelled, so they never wait inside MPI: they poll ``Test`` from
  Python, spinning for ``spin_s`` (yielding the core now and then), then sleeping with back-off.
* Waits over several ``(source, kind)`` pairs (:meth:`Transport.recv_any_kind`, the actor loop)
  poll ``Improbe`` the same way.

Every wait is preceded by one ``Test``: a message that is already there then skips the
watchdog and the wait (measured on a busy node: test-then-wait 1.1-1.7x faster per message than
a plain wait, for raw mpi4py as for the transport). While a wait blocks, :attr:`Transport.awaiting`
names the peer and kind it waits for (the heartbeats carry it: :mod:`mpifc.runtime.liveness`).
When a deadline passes, :class:`DeadlineExceeded` names the peer and the awaited kind.

Receive buffers: small messages are copied out of one reused header buffer; large ones land in
arrays from a :class:`~mpifc.runtime.bufpool.RecvBufferPool` (recycled once the caller drops
them), or in the caller's own ``out=`` array. With ``out=`` the payload receive is posted
together with the header receive (MPI matches one tag's messages in posting order), so a large
payload moves as soon as it arrives, as into a raw pre-posted ``Recv``; between the header's
arrival and the payload wait the transport only compares the header with the one expected for
``out`` (MPI moves data only while the receiver is inside an MPI call). A message that does not
fit ``out`` (another dtype or shape) raises ValueError; its payload is received and dropped, so
the next message of that kind arrives whole (``out``'s contents are then undefined). Only when
an *inline* message meets ``out=`` and the early payload receive has already swallowed the
message after it does the error say that the stream cannot continue (see
:meth:`Transport._recv_preposted`, :meth:`Transport._refuse`).

All ranks must use the same ``inline_max`` (a longer header message would not fit).
"""
from __future__ import annotations

import math
import os
import pickle
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
from mpi4py import MPI

from mpifc.runtime import wire
from mpifc.runtime.bufpool import RecvBufferPool
from mpifc.runtime.payload import CODE_DTYPES_BF16, as_array, byte_view, decode, to_wire_array
from mpifc.runtime.kinds import MessageKind, as_kind
from mpifc.runtime.ledger import CommLedger
from mpifc.runtime.watchdog import (IDLE as _WATCHDOG_IDLE, LONG_RECV_MAX_SLEEP_S, LONG_WAIT_MAX_SLEEP_S, backoff,
                                    new_guard, wake as _wake_watchdog)

INLINE_MAX_BYTES = 16 * 1024
CHUNK_BYTES = 1 << 30           # keeps each MPI count far below 2**31 - 1
MAX_PICKLE_BYTES = 64 << 20     # send_obj is for control messages; arrays go through send()

class DeadlineExceeded(RuntimeError):
    """A send or receive waited longer than the transport's deadline.

    After it the transport's state is undefined (messages may be half received): end the job,
    as :func:`mpifc.runtime.job.run_job` does.
    """

    brief = True  # an expected failure mode: reported in one line, without traceback


_now = time.time          # ledger clock (see mpifc.runtime.ledger); a plain alias: hot path
_perf = time.perf_counter
_HEADER_STRUCTS = wire.HEADER_STRUCTS
_DTYPE_CODES = wire.DTYPE_CODES
_CODE_DTYPES = wire.CODE_DTYPES
_HEADER_FIXED = wire.HEADER_FIXED
_MAX_NDIM = wire.MAX_NDIM
_INLINE = wire.FLAG_INLINE
_BYTE = MPI.BYTE
_MAGIC = wire.MAGIC
_VERSION = wire.VERSION
_T_SEND = struct.Struct("<d")  # a header's send time, at byte 16
_INF = float("inf")


@dataclass
class PendingSend:
    """An in-flight :meth:`Transport.isend`; keeps its buffers alive until complete."""

    requests: list[MPI.Request]
    buffers: list[Any]
    dest: int
    kind: MessageKind
    nbytes: int
    transport: "Transport" = field(repr=False)

    def done(self) -> bool:
        """True once every MPI message of this send has completed."""
        return bool(MPI.Request.Testall(self.requests))

    def wait(self) -> None:
        """Block (honouring the deadline) until the send is complete."""
        self.transport._wait_requests(self.requests, self.nbytes,
                                      lambda: f"rank {self.dest} to receive a {self.kind.name!r} message "
                                              f"({self.nbytes} bytes) from rank {self.transport.rank}",
                                      self.dest, self.kind.kind_id)


class Transport:
    """Point-to-point, byte-counted, deadline-bounded messaging between the ranks of ``comm``.

    Args:
        comm: the job's communicator (the runtime uses a private duplicate of COMM_WORLD).
        ledger: where received messages are recorded; sends are counted per destination.
        deadline: seconds any single send or receive may wait before :class:`DeadlineExceeded`.
        spin_s: seconds a wait for a message spins before it starts sleeping.
        max_sleep_s: longest sleep between two polls once backed off, s.
        inline_max: payloads up to this many bytes travel inside the header message.
        chunk_bytes: payloads above this size are split into MPI messages of at most this size.
    """

    def __init__(self, comm: MPI.Comm, ledger: CommLedger, deadline: float = 300.0, *,
                 spin_s: float = 20e-3, max_sleep_s: float = 2e-3,
                 inline_max: int = INLINE_MAX_BYTES, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.comm = comm
        self.ledger = ledger
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.deadline = float(deadline) if deadline and deadline > 0 else float("inf")
        self.spin_s = spin_s
        # Yield the core every 64 polls while spinning: on an oversubscribed node the peer we
        # wait for may need it (measured: clearly better than pure spinning on this machine).
        self.yield_in_spin = True
        self.max_sleep_s = max_sleep_s
        self.inline_max = int(inline_max)
        self.chunk_bytes = int(chunk_bytes)
        if self.chunk_bytes <= 0 or self.chunk_bytes > (1 << 31) - 1:
            raise ValueError(f"chunk_bytes must be in 1..2**31-1, got {chunk_bytes}")
        tag_ub = comm.Get_attr(MPI.TAG_UB)
        if tag_ub is not None and tag_ub < (1 << 15) - 1:
            raise RuntimeError(f"this MPI's MPI_TAG_UB is {tag_ub}, below the standard's 32767")
        self._status = MPI.Status()
        self._pstatus = MPI.Status()  # of a single-chunk payload receive
        # Blocking waits happen inside MPI, guarded by the watchdog thread (needs THREAD_MULTIPLE);
        # otherwise they fall back to polling from Python.
        self._guard = new_guard(self.rank) if MPI.Query_thread() == MPI.THREAD_MULTIPLE else None
        # Called as hook(kind, dest, wire_array, is_pickle) before every send, on every path
        # (privacy audits); wire_array is the pickle's bytes as uint8 for send_obj.
        self.send_hooks: list[Callable[[MessageKind, int, np.ndarray, bool], None]] = []
        # One reusable buffer for header messages (header + inline payload); every rank must use
        # the same inline_max, since a longer header message would not fit.
        self._hbuf = bytearray(wire.header_size(wire.MAX_NDIM) + self.inline_max)
        self._sbuf = bytearray(len(self._hbuf))  # blocking small sends pack here
        self._smv = memoryview(self._sbuf)
        self._send_statuses = [MPI.Status()]  # of one send request (_send_large waits for one at a time)
        self._hmv = memoryview(self._hbuf)
        self.pool = RecvBufferPool()  # big receives reuse buffers their arrays no longer hold
        self._to_self: list[PendingSend] = []   # sends to this rank, kept alive until received
        # Messages per (peer, kind id), both directions: lets an actor's shutdown say how many
        # messages of each kind preceded it (MPI orders messages only within one tag).
        self.sent_counts: dict[tuple[int, int], int] = {}
        self.received_counts: dict[tuple[int, int], int] = {}
        # recv(out=): the expected header bytes per (kind id, dtype, shape); see _recv_preposted.
        self._expected_headers: dict[tuple[int, np.dtype, tuple[int, ...]], tuple[bytes, bytes, int]] = {}
        # While a wait blocks: (peer rank or -1 for any / -2 for all, kind id) it waits for.
        self.awaiting: tuple[int, int] | None = None

    # ------------------------------------------------------------------------------- sending
    def send(self, x: Any, dest: int, kind: MessageKind | str) -> None:
        """Send an array or tensor to ``dest`` and return once MPI has taken it (deadline-bounded).

        A send to this rank itself returns at once (MPI completes it only when received).
        """
        if "isend" in self.__dict__:
            # isend was replaced on this instance (e.g. by an audit wrapper): route through it.
            self._complete_send(self.isend(x, dest, kind))
            return
        k = kind if type(kind) is MessageKind else as_kind(kind)
        if type(x) is np.ndarray and x.flags.c_contiguous and x.ndim <= _MAX_NDIM:
            arr, code, flags = x, _DTYPE_CODES.get(x.dtype), 0
            if code is None:
                arr, code, flags = to_wire_array(x)
        else:
            arr, code, flags = to_wire_array(x)
        nbytes = arr.nbytes
        if self.send_hooks:
            for hook in self.send_hooks:
                hook(k, dest, arr, False)
        if nbytes > self.inline_max or dest == self.rank or not 0 <= dest < self.size:
            if nbytes <= self.chunk_bytes and dest != self.rank and 0 <= dest < self.size:
                self._send_large(arr, code, flags, nbytes, dest, k)
            else:
                self._complete_send(self._isend_array(arr, code, flags, dest, k, hooked=True))
            return
        # Small message, the hot path: header and payload in one MPI message from a reusable
        # buffer (safe: we wait for completion before returning), no bookkeeping objects, and
        # everything but packing done after the message is on its way.
        ndim = arr.ndim
        hlen = _HEADER_FIXED + 8 * ndim
        _HEADER_STRUCTS[ndim].pack_into(self._sbuf, 0, _MAGIC, _VERSION, code, ndim, flags | _INLINE, 0,
                                        k.kind_id, 0, 0, _now(), nbytes, *arr.shape)
        if nbytes:
            self._smv[hlen: hlen + nbytes] = memoryview(arr).cast("B")
        req = self.comm.Isend([self._sbuf, hlen + nbytes, _BYTE], dest, k.kind_id)
        self._count_send(dest, k.kind_id, nbytes, hlen)
        if not req.Test():
            self._wait_requests([req], nbytes, lambda: f"rank {dest} to receive a {k.name!r} message "
                                                       f"({nbytes} bytes) from rank {self.rank}", dest, k.kind_id)

    def _send_large(self, arr: np.ndarray, code: int, flags: int, nbytes: int, dest: int, k: MessageKind) -> None:
        """Blocking send of a one-chunk payload (to another rank): what :meth:`_isend_array` does,
        without its per-message objects (the header is packed into the reusable send buffer, safe
        since we wait for completion before returning)."""
        ndim = arr.ndim
        hlen = _HEADER_FIXED + 8 * ndim
        tag = k.kind_id
        _HEADER_STRUCTS[ndim].pack_into(self._sbuf, 0, _MAGIC, _VERSION, code, ndim, flags, 0,
                                        tag, 1, 0, _now(), nbytes, *arr.shape)
        comm = self.comm
        hreq = comm.Isend([self._sbuf, hlen, _BYTE], dest, tag)
        preq = comm.Isend([arr, nbytes, _BYTE], dest, tag)
        # One request at a time: Test/Wait on one request cost mpi4py about half of Testall/
        # Waitall on a list (measured 0.75 vs 1.9 us per call), and the header, an eager message,
        # is complete by the time the payload is. The counting is done after the first test,
        # while the receiver answers the payload's rendezvous, not between the posts and the test.
        done = preq.Test()
        self._count_send(dest, tag, nbytes, hlen)
        if not done:  # (below the MPI's eager limit it is complete at once)
            self._wait_requests([preq], nbytes, lambda: f"rank {dest} to receive a {k.name!r} message "
                                                        f"({nbytes} bytes) from rank {self.rank}", dest, tag)
        if not hreq.Test():
            self._wait_requests([hreq], 0, lambda: f"rank {dest} to receive a {k.name!r} message "
                                                   f"header from rank {self.rank}", dest, tag)

    def _count_send(self, dest: int, kind_id: int, nbytes: int, hlen: int) -> None:
        self.ledger.count_sent(dest, nbytes, hlen)
        key = (dest, kind_id)
        self.sent_counts[key] = self.sent_counts.get(key, 0) + 1

    def _complete_send(self, pending: PendingSend) -> None:
        if pending.dest != self.rank:
            pending.wait()
            return
        self._to_self = [p for p in self._to_self if not p.done()]
        self._to_self.append(pending)

    def isend(self, x: Any, dest: int, kind: MessageKind | str) -> PendingSend:
        """Start sending an array or tensor; ``x`` must not be modified until the send is done."""
        arr, code, flags = to_wire_array(x)
        return self._isend_array(arr, code, flags, dest, as_kind(kind))

    def send_obj(self, obj: Any, dest: int, kind: MessageKind | str) -> None:
        """Send a small picklable control object (counted like any message)."""
        self._complete_send(self.isend_obj(obj, dest, kind))

    def isend_obj(self, obj: Any, dest: int, kind: MessageKind | str) -> PendingSend:
        """Non-blocking :meth:`send_obj`."""
        k = as_kind(kind)
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_PICKLE_BYTES:
            raise ValueError(f"{k.name!r}: pickled object of {len(data)} bytes exceeds {MAX_PICKLE_BYTES}; "
                             f"send arrays with send()")
        arr = np.frombuffer(data, dtype=np.uint8)
        return self._isend_array(arr, wire.DTYPE_CODES[np.dtype(np.uint8)], wire.FLAG_PICKLE, dest, k)

    def _isend_array(self, arr: np.ndarray, code: int, flags: int, dest: int, kind: MessageKind,
                     hooked: bool = False) -> PendingSend:
        self._check_peer(dest, "send to")
        if self.send_hooks and not hooked:
            for hook in self.send_hooks:
                hook(kind, dest, arr, bool(flags & wire.FLAG_PICKLE))
        nbytes = arr.nbytes
        hlen = wire.header_size(arr.ndim)
        tag = kind.tag
        t_send = _now()
        if nbytes <= self.inline_max:
            buf = bytearray(hlen + nbytes)
            wire.pack_header(buf, code, arr.shape, flags | wire.FLAG_INLINE, kind.kind_id, 0, t_send, nbytes)
            if nbytes:
                buf[hlen:] = byte_view(arr)
            reqs = [self.comm.Isend([buf, len(buf), MPI.BYTE], dest, tag)]
            buffers: list[Any] = [buf]
        else:
            n_chunks = -(-nbytes // self.chunk_bytes)
            buf = bytearray(hlen)
            wire.pack_header(buf, code, arr.shape, flags, kind.kind_id, n_chunks, t_send, nbytes)
            view = byte_view(arr)
            reqs = [self.comm.Isend([buf, hlen, MPI.BYTE], dest, tag)]
            for c in range(n_chunks):
                lo = c * self.chunk_bytes
                piece = view[lo: lo + self.chunk_bytes]
                reqs.append(self.comm.Isend([piece, len(piece), MPI.BYTE], dest, tag))
            buffers = [buf, arr]
        self._count_send(dest, kind.kind_id, nbytes, hlen)
        return PendingSend(reqs, buffers, dest, kind, nbytes, self)

    # ----------------------------------------------------------------------------- receiving
    def recv(self, source: int, kind: MessageKind | str, out: np.ndarray | None = None) -> np.ndarray:
        """Receive the next ``kind`` array from ``source``.

        Args:
            source: the sending rank.
            kind: the message kind awaited.
            out: optional C-contiguous array of the sender's dtype and shape to receive into
                (saves allocating and page-faulting a fresh array in hot loops).

        Returns:
            A writable numpy array with the sender's dtype and shape (``out`` itself if given;
            bfloat16 comes back as float32; use :meth:`recv_tensor` to keep it).
        """
        k = kind if type(kind) is MessageKind else as_kind(kind)
        if (type(out) is np.ndarray and self.inline_max < out.nbytes <= self.chunk_bytes and self._guard is not None
                and type(source) is int and 0 <= source < self.size):
            # recv(out=) of a large array, the hot loop's case: straight to the pre-posted path
            # (the same test as in _recv_posted, without its extra call and repeated checks).
            f = out.flags
            if f.c_contiguous and f.writeable:
                value, flags = self._recv_preposted(source, k, out)
                return value if not flags & (wire.FLAG_PICKLE | wire.FLAG_BF16) else as_array(value, flags, k)
        value, flags = self._recv_posted(source, k, out)
        if flags & (wire.FLAG_PICKLE | wire.FLAG_BF16):
            return as_array(value, flags, k)
        return value

    def recv_tensor(self, source: int, kind: MessageKind | str, device: Any = None) -> Any:
        """Receive the next ``kind`` array from ``source`` as a torch tensor on ``device``."""
        import torch

        k = as_kind(kind)
        value, flags = self._recv_posted(source, k, None)
        if flags & wire.FLAG_PICKLE:
            raise TypeError(f"{k.name!r} from rank {source}: expected an array, got a pickled object")
        if flags & wire.FLAG_BF16:
            t = torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(value)
        return t.to(device) if device is not None else t

    def recv_obj(self, source: int, kind: MessageKind | str) -> Any:
        """Receive the next ``kind`` message from ``source``: the object (or array) sent."""
        value, flags = self._recv_posted(source, as_kind(kind), None)
        return decode(value, flags)

    def recv_any(self, kind: MessageKind | str, sources: Iterable[int] | None = None) -> tuple[int, Any]:
        """Receive the next ``kind`` message from any rank (or any of ``sources``).

        Returns:
            ``(source rank, value)``: value is an array, or the object for pickled messages.
        """
        k = as_kind(kind)
        if sources is None:
            value, flags, src = self._recv_posted(MPI.ANY_SOURCE, k, None, want_source=True)
            return src, decode(value, flags)
        srcs = list(sources)
        src, _, value, flags = self._recv_probed([(s, k) for s in srcs], lambda: self._waiting_for(srcs, [k]))
        return src, decode(value, flags)

    def recv_any_kind(self, kinds: Iterable[MessageKind | str], sources: Iterable[int] | None = None
                      ) -> tuple[int, MessageKind, Any]:
        """Receive the next message of any of ``kinds`` from any rank (or any of ``sources``).

        Returns:
            ``(source rank, kind, value)``.
        """
        ks = [as_kind(k) for k in kinds]
        srcs = None if sources is None else list(sources)
        pairs = [(s, k) for k in ks for s in (srcs if srcs is not None else [MPI.ANY_SOURCE])]
        src, k, value, flags = self._recv_probed(pairs, lambda: self._waiting_for(srcs, ks))
        return src, k, decode(value, flags)

    def try_recv(self, source: int, kind: MessageKind | str) -> tuple[bool, Any]:
        """Non-blocking: ``(True, value)`` if a ``kind`` message from ``source`` had arrived (it is
        then received in full), else ``(False, None)``."""
        k = as_kind(kind)
        self._check_peer(source, "receive from")
        status = self._status
        msg = self.comm.Improbe(source, k.tag, status)
        if msg is None:
            return False, None
        count = status.Get_count(MPI.BYTE)
        msg.Recv([self._hbuf, count, MPI.BYTE])
        value, flags = self._take_payload(count, source, k, None)
        return True, decode(value, flags)

    def flush(self) -> None:
        """Wait (deadline-bounded) until every send to this rank itself has been received."""
        for p in self._to_self:
            p.wait()
        self._to_self.clear()

    def unreceived(self) -> tuple[int, str] | None:
        """``(source rank, kind name)`` of a message that has arrived here and was never received,
        or None (only messages already delivered to this rank are seen)."""
        found = self.unreceived_tag()
        if found is None:
            return None
        source, tag = found
        try:
            from mpifc.runtime.kinds import kind_by_id

            name = kind_by_id(tag).name
        except KeyError:
            name = f"tag {tag}"
        return source, name

    def unreceived_tag(self) -> tuple[int, int] | None:
        """``(source rank, tag)`` of a message that has arrived here and was never received, or
        None (a probe: safe from another thread, e.g. the heartbeats')."""
        status = MPI.Status()
        if not self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            return None
        return status.Get_source(), status.Get_tag()

    def barrier(self) -> None:
        """A barrier over the communicator that honours the deadline (not counted: no payload)."""
        req = self.comm.Ibarrier()
        self._wait_requests([req], 0,
                            lambda: f"every rank to reach a barrier (rank {self.rank} waited)", -2, 0)

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's picklable ``obj`` on ``root`` (collective; a list in rank order there, None
        elsewhere). Bookkeeping, not counted in the ledger; the waits poll with sleeps like
        :meth:`barrier` (a blocking collective would keep this rank's heartbeats from running)."""
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.zeros(self.size if self.rank == root else 1, dtype=np.int64)
        mine = np.array([data.size], dtype=np.int64)
        describe = lambda: f"every rank to reach the gather to rank {root} (rank {self.rank} waited)"  # noqa: E731
        self._wait_requests([self.comm.Igather(mine, sizes if self.rank == root else None, root=root)], 0,
                            describe, -2, 0)
        if self.rank != root:
            self._wait_requests([self.comm.Igatherv(data, None, root=root)], 0, describe, -2, 0)
            return None
        buf = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._wait_requests([self.comm.Igatherv(data, [buf, sizes, offsets, MPI.BYTE], root=root)], 0,
                            describe, -2, 0)
        return [pickle.loads(buf[o: o + n].tobytes()) for o, n in zip(offsets.tolist(), sizes.tolist())]

    def allreduce_max(self, value: int) -> int:
        """The largest ``value`` over every rank (collective; polled like :meth:`barrier`)."""
        out = np.zeros(1, dtype=np.int64)
        self._wait_requests([self.comm.Iallreduce(np.array([value], dtype=np.int64), out, op=MPI.MAX)], 0,
                            lambda: f"every rank to reach a reduction (rank {self.rank} waited)", -2, 0)
        return int(out[0])

    # -------------------------------------------------------------------------------- helpers
    def _check_peer(self, peer: int, verb: str) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: cannot {verb} rank {peer}: the job has ranks 0..{self.size - 1}")

    def _waiting_for(self, sources: list[int] | None, kinds: list[MessageKind]) -> str:
        who = "any rank" if sources is None else (
            f"rank {sources[0]}" if len(sources) == 1 else f"any of ranks {sources}")
        what = " or ".join(repr(k.name) for k in kinds)
        return f"a {what} message from {who}"

    def _poll(self, test: Callable[[], bool], spin_s: float, deadline: float | None = None,
              long_max_s: float = LONG_WAIT_MAX_SLEEP_S) -> bool:
        """Call ``test`` until it is true (-> True) or the deadline passes (-> False).

        Spins for ``spin_s`` first (latency), yielding the core every few polls as MPICH's own
        blocking calls do, so that on an oversubscribed node the peer we wait for gets to run;
        then sleeps with back-off (:func:`mpifc.runtime.watchdog.backoff`: up to ``max_sleep_s``,
        then longer as the wait lasts, up to ``long_max_s``), so a rank that waits long for a
        computing peer does not burn a core.
        """
        if test():
            return True
        t0 = time.perf_counter()
        deadline_at = t0 + (self.deadline if deadline is None else deadline)
        spin_until = t0 + spin_s
        sleep = 20e-6
        polls = 0
        backing_off = spin_s <= 0
        while not test():
            if backing_off:
                time.sleep(sleep)
                now = time.perf_counter()
                sleep = backoff(sleep, now - t0, self.max_sleep_s, long_max_s)
                if now >= deadline_at:
                    return False
                continue
            polls += 1
            if polls & 63 == 0:
                now = time.perf_counter()
                if now >= deadline_at:
                    return False
                if now >= spin_until:
                    backing_off = True
                elif self.yield_in_spin:
                    os.sched_yield()
        return True

    def _recv_posted(self, source: int, kind: MessageKind, out: np.ndarray | None,
                     want_source: bool = False) -> Any:
        """Receive one message with a posted ``Irecv`` of the header (the low-latency path)."""
        if source != MPI.ANY_SOURCE and not 0 <= source < self.size:
            self._check_peer(source, "receive from")
        if (out is not None and self.inline_max < out.nbytes <= self.chunk_bytes and source != MPI.ANY_SOURCE
                and self._guard is not None and type(out) is np.ndarray and out.flags.c_contiguous
                and out.flags.writeable):
            return self._recv_preposted(source, kind, out)
        status = self._status
        req = self.comm.Irecv([self._hbuf, len(self._hbuf), _BYTE], source, kind.kind_id)
        if not req.Test(status):
            self._wait_header(req, source, kind)
        count = status.Get_count(_BYTE)
        src = status.Get_source() if source == MPI.ANY_SOURCE else source
        value, flags = self._take_payload(count, src, kind, out)
        return (value, flags, src) if want_source else (value, flags)

    def _recv_preposted(self, source: int, kind: MessageKind, out: np.ndarray) -> tuple[np.ndarray, int]:
        """Receive into ``out`` (one payload chunk, not inline) with header *and* payload receives
        posted up front.

        MPI matches messages of one ``(source, tag)`` in the order the receives were posted, so the
        header message lands in the header buffer and the payload in ``out``. Posted before the
        header has arrived, the payload receive is matched (and the data starts moving into
        ``out``) as soon as MPI sees the payload, as with a raw ``Recv`` into a preallocated buffer,
        instead of only once the header has been read in Python.
        If the header then does not describe ``out``, :meth:`_take_payload` handles it: another
        dtype or shape is a ValueError after the message's payload has been received and dropped
        (:meth:`_refuse`); the same dtype and shape sent inline or in several chunks (ranks that
        disagree on ``inline_max``/``chunk_bytes``) is received the usual way if the early receive
        could still be cancelled. Only an early receive that swallowed the message *after* an
        inline one leaves the stream unusable, and the error says so.
        """
        status, tag, comm, hbuf, nbytes = self._status, kind.kind_id, self.comm, self._hbuf, out.nbytes
        # The header that describes ``out`` (all but its send time) is known before anything
        # arrives, so between the header's arrival and the payload wait there are only two byte
        # comparisons (MPI moves the payload only while we are inside an MPI call).
        key = (tag, out.dtype, out.shape)
        expected = self._expected_headers.get(key)
        if expected is None:
            expected = self._expected_header(key)
        head, tail, hlen = expected
        req = comm.Irecv([hbuf, len(hbuf), _BYTE], source, tag)
        pre = comm.Irecv([out, nbytes, _BYTE], source, tag)
        if not req.Test(status):
            # What _wait_header does, inline (measured 1.4-1.9 -> 0.8-0.85 us of Python around the Wait):
            # wait inside MPI with the watchdog armed (callers come here only with it), which
            # cancels the payload receive first (see _wait_header).
            guard, t0, state = self._guard, _perf(), [False, False]
            guard.armed = ([pre, req], t0 + self.spin_s, t0 + self.deadline, self.deadline,
                           lambda: self._waiting_for([source], [kind]), state)
            if _WATCHDOG_IDLE[0]:
                _wake_watchdog()
            self.awaiting = (source, tag)
            try:
                req.Wait(status)
            finally:
                guard.armed = None
            if state[0] or state[1] or status.Is_cancelled():
                # The watchdog fired (a long wait): the general path sorts out what it cancelled.
                try:
                    if not self._after_guarded_header_wait(req, source, kind, pre, state, t0):
                        pre = None  # cancelled while waiting long for the header: receive the payload later
                finally:
                    self.awaiting = None
            self.awaiting = None
        count = status.Get_count(_BYTE)
        if pre is None or count != hlen or hbuf[:16] != head or hbuf[24:hlen] != tail:
            # Not the expected header (or the early payload receive is gone): the general path
            # parses it, then takes the payload, falls back or fails clearly.
            return self._take_payload(count, source, kind, out, pre)
        pstatus = self._pstatus
        done = pre.Test(pstatus)
        if not done:
            # What _wait_prepost does, inline (this runs while the payload moves): the guarded
            # wait inside MPI (callers come here only with the watchdog).
            describe = lambda: f"the payload of a {kind.name!r} message ({nbytes} bytes) from rank {source}"  # noqa: E731
            state = [False, False]
            guard = self._guard
            guard.armed = ([pre], _INF, _perf() + self.deadline, self.deadline, describe, state)
            if _WATCHDOG_IDLE[0]:
                _wake_watchdog()
            try:
                pre.Wait(pstatus)
            finally:
                guard.armed = None
            if pstatus.Is_cancelled():
                if state[1]:
                    raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")
                done = True  # cancelled before the deadline: see below
        if done and pstatus.Is_cancelled():
            # Cancelled: a soft-limit cancel of the header wait that raced with the header's
            # arrival (it matched nothing): post the payload receive again.
            describe = lambda: f"the payload of a {kind.name!r} message ({nbytes} bytes) from rank {source}"  # noqa: E731
            self._block([comm.Irecv([out, nbytes, _BYTE], source, tag)], [pstatus], describe)
        got = pstatus.Get_count(_BYTE)
        if got != nbytes:
            raise wire.WireError(f"rank {self.rank}: {kind.name!r} from rank {source}: received {got} payload "
                                 f"bytes, header announced {nbytes}")
        self.ledger.record(tag, source, got, count, 2, _T_SEND.unpack_from(hbuf, 16)[0], _now())
        key = (source, tag)
        self.received_counts[key] = self.received_counts.get(key, 0) + 1
        return out, 0

    def _expected_header(self, key: tuple[int, np.dtype, tuple[int, ...]]) -> tuple[bytes, bytes, int]:
        """For ``(kind id, dtype, shape)`` of an ``out=`` array: the bytes a one-chunk header for it
        carries before and after its send time (header bytes 0-15 and 24-end), and its length."""
        tag, dtype, shape = key
        code = _DTYPE_CODES.get(dtype)
        if code is None or len(shape) > _MAX_NDIM:
            return b"", b"", -1  # no header describes such an out=: the general path says why
        buf = bytearray(wire.header_size(len(shape)))
        hlen = wire.pack_header(buf, code, shape, 0, tag, 1, 0.0, dtype.itemsize * math.prod(shape))
        if len(self._expected_headers) >= 64:  # a few out= layouts per job: keep the cache small
            self._expected_headers.clear()
        value = self._expected_headers[key] = (bytes(buf[:16]), bytes(buf[24:hlen]), hlen)
        return value

    def _wait_header(self, req: MPI.Request, source: int, kind: MessageKind,
                     pre: MPI.Request | None = None) -> bool:
        """Wait (deadline-bounded) until the posted header receive ``req`` completes into
        ``self._status``; DeadlineExceeded when the deadline passes first.

        ``pre`` is a payload receive posted right after ``req`` (same source and tag), or None.
        Returns False if ``pre`` was cancelled on the way (a long wait: it is then gone), else True.
        """
        status = self._status
        who = None if source == MPI.ANY_SOURCE else [source]
        describe = lambda: self._waiting_for(who, [kind])  # noqa: E731
        t0 = _perf()
        self.awaiting = (source if source != MPI.ANY_SOURCE else -1, kind.kind_id)
        try:
            if self._guard is not None:
                # Wait inside MPI with the watchdog armed. It cancels in list order: the payload
                # receive first, so that no header message can slip into it between the two cancels
                # (matching follows posting order).
                state = self._guarded([req], [status], describe, soft_at=t0 + self.spin_s,
                                      cancel=None if pre is None else [pre, req])
                return self._after_guarded_header_wait(req, source, kind, pre, state, t0)
            return self._poll_header(req, source, kind, pre, self.spin_s, pre is not None, t0)
        finally:
            self.awaiting = None

    def _after_guarded_header_wait(self, req: MPI.Request, source: int, kind: MessageKind,
                                   pre: MPI.Request | None, state: list[bool], t0: float) -> bool:
        """The rest of :meth:`_wait_header` after its wait inside MPI (armed at ``t0``, watchdog
        ``state``) returned: same return value and errors."""
        status = self._status
        if not status.Is_cancelled():
            # The header came. If the watchdog fired meanwhile it may have cancelled ``pre``.
            return pre is None or not (state[0] or state[1]) or self._prepost_alive(pre)
        if pre is not None:
            # The header receive was cancelled, so it never matched, so neither did ``pre``
            # (cancelled first): this completes at once, as cancelled.
            pre.Wait()
        if state[1]:
            who = None if source == MPI.ANY_SOURCE else [source]
            raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for "
                                   f"{self._waiting_for(who, [kind])}")
        # Past the soft limit: the watchdog cancelled MPI's busy wait. Post the receive
        # again (nothing was lost) and poll from Python with sleeps for the rest of the
        # deadline (MPI's wait did the spinning).
        req = self.comm.Irecv([self._hbuf, len(self._hbuf), _BYTE], source, kind.kind_id)
        return self._poll_header(req, source, kind, pre, 0.0, False, t0)

    def _poll_header(self, req: MPI.Request, source: int, kind: MessageKind, pre: MPI.Request | None,
                     spin: float, alive: bool, t0: float) -> bool:
        """Poll the header receive ``req`` from Python until the deadline counted from ``t0`` (when
        the wait began); ``alive``: whether ``pre`` is still posted. Returns it as :meth:`_wait_header`."""
        status = self._status
        who = None if source == MPI.ANY_SOURCE else [source]
        describe = lambda: self._waiting_for(who, [kind])  # noqa: E731
        left = self.deadline - (_perf() - t0)
        # one message from one peer: the rarer polls of a long receive (mpifc.runtime.watchdog)
        if not self._poll(lambda: req.Test(status), spin, deadline=left, long_max_s=LONG_RECV_MAX_SLEEP_S):
            if alive:
                pre.Cancel()  # first, as the watchdog does
            req.Cancel()
            req.Wait(status)
            if status.Is_cancelled():
                if alive:
                    pre.Wait()
                raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")
            if alive:
                alive = self._prepost_alive(pre)
        return alive

    def _wait_prepost(self, pre: MPI.Request, describe: Callable[[], str]) -> bool:
        """Wait (deadline-bounded) for the pre-posted payload receive ``pre`` into ``self._pstatus``.

        Returns False if it turns out cancelled before its deadline: a soft-limit cancel of the
        header wait that raced with the header's arrival (a cancelled receive matched nothing, so
        the caller simply posts the payload receive again).
        """
        state = self._guarded([pre], [self._pstatus], describe)
        if not self._pstatus.Is_cancelled():
            return True
        if state[1]:
            raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")
        return False

    def _prepost_alive(self, pre: MPI.Request) -> bool:
        """Whether a pre-posted payload receive that the watchdog may have cancelled is still
        usable: False if the cancel took (the request is then freed), True if it had matched."""
        st = self._pstatus
        if pre.Get_status(st) and st.Is_cancelled():  # Get_status: complete? (does not free it)
            pre.Wait()
            return False
        return True

    def _drop_prepost(self, pre: MPI.Request, src: int, kind: MessageKind) -> int | None:
        """Cancel a pre-posted payload receive the header turned out not to fit.

        Returns None if the cancel took (it received nothing), else the bytes it had already
        received from ``src``: the message right after the header (-1: that message was longer
        than ``out``; MPI truncated it, which consumes it all the same).
        """
        pst = self._pstatus
        pre.Cancel()
        # An unmatched receive completes (as cancelled) at once; a matched one once its data is
        # in, which the deadline bounds like any wait.
        describe = lambda: f"a receive into out= of a {kind.name!r} message from rank {src} to end"  # noqa: E731
        try:
            self._guarded([pre], [pst], describe)
        except MPI.Exception:
            return -1
        return None if pst.Is_cancelled() else pst.Get_count(_BYTE)

    @staticmethod
    def _took_next(problem: str, src: int, took: int) -> ValueError:
        """The error for a receive into out= that swallowed the message after an inline one."""
        what = "more bytes than out= holds" if took < 0 else f"{took} bytes"
        return ValueError(f"{problem}; the receive posted into out= had already taken the following MPI message "
                          f"from rank {src} ({what}), so the message stream cannot continue")

    def _refuse(self, problem: str, src: int, kind: MessageKind, pre: MPI.Request | None, n_chunks: int
                ) -> ValueError:
        """The error for a message (with ``n_chunks`` payload messages after its header; 0 when
        inline) that does not fit ``out=``, after making sure the message stream can go on: the
        early payload receive is cancelled, and payload chunks still on their way are received and
        dropped (a zero-byte receive: MPI truncates the message, which consumes it), so the next
        message of this kind arrives whole. ``out``'s contents are then undefined.
        """
        took = None if pre is None else self._drop_prepost(pre, src, kind)
        if n_chunks <= 0:  # nothing follows the header: what the early receive took is the next message
            return ValueError(problem) if took is None else self._took_next(problem, src, took)
        # The early receive, if it matched, took this message's first chunk (it follows the header).
        self._discard(src, kind, n_chunks - (0 if took is None else 1))
        return ValueError(f"{problem} (the message was received and dropped)")

    def _discard(self, src: int, kind: MessageKind, n: int) -> None:
        """Receive and drop the next ``n`` MPI messages of ``kind`` from ``src`` (deadline-bounded)."""
        for _ in range(n):
            req = self.comm.Irecv([self._hbuf, 0, _BYTE], src, kind.kind_id)
            try:
                self._block([req], [MPI.Status()], lambda: f"the rest of a refused {kind.name!r} message "
                                                           f"from rank {src}")
            except MPI.Exception as e:
                if e.Get_error_class() != MPI.ERR_TRUNCATE:
                    raise

    def _recv_probed(self, pairs: list[tuple[int, MessageKind]], describe: Callable[[], str]
                     ) -> tuple[int, MessageKind, np.ndarray, int]:
        """Receive one message matching any ``(source, kind)`` pair (``Improbe`` polling)."""
        comm, status = self.comm, self._status
        for s, _ in pairs:
            if s != MPI.ANY_SOURCE:
                self._check_peer(s, "receive from")
        found: list[Any] = []

        def probe() -> bool:
            for src, k in pairs:
                msg = comm.Improbe(src, k.tag, status)
                if msg is not None:
                    found.append((msg, k))
                    return True
            return False

        if not probe():
            srcs = {s for s, _ in pairs}
            kinds = {k.kind_id for _, k in pairs}
            self.awaiting = (srcs.pop() if len(srcs) == 1 else -1, kinds.pop() if len(kinds) == 1 else 0)
            try:
                if not self._poll(probe, self.spin_s):
                    raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")
            finally:
                self.awaiting = None
        msg, k = found[0]
        count, src = status.Get_count(MPI.BYTE), status.Get_source()
        if count > len(self._hbuf):
            raise wire.WireError(f"rank {self.rank}: {k.name!r} from rank {src}: header message of {count} "
                                 f"bytes exceeds {len(self._hbuf)} (do the ranks use the same inline_max?)")
        msg.Recv([self._hbuf, count, MPI.BYTE])
        value, flags = self._take_payload(count, src, k, None)
        return src, k, value, flags

    def _take_payload(self, count: int, src: int, kind: MessageKind, out: np.ndarray | None,
                      pre: MPI.Request | None = None) -> tuple[np.ndarray, int]:
        """Given a header message of ``count`` bytes in ``self._hbuf``: take its payload (inline or
        by receiving the chunks), record the ledger row.

        ``pre``: a receive of the payload into ``out`` posted before the header came (see
        :meth:`_recv_preposted`), or None.
        """
        key = (src, kind.kind_id)
        self.received_counts[key] = self.received_counts.get(key, 0) + 1
        hbuf = self._hbuf
        try:
            code, shape, flags, kind_id, n_chunks, t_send, nbytes, hlen = wire.unpack_header(hbuf, count)
            if kind_id != kind.kind_id:
                raise wire.WireError(f"rank {self.rank}: header from rank {src} says kind id {kind_id}, "
                                     f"expected {kind.name!r} ({kind.kind_id})")
            dtype = CODE_DTYPES_BF16.get(code) if flags & wire.FLAG_BF16 else _CODE_DTYPES.get(code)
            if dtype is None:
                raise wire.WireError(f"rank {self.rank}: unknown dtype code {code} from rank {src}")
        except wire.WireError as e:
            # Not an mpifc header: nothing is known of what follows it.
            took = None if pre is None else self._drop_prepost(pre, src, kind)
            if took is not None:
                raise self._took_next(str(e), src, took) from None
            raise
        if out is not None and (out.dtype != dtype or out.shape != shape or not out.flags.c_contiguous
                                or not out.flags.writeable):
            problem = (f"rank {self.rank}: {kind.name!r} from rank {src} is {dtype}{list(shape)}; "
                       f"out= is {out.dtype}{list(out.shape)}"
                       f"{'' if out.flags.c_contiguous else ' (not C-contiguous)'}")
            raise self._refuse(problem, src, kind, pre, 0 if flags & _INLINE else n_chunks)
        if pre is not None and (flags & _INLINE or n_chunks != 1):
            # Same dtype and shape but another layout on the wire (the ranks disagree on
            # inline_max or chunk_bytes): drop the early receive, take the message the usual way.
            took = self._drop_prepost(pre, src, kind)
            if took is not None:
                problem = (f"rank {self.rank}: {kind.name!r} from rank {src}: "
                           f"{'an inline' if flags & _INLINE else f'a {n_chunks}-chunk'} message where out= "
                           f"expected one payload message (do the ranks use the same inline_max and chunk_bytes?)")
                if flags & _INLINE or n_chunks <= 0:
                    raise self._took_next(problem, src, took)
                self._discard(src, kind, n_chunks - 1)  # the early receive took the first chunk
                raise ValueError(f"{problem} (the message was received and dropped)")
            pre = None
        if flags & _INLINE:
            if count - hlen != nbytes or nbytes % dtype.itemsize:
                raise wire.WireError(f"rank {self.rank}: {kind.name!r} from rank {src}: header says "
                                     f"{nbytes} payload bytes of {dtype}, message carries {count - hlen}")
            # The header buffer is reused by the next receive, so the payload is copied out: into
            # out=, or into a new bytearray (one copy, no zero-fill) that the array then wraps.
            if out is None:
                arr = np.frombuffer(hbuf[hlen:count], dtype)
                if len(shape) != 1:
                    arr = arr.reshape(shape)
            else:
                arr = out
                if nbytes:
                    memoryview(out).cast("B")[:] = self._hmv[hlen:count]
            self.ledger.record(kind_id, src, nbytes, hlen, 1, t_send, _now())
            return arr, flags
        arr = self.pool.empty(shape, dtype) if out is None else out
        if arr.nbytes != nbytes:
            raise wire.WireError(f"rank {self.rank}: {kind.name!r} from rank {src}: shape {shape} of "
                                 f"{dtype} is not {nbytes} bytes")
        comm, tag, chunk = self.comm, kind.kind_id, self.chunk_bytes
        describe = lambda: f"the payload of a {kind.name!r} message ({nbytes} bytes) from rank {src}"  # noqa: E731
        if n_chunks == 1:
            # The payload is already on its way: as little as possible between the header and
            # this receive (the array itself is the buffer; no byte view).
            statuses = [self._pstatus]
            if pre is None or not self._wait_prepost(pre, describe):
                req = comm.Irecv([arr, nbytes, _BYTE], src, tag)
                # One poll before the guarded wait: the payload usually follows its header at once, and
                # a test that completes it skips arming the watchdog (and, on a busy node, MPI's
                # blocking wait, measured slower there than test-then-wait).
                if not req.Test(statuses[0]):
                    self._block([req], statuses, describe)
        else:
            view = byte_view(arr)
            reqs = [comm.Irecv([view[c * chunk: (c + 1) * chunk], min(chunk, max(nbytes - c * chunk, 0)), _BYTE],
                               src, tag) for c in range(n_chunks)]
            statuses = [MPI.Status() for _ in reqs]
            if not MPI.Request.Testall(reqs, statuses):
                self._block(reqs, statuses, describe)
        got = 0
        for st in statuses:
            got += st.Get_count(_BYTE)
        if got != nbytes:
            raise wire.WireError(f"rank {self.rank}: {kind.name!r} from rank {src}: received {got} payload "
                                 f"bytes, header announced {nbytes}")
        self.ledger.record(kind_id, src, got, count, 1 + n_chunks, t_send, _now())
        return arr, flags

    def _wait_requests(self, reqs: list[MPI.Request], nbytes: int, describe: Callable[[], str],
                       peer: int = -1, kind_id: int = 0) -> None:
        """Wait for send (or barrier) requests under the deadline: ``Test`` polled from Python,
        spinning for ``spin_s``, then sleeping (these cannot be cancelled, so they never wait inside
        MPI, which would spin on a core for as long as the peer takes). ``peer``/``kind_id``: what
        the wait is for (:attr:`awaiting`)."""
        if len(reqs) == 1:
            test = reqs[0].Test
        else:
            test = lambda: MPI.Request.Testall(reqs)  # noqa: E731
        if test():
            return
        self.awaiting = (peer, kind_id)
        try:
            ok = self._poll(test, self.spin_s)
        finally:
            self.awaiting = None
        if not ok:
            raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")

    def _guarded(self, reqs: list[MPI.Request], statuses: list[MPI.Status], describe: Callable[[], str],
                 soft_at: float = _INF, cancel: list[MPI.Request] | None = None) -> list[bool]:
        """Wait inside MPI until every request in ``reqs`` is complete or cancelled (filling
        ``statuses``), with the watchdog armed (:mod:`mpifc.runtime.watchdog`; needs the guard).

        The one place the transport blocks in MPI. The watchdog cancels ``cancel`` (default
        ``reqs``), in list order, at the deadline, and also at ``soft_at`` (a ``perf_counter``
        time; none by default). Returns the watchdog's ``[soft limit hit, deadline hit]``: the
        caller tells a completed request from a cancelled one by its status. MPI errors (e.g. a
        truncated receive) propagate as ``MPI.Exception``, with the watchdog disarmed.
        """
        state = [False, False]
        guard = self._guard
        if guard is None:  # only where a plain wait cannot hang (callers poll otherwise)
            MPI.Request.Waitall(reqs, statuses)
            return state
        guard.armed = (reqs if cancel is None else cancel, soft_at, _perf() + self.deadline, self.deadline,
                       describe, state)
        if _WATCHDOG_IDLE[0]:
            _wake_watchdog()
        try:
            if len(reqs) == 1:
                reqs[0].Wait(statuses[0])  # cheaper than Waitall for one request
            else:
                MPI.Request.Waitall(reqs, statuses)
        finally:
            guard.armed = None
        return state

    def _block(self, reqs: list[MPI.Request], statuses: list[MPI.Status], describe: Callable[[], str]) -> None:
        """Wait for all ``reqs`` (filling ``statuses``); DeadlineExceeded when the deadline passes.

        Waits inside MPI with the watchdog armed (see :mod:`mpifc.runtime.watchdog`); without
        MPI_THREAD_MULTIPLE it polls from Python instead and cancels at the deadline.
        """
        if self._guard is not None:
            self._guarded(reqs, statuses, describe)
            for st in statuses:
                if st.Is_cancelled():
                    raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")
            return
        if self._poll(lambda: MPI.Request.Testall(reqs, statuses), self.spin_s):
            return
        for r in reqs:
            try:
                r.Cancel()
            except MPI.Exception:
                pass
        # A request that completed while we cancelled is fine; anything else is the deadline.
        if not MPI.Request.Testall(reqs, statuses) or any(st.Is_cancelled() for st in statuses):
            raise DeadlineExceeded(f"deadline of {self.deadline:g} s passed waiting for {describe()}")

__all__ = ["Transport", "DeadlineExceeded", "PendingSend", "INLINE_MAX_BYTES", "CHUNK_BYTES"]
