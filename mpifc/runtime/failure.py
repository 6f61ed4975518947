"""Fail fast: an exception on any rank ends the whole MPI job, naming the rank and the error.

This is what ``python -m mpi4py`` does for scripts; the ``mpifc`` console script and
:func:`mpifc.runtime.job.run_job` do the same, so no job ever waits forever on a dead peer.

One line and one exit code per job. The rank that ends the job first claims the line in its
node folder (:func:`mpifc.runtime.sentinel.claim`); every later failure (a peer that lost this
rank, the same ``UserError`` on every rank, every rank's Ctrl-C) stays quiet. The ranks of the
node are then asked (SIGUSR1, :mod:`mpifc.runtime.signals`) to remove their partial outputs and
say they are ready, and the job ends through exactly one ``MPI_Abort`` with the line's code:

* MPICH's launcher ends a job with the code of its ``MPI_Abort``; a rank inside MPI that exits
  on its own instead makes the launcher kill every other rank, and then report the killed
  ranks' signal (exit 9) rather than the code, whenever one of them had not yet exited;
* so the first rank of the node inside MPI to end claims the abort (``aborter`` in the node
  folder); every other failing rank waits, ready, to be ended by it. MPICH's own abort line
  goes to ``/dev/null``.

Ranks outside MPI (before ``MPI_Init``, after ``MPI_Finalize``) may exit on their own: the
launcher does not end the job for that; they exit together with one code
(:meth:`mpifc.runtime.node.NodeView.exit_together`) when nobody inside MPI ends it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import NoReturn

from mpifc.errors import UserError

from mpifc.runtime.launcher import env_rank  # noqa: F401 - this process's rank, from the launcher


_aborting = 0
_aborting_thread = 0  # the thread that ends the job in this process
_abort_lock = threading.Lock()  # the heartbeat thread and the main thread may fail at once


def _claim_abort() -> None:
    """Return if this thread is the first to end the job; otherwise wait for the other one's
    abort to end the process (one report, one MPI_Abort)."""
    if _abort_lock.acquire(blocking=False):
        return
    _already_ending()


def _already_ending() -> NoReturn:
    """This process is ending the job on another thread: wait for it (exiting here, inside MPI,
    would make the launcher kill the job's ranks before the abort says its code)."""
    if _aborting_thread == threading.get_ident():
        _flush_streams()
        os._exit(_aborting or 1)
    time.sleep(30.0)
    _flush_streams()
    os._exit(_aborting or 1)


def exit_code_for(exc: BaseException) -> int:
    """2 for :class:`UserError`, 130 for Ctrl-C, the code of a SystemExit, an error's own
    ``exit_code`` (3: :class:`~mpifc.errors.PrivacyFinding`), 1 otherwise."""
    if isinstance(exc, UserError):
        return 2
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    code = getattr(exc, "exit_code", None)
    return code if isinstance(code, int) and code > 0 else 1


def error_line(exc: BaseException, rank: int | None) -> str:
    """``mpifc: rank R: <ErrorType>: <message>`` on one line (``mpifc: ...`` without a rank)."""
    if isinstance(exc, KeyboardInterrupt):
        return "mpifc: interrupted (SIGINT); ending the job"
    msg = " ".join(str(exc).split()) or "(no message)"
    where = f"rank {rank}: " if rank is not None else ""
    return f"mpifc: {where}{type(exc).__name__}: {msg}"


def report(exc: BaseException, rank: int | None) -> int:
    """Print the error (with traceback for bugs, one line for a :class:`UserError`); returns the
    exit code."""
    code = exit_code_for(exc)
    brief = isinstance(exc, (UserError, KeyboardInterrupt, SystemExit)) or getattr(exc, "brief", False)
    if not brief or os.environ.get("MPIFC_TRACEBACK"):
        tb = "".join(traceback.format_exception(exc))
        prefix = f"[rank {rank}] " if rank is not None else ""
        sys.stderr.write("".join(prefix + line + "\n" for line in tb.rstrip("\n").split("\n")))
    sys.stderr.write(error_line(exc, rank) + "\n")
    sys.stderr.flush()
    return code


ABORT_SETTLE_SECONDS = 0.3


def settle_before_abort() -> None:
    """Give the launcher's I/O proxy a moment to forward what this rank just wrote.

    MPI_Abort makes mpiexec kill every rank at once; output still in the pipe to the proxy can
    be lost then, and the job would end with no message at all.
    """
    time.sleep(ABORT_SETTLE_SECONDS)


def _job_failing() -> None:
    """What every failing rank does before it ends the job: remove its partial outputs, tell
    its node sentinel that the failure is reported (so it stays quiet), and tell the other ranks
    (so the sentinels of other nodes do too). Best effort: nothing here may raise."""
    try:
        from mpifc.runtime import liveness, node, outputs

        staged = outputs.current()
        if staged is not None:
            staged.discard()
        view = node.current()
        if view is not None:
            view.mark_abort()
        live = liveness.current()
        if live is not None:
            live.announce_abort()
    except Exception:  # noqa: BLE001
        pass


def _world() -> object | None:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD
    return None


def _speak(code: int, line: str) -> bool:
    """Claim the job's one line (True: this process says it)."""
    from mpifc.runtime import node

    view = node.current()
    return view is None or view.claim(code, line)


def _end(code: int) -> NoReturn:
    """End this rank, and with it the job, with ``code`` (the line is said, or someone else's)."""
    global _aborting, _aborting_thread
    from mpifc.runtime import node

    view = node.current()
    if view is not None:
        said = view.said_code(wait_s=0.5)
        code = said if said is not None else code  # one code for every rank: the line's
    _aborting, _aborting_thread = code or 1, threading.get_ident()
    _job_failing()
    if view is not None:
        view.unmark("end")  # a rank past MPI_Finalize fails the job all the same
        if view.sentinel_gone():
            view.remove_if_orphaned()
    _leave(code or 1, tell_peers=True)


def _leave(code: int, tell_peers: bool) -> NoReturn:
    """Leave the failing job with ``code``: through the job's one ``MPI_Abort`` (this rank's, if
    it is the node's first inside MPI to claim it), by waiting for another rank's, or, where no
    rank of the node is inside MPI, by exiting together with the node's ranks."""
    from mpifc.runtime import node

    view = node.current()
    world = _world()
    in_mpi = world is not None and world.Get_size() > 1
    if in_mpi and (view is None or view.claim_aborter()):
        if view is not None:
            view.gather_peers(tell_peers=True)
        _flush_streams()
        settle_before_abort()
        _quiet_stderr()
        world.Abort(code)
        # MPICH's MPI_Abort may return while the launcher tears the job down; never run on.
        _flush_streams()
        os._exit(code)
    if view is None:
        _flush_streams()
        os._exit(code)
    if in_mpi or view.aborter_claimed():
        # Another rank ends the job through MPI_Abort, which ends this one too.
        view.mark("exit")
        _flush_streams()
        _wait_to_be_ended(view.end_wait_s() + 3.0)
    view.exit_together(code, tell_peers=tell_peers)
    os._exit(code)


def _quiet_stderr() -> None:
    """Point this process's standard error at ``/dev/null``: MPICH's ``MPI_Abort`` writes a line
    of its own there (``Abort(2) on node 1 ...``), after the job's one line was said."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)
    except OSError:
        pass


def _wait_to_be_ended(timeout_s: float) -> NoReturn:
    """Sleep until the job's ``MPI_Abort`` ends this process; exit after ``timeout_s`` all the
    same (an abort that never came: the node sentinel has reported the job by then)."""
    time.sleep(timeout_s)
    _flush_streams()
    os._exit(_aborting or 1)


def end_for_peer(code: int) -> None:
    """A peer said the line that ends the job (SIGUSR1, taken on the signal thread): remove this
    rank's partial outputs and leave with the line's code (see the module docstring). Returns at
    once if this process is already ending the job (its own thread does it)."""
    global _aborting, _aborting_thread
    if _aborting or not _abort_lock.acquire(blocking=False):
        return
    from mpifc.runtime import node, outputs

    _aborting, _aborting_thread = code or 1, threading.get_ident()
    staged = outputs.current()
    if staged is not None:
        staged.discard()
    view = node.current()
    if view is not None:
        view.unmark("end")
    _leave(code or 1, tell_peers=False)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def abort_with_line(line: str, code: int) -> NoReturn:
    """End the job with one line already written for the user (e.g. by the heartbeat thread,
    naming a silent rank), unless another rank said the job's line first."""
    if _aborting:
        _already_ending()
    _claim_abort()
    if _speak(code or 1, line):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    _end(code or 1)


def abort_job(exc: BaseException) -> NoReturn:
    """Report ``exc`` and end the job (see the module docstring), or exit when the job is a
    single process.

    Set ``MPIFC_TRACEBACK=1`` to get tracebacks for user errors and deadlines too.
    """
    global _aborting
    if _aborting:
        _already_ending()  # already reported and ending
    _claim_abort()
    from mpifc.runtime import node

    world = _world()
    rank = world.Get_rank() if world is not None else env_rank()
    code = exit_code_for(exc)
    same_everywhere = world is None and rank not in (None, 0) and isinstance(exc, (UserError, KeyboardInterrupt))
    if same_everywhere and node.current() is None:
        # Before MPI starts every rank sees the same command line and files (and Ctrl-C): one
        # line, rank 0's, is enough.
        _job_failing()
        _abort_lock.release()
        sys.exit(code)
    if not same_everywhere and _speak(code, error_line(exc, rank)):
        report(exc, rank)
    if world is not None and world.Get_size() > 1 or node.current() is not None:
        _end(code)
    _job_failing()
    _abort_lock.release()  # a single process: the caller may go on (e.g. the CLI called in-process)
    sys.exit(code)
