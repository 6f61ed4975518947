"""Signals to a rank: SIGINT and SIGTERM end the job with one line; SIGUSR1 is a peer ending it.

Python runs a signal handler only in the main thread, between two bytecodes: a rank waiting
inside MPI or in a long native call would see a Ctrl-C late, and every rank would then report
its own ``KeyboardInterrupt``. So a rank started by a launcher takes these signals on a thread
of its own, from the moment the ``mpifc`` command is imported (:mod:`mpifc.cli`): they are
blocked in the main thread, and so in every thread started after it, and the signal thread
takes them with :func:`signal.sigwaitinfo`, which also says who sent them:

* SIGINT, SIGTERM from the launcher's daemon (Ctrl-C on ``mpiexec``, ``mpiexec`` or a batch
  system passing a signal on to every rank): one line for the whole job, exit codes 130 and 143::

      mpifc: interrupted (SIGINT to the whole job, e.g. Ctrl-C); ending the job

* SIGINT, SIGTERM from any other process (a ``kill`` aimed at one rank)::

      mpifc: rank 2 received SIGTERM (from process 4711); ending the job

* SIGUSR1 from a peer that has said the line ending the job (:mod:`mpifc.runtime.failure`):
  the rank removes its partial outputs and leaves with that line's code, through the job's one
  ``MPI_Abort``, so the launcher reports that code (no second line).

The line is said once per job (:func:`mpifc.runtime.sentinel.claim`). A process the rank starts
inherits the blocked signals; the node sentinel, the only one, unblocks them.
"""
from __future__ import annotations

import signal
import threading
import time

from mpifc.runtime.launcher import env_rank  # noqa: F401 - for the CLI, which takes the signals first

HANDLED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})
NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}

_installed: "SignalThread | None" = None
_received = 0  # SIGINT or SIGTERM taken (the job is ending)


class SignalThread:
    """The thread that takes SIGINT, SIGTERM and SIGUSR1 for one rank (see the module docstring).

    Args:
        rank: this rank, as the launcher numbered it.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def install(self) -> bool:
        """Block the signals in this (the main) thread and start taking them; False where that
        is not possible (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        threading.Thread(target=self._run, name="mpifc-signals", daemon=True).start()
        return True

    def _run(self) -> None:
        while True:
            try:
                info = signal.sigwaitinfo(HANDLED)
            except (OSError, ValueError):
                return
            if info.si_signo == signal.SIGUSR1:
                self._peer_ends_job()
            elif info.si_signo in NAMES:
                global _received
                _received = _received or info.si_signo
                self._signalled(info.si_signo, info.si_pid)

    def _peer_ends_job(self) -> None:
        from mpifc.runtime import node
        from mpifc.runtime.failure import end_for_peer

        view = node.current()
        code = view.said_code() if view is not None else None
        if code is None:
            return  # nobody ended the job: not a peer's request
        end_for_peer(code)

    def _signalled(self, signum: int, sender: int) -> None:
        from mpifc.runtime import node
        from mpifc.runtime.failure import abort_with_line

        name = NAMES[signum]
        daemon = node.launcher_process()
        if sender <= 0 or (daemon is not None and sender == daemon[0]):
            what = "interrupted (SIGINT to the whole job, e.g. Ctrl-C)" if signum == signal.SIGINT \
                else "the job received SIGTERM"
            line = f"mpifc: {what}; ending the job"
        else:
            line = f"mpifc: rank {self.rank} received {name} (from process {sender}); ending the job"
        if node.current() is None:
            # Signalled before the job met its node (while importing): meet it now, so the line
            # is said once and the other ranks are told.
            from mpifc.runtime.liveness import DEFAULT_LIMIT_S

            node.set_current(node.NodeView.join(self.rank, DEFAULT_LIMIT_S))
        abort_with_line(line, 128 + signum)


def finish() -> None:
    """This rank's normal end, once its work is done: a SIGINT or SIGTERM that came meanwhile
    ends the job instead (no rank leaves as a success then); a barrier polled with sleeps, then
    ``MPI_Finalize``, then the end mark for the node sentinel (:meth:`mpifc.runtime.node.NodeView.end`):
    a rank frozen or killed before it fails the job, and the job's outputs are removed. Runs at
    the process's exit (registered by :func:`install`); a failing rank leaves without it."""
    import sys

    from mpifc.runtime import node

    view = node.current()
    if view is None:
        return
    wait_if_signalled()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        # MPI_Finalize waits for every rank holding the GIL, so no thread of this rank could act
        # meanwhile (a Ctrl-C, a peer ending the job): meet the others first in a barrier polled
        # with sleeps, then finalize at once.
        from mpifc.runtime.watchdog import backoff

        req, sleep, t0 = mpi.COMM_WORLD.Ibarrier(), 50e-6, time.monotonic()
        while not req.Test():
            time.sleep(sleep)
            sleep = backoff(sleep, time.monotonic() - t0, 2e-3)
        wait_if_signalled()
        mpi.Finalize()
    wait_if_signalled()
    view.end()
    # A signal taken before the end mark was written, and after the check above, still ends the
    # job (the signal thread removes the mark): from the mark on, the rank counts as ended.
    wait_if_signalled()


def leave(code: int) -> None:
    """End the process now with ``code`` after :func:`finish` (under a launcher; returns
    otherwise): nothing runs between this rank's end mark and its exit, where a kill could not
    be told from a normal end."""
    import os
    import sys

    from mpifc.runtime import node

    if node.current() is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    finish()
    # The C library's exit, not os._exit: after MPI_Finalize, MPICH's exit handlers must run, or
    # hydra may take the exit for a failure and kill the ranks still ending (measured: 2 to 6
    # jobs in 25 with os._exit, none with exit).
    try:
        import ctypes

        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def wait_if_signalled(timeout_s: float = 10.0) -> None:
    """On the way to a normal exit: if a SIGINT or SIGTERM came, let the signal thread end the
    job (it exits the process) rather than leave as a success."""
    until = time.monotonic() + timeout_s
    while _received and time.monotonic() < until:
        time.sleep(0.01)


def install(rank: int | None) -> SignalThread | None:
    """Take SIGINT, SIGTERM and SIGUSR1 on a thread for this rank (once per process; nothing
    without a rank: a process not started by a launcher keeps Python's own handling)."""
    global _installed
    if _installed is None and rank is not None:
        t = SignalThread(rank)
        if t.install():
            _installed = t
            import atexit

            atexit.register(finish)
    return _installed


__all__ = ["install", "finish", "leave", "wait_if_signalled", "env_rank", "HANDLED"]
