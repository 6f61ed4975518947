"""Signals to a rank: SIGINT and SIGTERM end the job with one line; SIGUSR1 is a peer ending it.

Python runs a signal handler only in the main thread, between two bytecodes: a rank waiting
inside MPI or in a long native call would see a Ctrl-C late, and every rank would then report
its own ``KeyboardInterrupt``. So a rank in a job (:func:`mpifc.runtime.job.run_job`) takes
these signals on a thread of its own: the C-level handler writes the signal's number to a
pipe (:func:`signal.set_wakeup_fd`) at once, whatever the main thread does, and the thread
acts on it:

* SIGINT, SIGTERM: the rank notes the signal in the node folder, waits a moment for the other
  ranks of the node to note theirs, then says one line and ends the job with the shell's code
  for the signal (130, 143). When every rank of the node got the signal (Ctrl-C on ``mpiexec``,
  ``mpiexec`` or a batch system passing SIGTERM on), the line names the job::

      mpifc: interrupted (SIGINT to the whole job, e.g. Ctrl-C); ending the job

  when one rank got it, the line names that rank::

      mpifc: rank 2 received SIGTERM; ending the job

* SIGUSR1 from a peer that has said the line ending the job (:mod:`mpifc.runtime.failure`):
  the rank removes its partial outputs and exits with that line's code, so every rank of the
  job exits with one code and the launcher reports it (no rank killed, no second line).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from mpifc.runtime.launcher import env_rank  # noqa: F401 - for the CLI, which takes the signals first

SCOPE_WAIT_S = 0.3
"""How long a signalled rank waits for the other ranks of its node to note the same signal."""
NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}

_installed: "SignalThread | None" = None


def _ignore(signum: int, frame: Any) -> None:
    """The main thread's handler: the signal thread acts (the main thread must not raise
    KeyboardInterrupt in the middle of the work)."""


class SignalThread:
    """The thread that acts on SIGINT, SIGTERM and SIGUSR1 for one rank (see the module docstring).

    Args:
        rank: this rank, as the launcher numbered it (None: a single process).
    """

    def __init__(self, rank: int | None) -> None:
        self.rank = rank
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._old: dict[int, Any] = {}
        self._old_fd = -1

    def install(self) -> bool:
        """Take the signals (main thread only); False where that is not possible."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                self._old[s] = signal.signal(s, _ignore)
        except (ValueError, OSError):
            return False
        threading.Thread(target=self._run, name="mpifc-signals", daemon=True).start()
        return True

    def uninstall(self) -> None:
        """Give the signals back (a job run inside a longer-lived process, e.g. a test)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s, old in self._old.items():
            try:
                signal.signal(s, old if old is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        try:
            signal.set_wakeup_fd(self._old_fd)
        except (ValueError, OSError):
            pass
        self._old.clear()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == signal.SIGUSR1:
                    self._peer_ends_job()
                elif signum in NAMES and signal.getsignal(signum) is _ignore:
                    self._signalled(signum)

    def _peer_ends_job(self) -> None:
        from mpifc.runtime import node, outputs

        view = node.current()
        code = view.said_code() if view is not None else None
        if code is None:
            return  # nobody ended the job: not a peer's request
        staged = outputs.current()
        if staged is not None:
            staged.discard()
        view.unmark("end")
        view.exit_together(code, tell_peers=False)

    def _signalled(self, signum: int) -> None:
        from mpifc.runtime import node
        from mpifc.runtime.failure import abort_with_line

        name = NAMES[signum]
        view = node.current()
        if view is None and self.rank is not None:
            # Signalled before the job met its node (e.g. while importing): meet it now, so the
            # line is said once and the other ranks are told.
            from mpifc.runtime.liveness import DEFAULT_LIMIT_S

            view = node.NodeView.join(self.rank, DEFAULT_LIMIT_S)
            node.set_current(view)
        who = [self.rank] if self.rank is not None else []
        if view is not None and self.rank is not None:
            try:
                (view.folder / f"sig-{self.rank}-{signum}").touch()
            except OSError:
                pass
            time.sleep(SCOPE_WAIT_S)
            who = sorted(int(p.name.split("-")[1]) for p in view.folder.glob(f"sig-*-{signum}"))
        # The launcher passes a signal on to every rank at once (Ctrl-C, scancel); one sent to a
        # single rank reaches no other within the wait.
        if view is None or len(who) >= min(2, view.local_ranks):
            what = "interrupted (SIGINT to the whole job, e.g. Ctrl-C)" if signum == signal.SIGINT \
                else "the job received SIGTERM"
            line = f"mpifc: {what}; ending the job"
        else:
            ranks = f"rank {who[0]}" if len(who) == 1 else "ranks " + ", ".join(map(str, who))
            line = f"mpifc: {ranks} received {name}; ending the job"
        abort_with_line(line, 128 + signum)


def install(rank: int | None) -> SignalThread | None:
    """Take SIGINT, SIGTERM and SIGUSR1 on a thread for this rank (once per process; nothing
    without a rank: a process not started by a launcher keeps Python's own handling)."""
    global _installed
    if _installed is None and rank is not None:
        t = SignalThread(rank)
        if t.install():
            _installed = t
    return _installed


def uninstall() -> None:
    """Give the signals back (see :meth:`SignalThread.uninstall`)."""
    global _installed
    if _installed is not None:
        _installed.uninstall()
        _installed = None
