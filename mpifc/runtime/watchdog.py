"""Deadlines for blocking MPI waits: a watchdog thread cancels a wait that outlives its deadline.

Polling an MPI request from Python is far slower than waiting inside MPI, above all on a busy
node (MPI's own wait loop polls in C and yields the core cleverly). So the transport waits
inside MPI (``Waitall``) and *arms* a guard with the requests and the deadline; one daemon
thread per process looks at the armed guards every few tens of milliseconds and, once a
deadline has passed, cancels the requests (``MPI_Cancel``, allowed from another thread under
``MPI_THREAD_MULTIPLE``). The waiting thread then sees cancelled statuses and raises. Requests
that cannot be cancelled (a matched send, a barrier) are escalated: after a grace period the
watchdog prints the error and calls ``MPI_Abort``, so no job waits forever.

A wait for a message header may also carry a *soft* limit: MPI's own wait busy-polls, which is
right for a reply that comes within microseconds but wasteful when the peer computes for
minutes on the same cores. At the soft limit the watchdog cancels the receive and the
transport goes on waiting by polling from Python with sleeps. (Sends and barriers cannot be
cancelled: the transport never waits for them inside MPI.)

Arming and disarming are one attribute store each: no lock on the message path. With nothing
armed the watchdog sleeps until a wait is armed (:data:`IDLE`, :func:`wake`): a node of many
ranks that compute has no thread waking up for nothing.

Waits polled from Python (sends, barriers, a header wait past its soft limit, the query passes'
waits for several peers) sleep between polls with :func:`backoff`: doubling up to a couple of
milliseconds, then, once the wait has lasted, up to 2 % of the time already waited (at most 20
ms): a peer computing for seconds costs the waiting rank some 50 polls a second, not 500, for
at most 2 % more latency. A receive's wait for one message, once past its soft limit, backs off
further, to at most 100 ms (:data:`LONG_RECV_MAX_SLEEP_S`, reached after 5 s): on a node of many
more ranks than cores each poll takes the core from a rank that computes (127 clients waiting
for a 128-rank job's server, 50 polls a second each, took about half a core of 2 while the
server wrote the model). Collectives and sends keep the 20 ms: a collective completes only
after several rounds, each waiting for some rank's next poll. A silent or ended peer is found by
the heartbeats (:mod:`mpifc.runtime.liveness`), never by these polls.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable

PERIOD_S = 0.05  # how often the watchdog looks: the precision of deadlines and soft limits (a long
                 # wait spins inside MPI for up to spin_s + PERIOD_S before it sleeps)
GRACE_S = 2.0    # after cancelling, how long before a still-blocked wait aborts the job

LONG_WAIT_SHARE = 0.02
"""A long polled wait sleeps at most this share of the time it has already waited..."""
LONG_WAIT_MAX_SLEEP_S = 0.02
"""...and at most this long between two polls..."""
LONG_RECV_MAX_SLEEP_S = 0.1
"""...or this long, in a receive's wait for one message past its soft limit (module doc)."""


def backoff(sleep: float, waited: float, max_sleep_s: float, long_max_s: float = LONG_WAIT_MAX_SLEEP_S) -> float:
    """The next sleep between two polls of a wait that has lasted ``waited`` seconds, after one
    of ``sleep``: doubling up to ``max_sleep_s``, then up to :data:`LONG_WAIT_SHARE` of ``waited``
    (at most ``long_max_s``: :data:`LONG_WAIT_MAX_SLEEP_S`, or :data:`LONG_RECV_MAX_SLEEP_S`)."""
    return min(2.0 * sleep, max(max_sleep_s, min(LONG_WAIT_SHARE * waited, long_max_s)))


_INF = float("inf")
IDLE = [False]
"""``IDLE[0]``: the watchdog sleeps with nothing armed; whoever arms a guard then calls :func:`wake`."""
IDLE_MAX_S = 5.0
_wake = threading.Event()
_guards: "weakref.WeakSet[WaitGuard]" = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None


class WaitGuard:
    """The armed wait of one transport, or None:
    ``(requests, soft_at, deadline_at, deadline_s, describe, state)``.

    At ``soft_at`` the watchdog cancels the requests and sets ``state[0]`` ("go back to polling
    from Python": a long wait inside MPI would burn a core the computing ranks need); at
    ``deadline_at`` it cancels and sets ``state[1]``; at ``deadline_at + GRACE_S`` a wait still
    blocked aborts the job.
    """

    __slots__ = ("armed", "rank", "__weakref__")

    def __init__(self, rank: int) -> None:
        self.armed: tuple[list[Any], float, float, float, Callable[[], str], list[bool]] | None = None
        self.rank = rank


def new_guard(rank: int) -> WaitGuard:
    """A guard watched by the process's watchdog thread (started on first use)."""
    global _thread
    g = WaitGuard(rank)
    with _lock:
        _guards.add(g)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_watch, name="mpifc-deadline-watchdog", daemon=True)
            _thread.start()
    return g


def _cancel(reqs: list[Any]) -> None:
    for r in reqs:
        try:
            r.Cancel()
        except Exception:  # noqa: BLE001 - completed or not cancellable: escalation handles it
            pass


def _watch() -> None:
    while True:
        now = time.perf_counter()
        busy = False
        for g in list(_guards):
            armed = g.armed
            if armed is None:
                continue
            reqs, soft_at, deadline_at, deadline_s, describe, state = armed
            busy = busy or deadline_at < _INF or (soft_at < _INF and not state[0])
            if now >= deadline_at + GRACE_S:
                if g.armed is armed:
                    _abort_stuck(g.rank, deadline_s, describe)
            elif now >= deadline_at:
                if not state[1]:
                    state[1] = True
                    _cancel(reqs)
            elif now >= soft_at and not state[0]:
                state[0] = True
                _cancel(reqs)
        if busy:
            time.sleep(PERIOD_S)
            continue
        # Nothing armed: sleep until a wait is armed (wake()), instead of looking 20 times a
        # second in every rank of the node. A wait armed before IDLE is set is seen by the check.
        IDLE[0] = True
        if not any(_due(g.armed) for g in list(_guards)):
            _wake.wait(IDLE_MAX_S)
        IDLE[0] = False
        _wake.clear()
        time.sleep(PERIOD_S)  # the precision of soft limits and deadlines, as when busy


def _due(armed: Any) -> bool:
    """Whether an armed wait has a limit to watch (a soft limit not yet hit, or a deadline)."""
    return armed is not None and (armed[2] < _INF or (armed[1] < _INF and not armed[5][0]))


def wake() -> None:
    """After arming a guard: wake the watchdog if it sleeps with nothing armed."""
    _wake.set()


def _abort_stuck(rank: int, deadline_s: float, describe: Callable[[], str]) -> None:
    from mpifc.runtime.failure import abort_with_line

    try:
        what = describe()
    except Exception:  # noqa: BLE001
        what = "a message"
    abort_with_line(f"mpifc: rank {rank}: DeadlineExceeded: deadline of {deadline_s:g} s passed waiting for {what} "
                    f"(the wait could not be cancelled; aborting)", 1)
