"""Heartbeats: every rank shows it is alive; a rank that stops answering ends the job in seconds.

A time limit on a wait cannot tell a frozen peer from one doing long, honest work. Liveness
can: a daemon thread per rank sends a
small heartbeat every ``S / 6`` seconds (``S`` = ``--liveness``, default 10) on a communicator of
its own, and a rank that hears nothing from a peer for ``S`` minus one period ends the job with
one line naming the silent rank and the phase it last announced::

    mpifc: rank 2 stopped answering in phase 'learn' (no heartbeat for 8.4 s, --liveness 10; seen by rank 0); ending the job

Topology: a star. Every rank beats to rank 0 and rank 0 beats to every rank, so rank 0 judges
every client and every client judges rank 0 (when rank 0 falls silent, the lowest client ends
the job first; the others wait a little longer, so one line is printed). A heartbeat carries the
rank's state (running its job function, done with it, past the job's last barrier), the phase it
announced (:meth:`Liveness.enter`) and the message it is blocked on, if any (the transport
notes the peer and kind of every wait that blocks). That catches a rank that *ended early*:
when a rank waits for a message from a peer that has already returned from its job function
for a few heartbeats, the message will never come, and the job ends with::

    mpifc: rank 2 ended its job in phase 'learn' while rank 0 waits for a 'fc.train.counts' message from it; ending the job

Rank 0 also sees a job where every rank waits for another and none sends (a deadlock): when
every rank has been blocked in a wait, with no message received or sent by any, for ``S``::

    mpifc: every rank waits and none sends (rank 0 waits on rank 1 (a 'fc.train.counts' message); rank 1 waits on rank 0 (a 'fc.train.model' message)); ending the job

So no wait needs a time limit: a peer that computes for hours is alive and not waiting, and
is waited for as long as it takes (``--deadline`` is a wall-clock limit on the whole job, which
the user sets).

What a heartbeat thread can and cannot see:

* a frozen process (SIGSTOP), a killed one, a rank whose process exited, a rank that returned
  early: seen within ``S`` (a killed or exited rank is in practice ended faster by the launcher,
  and named by the node sentinel, :mod:`mpifc.runtime.sentinel`);
* a rank whose heartbeat thread cannot run because native code holds the GIL: on a rank's own
  node the judge then looks at the rank's process in ``/proc`` (from its second missed beat on,
  :class:`mpifc.runtime.sentinel.Activity`): while it works (CPU time grows, or it is running),
  it is busy, not frozen, and is waited for, however long a GIL hold an oversubscribed node
  stretches. A
  frozen (SIGSTOP), sleeping or ended process shows no work and is named within ``S``. A rank
  on another node is judged by its heartbeats alone (its own node's sentinel sees it frozen or
  killed). The flip side: native code in an endless loop holding the GIL looks busy on its own
  node, as the next case does everywhere;
* a rank stuck in native code that has released the GIL (a deadlock inside a library, a
  livelocked MPI call): its heartbeat thread keeps beating, and it looks exactly like a long
  computation. The job's ``--deadline`` is the outer bound for that case.

Before MPI is up (the launcher has started the processes but ``MPI_Init`` has not returned)
the ranks are watched by the node sentinel instead (:mod:`mpifc.runtime.node`).
"""
from __future__ import annotations

import struct
import threading
import time
from typing import Any, Callable

from mpifc.runtime.early import DEFAULT_LIMIT_S  # noqa: F401 - the default --liveness

RUNNING, DONE, FINAL, LEFT = 0, 1, 2, 3
# LEFT: done, with a message sent to it that it never received (it skipped part of the protocol);
# its heartbeats then carry that message's source and kind where a wait's would be.
STATE_NAMES = {RUNNING: "running", DONE: "done", FINAL: "final", LEFT: "done, a message never received"}
NOBODY = -1        # awaiting: not blocked on a message
EVERYONE = -2      # awaiting: a barrier (no single peer to blame)

_BEAT = struct.Struct("<iiiiii24s")  # kind, seq, state, awaited rank, awaited kind id, progress, phase
_KIND_BEAT, _KIND_NOTICE = 1, 2
_TAG_BEAT, _TAG_NOTICE = 1, 2


class PeerView:
    """What this rank last heard from one peer."""

    __slots__ = ("last_seen", "state", "done_since", "awaiting", "awaiting_kind", "phase", "progress",
                 "blocked_since", "activity")

    def __init__(self, now: float) -> None:
        self.last_seen = now
        self.state = RUNNING
        self.done_since = 0.0
        self.awaiting = NOBODY
        self.awaiting_kind = 0
        self.phase = "startup"
        self.progress = -1
        self.blocked_since: float | None = None  # waiting, with no message in or out, since
        self.activity: Any = None  # its process's work, watched while it is silent (on this node)

    def update_blocked(self, awaiting: int, kind: int, progress: int, now: float) -> None:
        """Track how long this rank has waited (for ``awaiting``/``kind``) without progress."""
        if awaiting == NOBODY or progress != self.progress or (awaiting, kind) != (self.awaiting, self.awaiting_kind):
            self.blocked_since = now if awaiting != NOBODY else None
        self.awaiting, self.awaiting_kind, self.progress = awaiting, kind, progress


class Liveness:
    """The heartbeat thread of one rank (see the module docstring).

    Args:
        world: the job's world communicator; the heartbeats run on a duplicate of it (collective).
        limit_s: ``S``: a peer silent this long (minus one period) ends the job.
        node: the rank's :class:`~mpifc.runtime.node.NodeView`, or None.
        transport: the job's transport, whose ``awaiting`` says what a blocked wait waits for.
        on_silent: called with the line that ends the job (it must end the process:
            :func:`mpifc.runtime.failure.abort_with_line` in a job).
    """

    def __init__(self, world: Any, limit_s: float, node: Any = None, transport: Any = None,
                 on_silent: Callable[[str], None] | None = None) -> None:
        self.comm = world.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.limit = float(limit_s)
        self.period = max(self.limit / 6.0, 0.02)
        self.silence = self.limit - self.period
        # A waiter is blamed on a peer that ended only after a few of its heartbeats (a message
        # the peer sent just before it ended is still delivered meanwhile).
        self.grace = 2.0 * self.period + 0.2
        self.node = node
        self.transport = transport
        self.on_silent = on_silent
        self.phase = "startup"
        self.state = RUNNING
        self.peers = list(range(1, self.size)) if self.rank == 0 else ([0] if self.size > 1 else [])
        # Clients judging rank 0: the lowest speaks first, the others only if it could not.
        self.extra = 0.0 if self.rank <= 1 else min(self.rank - 1, 4) * max(self.period, 0.25)
        self._seq = 0
        self._lock = threading.Lock()  # beats go out from the thread and from enter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._recv: dict[int, Any] = {}
        self._rbuf: dict[int, bytearray] = {}
        self._send: dict[int, Any] = {}
        self._sbuf: dict[int, bytearray] = {}
        self._notice_req: Any = None
        self._notice_buf = bytearray(_BEAT.size)
        self._notices: list[tuple[Any, bytearray]] = []
        self.views: dict[int, PeerView] = {}
        self.me = PeerView(time.perf_counter())  # this rank's own waits (rank 0 judges deadlocks)
        self._left: tuple[int, int] | None = None  # a message never received, once the job returned

    # -- what the rank announces ------------------------------------------------------------
    def enter(self, phase: str) -> None:
        """Announce the rank's current phase: a heartbeat goes out at once, so the peers know it
        even if the rank freezes the next moment."""
        self.phase = phase
        if self.node is not None:
            self.node.enter(phase)
        self._beat_now()

    def set_state(self, state: int) -> None:
        """``DONE`` once the job function returned (the phase stays the one it last announced),
        ``FINAL`` past the job's last barrier; a heartbeat goes out at once."""
        self.state = state
        self._beat_now()

    def _beat_now(self) -> None:
        if self._thread is not None and not self._stop.is_set():
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the thread's next beat will do
                pass

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        if not self.peers:
            return
        from mpi4py import MPI

        now = time.perf_counter()
        for p in self.peers:
            self.views[p] = PeerView(now)
            self._rbuf[p] = bytearray(_BEAT.size)
            self._recv[p] = self.comm.Irecv([self._rbuf[p], MPI.BYTE], p, _TAG_BEAT)
            self._sbuf[p] = bytearray(_BEAT.size)
        self._notice_req = self.comm.Irecv([self._notice_buf, MPI.BYTE], MPI.ANY_SOURCE, _TAG_NOTICE)
        self._thread = threading.Thread(target=self._run, name="mpifc-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and judging (every rank, after the job's last barrier); frees the
        communicator."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for req in list(self._recv.values()) + ([self._notice_req] if self._notice_req is not None else []):
            try:
                req.Cancel()
                req.Wait()
            except Exception:  # noqa: BLE001 - completed meanwhile: nothing to cancel
                pass
        for req in self._send.values():
            if req is not None:
                req.Test()  # small eager messages: complete; never wait on a peer here
        self._recv.clear()
        try:
            self.comm.Free()
        except Exception:  # noqa: BLE001
            pass

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.period):
            now = time.perf_counter()
            if now - last > self.silence / 2:
                # This thread itself did not run (the process was stopped, or starved): what it
                # did not hear meanwhile says nothing about the peers.
                for v in self.views.values():
                    v.last_seen = max(v.last_seen, now)
            last = now
            try:
                self._drain(now)
                self._beat()
                verdict = self._judge(now)
            except Exception:  # noqa: BLE001 - MPI is being torn down (an abort elsewhere)
                return
            if verdict is not None and not self._stop.is_set() and self.on_silent is not None:
                self.on_silent(verdict)
                return

    def _drain(self, now: float) -> None:
        from mpi4py import MPI

        for p, req in self._recv.items():
            while req.Test():
                kind, _, state, awaiting, awaiting_kind, progress, phase = _BEAT.unpack_from(self._rbuf[p])
                v = self.views[p]
                v.last_seen = now
                v.activity = None
                if state != RUNNING and v.state == RUNNING:
                    v.done_since = now
                v.state = state
                v.update_blocked(awaiting, awaiting_kind, progress, now)
                v.phase = phase.rstrip(b"\0").decode("utf-8", "replace") or v.phase
                req = self._recv[p] = self.comm.Irecv([self._rbuf[p], MPI.BYTE], p, _TAG_BEAT)
        while self._notice_req is not None and self._notice_req.Test():
            if self.node is not None:
                self.node.mark_abort()
            self._notice_req = self.comm.Irecv([self._notice_buf, MPI.BYTE], MPI.ANY_SOURCE, _TAG_NOTICE)

    def _awaiting(self) -> tuple[int, int]:
        t = self.transport
        a = getattr(t, "awaiting", None) if t is not None else None
        return a if a is not None else (NOBODY, 0)

    def _progress(self) -> int:
        t = self.transport
        ledger = getattr(t, "ledger", None) if t is not None else None
        return ledger.messages() & 0x7FFFFFFF if ledger is not None else 0

    def _beat(self) -> None:
        from mpi4py import MPI

        with self._lock:
            self._seq += 1
            state, (src, kind) = self.state, self._awaiting()
            if state == DONE and self._left_behind() is not None:
                state, (src, kind) = LEFT, self._left
            progress = self._progress()
            phase = self.phase.encode("utf-8", "replace")[:24]
            for p in self.peers:
                req = self._send.get(p)
                if req is not None and not req.Test():
                    continue  # the peer has not taken the last one: it is judged by its own silence
                _BEAT.pack_into(self._sbuf[p], 0, _KIND_BEAT, self._seq, state, src, kind, progress, phase)
                self._send[p] = self.comm.Isend([self._sbuf[p], MPI.BYTE], p, _TAG_BEAT)

    def _left_behind(self) -> tuple[int, int] | None:
        """Once this rank's job function has returned: ``(source, kind id)`` of a message sent to
        it that it never received, or None (kept once found)."""
        if self._left is None:
            probe = getattr(self.transport, "unreceived_tag", None)
            self._left = probe() if probe is not None else None
        return self._left

    def _judge(self, now: float) -> str | None:
        """The line that ends the job, or None while everyone answers."""
        for p in self.peers:
            v = self.views[p]
            age = now - v.last_seen
            if v.state != FINAL and age > 2.0 * self.period and self._works_here(p, v, now):
                continue  # its heartbeat thread is starved, not the rank (see _works_here)
            if v.state != FINAL and age > self.silence + (self.extra if p == 0 else 0.0):
                phase = repr(v.phase) if v.state == RUNNING else f"'teardown' (its job ended in phase {v.phase!r})"
                return (f"mpifc: rank {p} stopped answering in phase {phase} (no heartbeat for {age:.1f} s, "
                        f"--liveness {self.limit:g}; seen by rank {self.rank}); ending the job")
        me_src, me_kind = self._awaiting()
        waits = [(self.rank, me_src, me_kind)] + [(p, v.awaiting, v.awaiting_kind) for p, v in self.views.items()
                                                  if v.state != LEFT]
        for waiter, src, kind in waits:
            if src < 0 or src == waiter or src == self.rank or src not in self.views:
                continue
            v = self.views[src]
            if v.state != RUNNING and now - v.done_since > self.grace + (self.extra if src == 0 else 0.0):
                return (f"mpifc: rank {src} ended its job in phase {v.phase!r} while rank {waiter} waits for "
                        f"{_kind_name(kind)} from it; ending the job")
        return self._deadlock(now, me_src, me_kind) if self.rank == 0 else None

    def _deadlock(self, now: float, me_src: int, me_kind: int) -> str | None:
        """Rank 0: the line for a job whose every rank has waited for ``S`` with no message in or
        out anywhere (nobody is left to send), or None."""
        self.me.update_blocked(me_src, me_kind, self._progress(), now)
        ranks = [(0, self.me)] + sorted(self.views.items())
        if len(ranks) < 2 or any(v.state == FINAL or v.blocked_since is None or now - v.blocked_since < self.limit
                                 for _, v in ranks):
            return None
        states = [(0, self.state, self.phase, (me_src, me_kind))] + [
            (r, v.state, v.phase, (v.awaiting, v.awaiting_kind)) for r, v in ranks[1:]]
        ended = [s for s in states if s[1] != RUNNING]
        waiting = [s for s in states if s[1] == RUNNING]
        if ended and waiting:
            # A rank that returned from its job early (its part of the protocol skipped) leaves the
            # others waiting for what it never sent: it is the one to name.
            (r, _, phase, _), (w, _, _, wait) = ended[0], waiting[0]
            return (f"mpifc: rank {r} ended its job in phase {phase!r} while rank {w} "
                    f"{describe_wait(w, wait)}; ending the job")
        left = [(r, v.phase, (v.awaiting, v.awaiting_kind)) for r, v in ranks[1:] if v.state == LEFT]
        if self.state == DONE and self._left is not None:
            left.insert(0, (0, self.phase, self._left))
        if left:
            # Everyone waits because this rank returned from its job before receiving what was
            # sent to it: its part of the protocol was skipped.
            r, phase, (src, kind) = left[0]
            return (f"mpifc: rank {r} ended its job in phase {phase!r} without receiving {_kind_name(kind)} "
                    f"from rank {src} (its part of the protocol skipped); ending the job")
        waits = [f"rank {r} {describe_wait(r, (v.awaiting, v.awaiting_kind))}" for r, v in ranks[:4]]
        more = f"; and {len(ranks) - 4} more ranks" if len(ranks) > 4 else ""
        return f"mpifc: every rank waits and none sends ({'; '.join(waits)}{more}); ending the job"

    def _works_here(self, p: int, v: PeerView, now: float) -> bool:
        """Whether silent peer ``p`` runs on this node and its process has worked within the
        silence limit (:class:`mpifc.runtime.sentinel.Activity`, sampled once a period from its
        second missed beat on): native code holding the GIL, stretched by an oversubscribed node,
        starves its heartbeat thread, not its work. A stopped, sleeping or ended process shows
        no work and is named on time; a peer on another node is judged by its heartbeats alone."""
        if self.node is None:
            return False
        if v.activity is None:
            pid = self.node.local_pids().get(p)
            if pid is None:
                return False
            from mpifc.runtime.sentinel import Activity

            v.activity = Activity(pid, now)
            return False
        return v.activity.idle_for(now) < self.silence

    def describe_ranks(self, most: int = 4) -> str:
        """What this rank and the peers it hears do (phase, and the wait, if any), in words."""
        src, kind = self._awaiting()
        states = [(self.rank, self.phase, (src, kind))] + [(p, v.phase, (v.awaiting, v.awaiting_kind))
                                                          for p, v in sorted(self.views.items())]
        words = [f"rank {r} in phase {ph!r} {describe_wait(r, w) or 'computes'}" for r, ph, w in states[:most]]
        more = f"; and {len(states) - most} more ranks" if len(states) > most else ""
        return "; ".join(words) + more

    # -- the abort path ----------------------------------------------------------------------
    def announce_abort(self) -> None:
        """Tell every rank the job is failing (their node sentinels then stay quiet); does not wait."""
        from mpi4py import MPI

        buf = bytearray(_BEAT.size)
        _BEAT.pack_into(buf, 0, _KIND_NOTICE, 0, self.state, NOBODY, 0, b"")
        for r in range(self.size):
            if r != self.rank:
                try:
                    self._notices.append((self.comm.Isend([buf, MPI.BYTE], r, _TAG_NOTICE), buf))
                except Exception:  # noqa: BLE001
                    return


def describe_wait(rank: int, awaiting: tuple[int, int] | None) -> str:
    """What a rank's wait waits for, in words (``""`` when it is not waiting)."""
    src, kind = awaiting if awaiting is not None else (NOBODY, 0)
    if src == NOBODY:
        return ""
    if src == EVERYONE:
        return "waits on every rank (a barrier or a collective)"
    return f"waits on {'any rank' if src < 0 else f'rank {src}'} ({_kind_name(kind)})"


def _kind_name(kind_id: int) -> str:
    if kind_id <= 0:
        return "a message"
    try:
        from mpifc.runtime.kinds import kind_by_id

        return f"a {kind_by_id(kind_id).name!r} message"
    except Exception:  # noqa: BLE001 - a kind this process does not know
        return f"a message of kind id {kind_id}"


_current: Liveness | None = None


def current() -> Liveness | None:
    """The heartbeats of the job this process runs, if any."""
    return _current


def set_current(live: Liveness | None) -> None:
    global _current
    _current = live
