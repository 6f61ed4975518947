"""Fail fast: an exception on any rank ends the whole MPI job, naming the rank and the error.

This is what ``python -m mpi4py`` does for scripts; the ``mpifc`` console script and
:func:`mpifc.runtime.job.run_job` do the same, so no job ever waits forever on a dead peer.

One line per job. The rank that ends the job first claims the line in its node folder
(:func:`mpifc.runtime.sentinel.claim`); every later failure (a peer that lost this rank, the
same ``UserError`` on every rank, every rank's Ctrl-C) stays quiet. The claimer then asks the
other ranks of its node to exit with the same code (SIGUSR1, :mod:`mpifc.runtime.signals`),
waits a moment for them, and exits: the launcher sees every rank exit with one code and
reports it, without killing ranks (no banner) and without ``MPI_Abort``, whose own message
MPICH prints. ``MPI_Abort`` stays the way out where there is no node folder (no launcher found)
and the fallback for ranks on other nodes, which the launcher ends.
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
_abort_lock = threading.Lock()  # the heartbeat thread and the main thread may fail at once


def _claim_abort() -> None:
    """Return if this thread is the first to end the job; otherwise wait for the other one's
    abort to end the process (one report, one MPI_Abort)."""
    if _abort_lock.acquire(blocking=False):
        return
    time.sleep(30.0)
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
    global _aborting
    from mpifc.runtime import node

    view = node.current()
    if view is not None:
        said = view.said_code(wait_s=0.5)
        code = said if said is not None else code  # one code for every rank: the line's
    _aborting = code or 1
    _job_failing()
    if view is not None:
        view.unmark("end")  # a rank past MPI_Finalize fails the job all the same
        if view.sentinel_gone():
            view.remove_if_orphaned()
        view.exit_together(code or 1, tell_peers=True)
    world = _world()
    if world is not None and world.Get_size() > 1:
        settle_before_abort()
        world.Abort(code or 1)
        # MPICH's MPI_Abort may return while the launcher tears the job down; never run on.
    _flush_streams()
    os._exit(code or 1)


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
        os._exit(_aborting)
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
        # Already reported and ending (e.g. MPI_Abort returned before the launcher killed us).
        os._exit(_aborting)
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
