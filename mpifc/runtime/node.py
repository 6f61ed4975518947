"""This rank's node: a folder the job's ranks on one node share, and the sentinel that reads it.

The folder lives in ``/dev/shm`` (else the temp folder) and is named after the launcher process
the node's ranks descend from (MPICH's ``hydra_pmi_proxy``, Open MPI's ``orted``/``prted``,
Slurm's ``slurmstepd``) and that process's start time, so every rank of one job on one node
finds the same folder, and no two jobs share one. What the files mean, and what the sentinel
does with them, is in :mod:`mpifc.runtime.sentinel`; the first rank to create the folder starts
the sentinel.

Before ``MPI_Init`` the ranks of a node meet here (:meth:`NodeView.wait_for_local_ranks`):
each sleeps until the launcher's count of local ranks has registered and the sentinel watches
them all, because ``MPI_Init`` itself waits for late ranks by spinning on a core with the GIL
held (measured with MPICH 5: a quarter to all of a core per waiting rank, and no Python thread
of the rank runs meanwhile), and because a rank killed before the sentinel watches it could not
be told from the ranks the launcher kills right after it.

The sentinel also watches the launcher processes above the ranks (the per-node daemon, and
``mpiexec`` when it is the daemon's parent), and cleans up after the job: a failed job's outputs,
MPI's shared-memory files (:meth:`NodeView.note_shared_memory`) and the folder. If the sentinel
itself is gone (killed), the ranks remove the folder as they end (:meth:`NodeView.end`).

Where the launcher or its local rank count cannot be found (a single process, an unknown
launcher), there is no node view: the MPI heartbeats of :mod:`mpifc.runtime.liveness` still
watch the job once MPI is up.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Mapping

from mpifc.runtime.early import (LAUNCHER_COMMANDS, LAUNCHER_PROCESSES, base_folder,  # noqa: F401 - the names
                                 launcher_chain, launcher_process, liveness_in, local_rank_count, node_folder)  # callers use here
from mpifc.runtime import early


def _base_folder() -> Path:
    return Path(base_folder())


def _write_atomic(path: Path, text: str) -> None:
    early.write_atomic(str(path), text)


class NodeView:
    """This rank's entries in the node folder (see :mod:`mpifc.runtime.sentinel`).

    Args:
        folder: the node folder.
        rank: this process's rank (from the launcher's environment).
        limit_s: the job's liveness limit, seconds (the beacon period is a sixth of it).
    """

    def __init__(self, folder: Path, rank: int, limit_s: float, local_ranks: int) -> None:
        self.folder = folder
        self.rank = rank
        self.limit = limit_s
        self.local_ranks = local_ranks
        self.period = min(max(limit_s / 6.0, 0.02), 1.0)
        self.sentinel_pid: int | None = None  # the sentinel this rank started, if any
        self._stop_beacon = threading.Event()
        self._stages = 0
        self._me = folder / f"rank-{rank}"
        self._commits = 0
        self.in_job = False  # inside a job runner that has not completed (mpifc.runtime.job.run_job)
        self._beacon_thread: threading.Thread | None = None

    @classmethod
    def join(cls, rank: int | None, limit_s: float, environ: Mapping[str, str] | None = None
             ) -> "NodeView | None":
        """Register this rank in its node folder (starting the sentinel if it is the first), or
        None where there is no launcher to find (see the module docstring)."""
        local = local_rank_count(environ)
        launcher = launcher_process()
        if rank is None or local is None or launcher is None:
            return None
        pid, _ = launcher
        folder = Path(node_folder(launcher))
        try:  # the sentinel makes the folder (started by the node's first rank, here or as the command began)
            if not early.meet(str(folder), limit_s, local, launcher_chain(pid), wait_s=max(3.0 * limit_s, 30.0)):
                return None
        except OSError:
            return None
        view = cls(folder, rank, limit_s, local)
        view.sentinel_pid = early.sentinel_started()  # started by this rank, if any (mpifc.runtime.early)
        try:
            view.begin_job(limit_s)
            _write_atomic(view._me, str(os.getpid()))
        except OSError:
            return None
        return view

    def begin_job(self, limit_s: float) -> None:
        """Start (again) from ``startup``: clear this rank's markers of an earlier job in this
        process, beat the beacon, and record the job's liveness limit (the sentinel reads it)."""
        self.limit = limit_s
        self.period = min(max(limit_s / 6.0, 0.02), 1.0)
        for what in ("ready", "up", "final", "end", "exit"):
            (self.folder / f"rank-{self.rank}.{what}").unlink(missing_ok=True)
        self.enter("startup")
        try:
            _write_atomic(self.folder / "limit", repr(float(limit_s)))
        except OSError:
            pass
        if self._beacon_thread is None or not self._beacon_thread.is_alive():
            self._stop_beacon.clear()
            self._beacon_thread = threading.Thread(target=self._beacon, name="mpifc-node-beacon", daemon=True)
            self._beacon_thread.start()

    def _beacon(self) -> None:
        while not self._stop_beacon.wait(self.period):
            try:
                os.utime(self._me)
            except OSError:
                return

    # -- what the rank tells the sentinel ------------------------------------------------------
    def enter(self, phase: str) -> None:
        """Record the rank's phase (named in the sentinel's lines)."""
        try:
            _write_atomic(self.folder / f"rank-{self.rank}.phase", phase)
        except OSError:
            pass

    def mark(self, what: str) -> None:
        """Set marker ``rank-R.<what>``: ``ready``, ``up`` (stops the beacon), ``final`` or ``end``."""
        if what == "up":
            self._stop_beacon.set()
        try:
            (self.folder / f"rank-{self.rank}.{what}").touch()
        except OSError:
            pass

    def unmark(self, what: str) -> None:
        """Remove marker ``rank-R.<what>``."""
        try:
            (self.folder / f"rank-{self.rank}.{what}").unlink()
        except OSError:
            pass

    def claim(self, code: int, line: str) -> bool:
        """Claim the one line that ends the job (see :func:`mpifc.runtime.sentinel.claim`)."""
        from mpifc.runtime.sentinel import claim

        return claim(str(self.folder), code, line)

    def said_code(self, wait_s: float = 0.5) -> int | None:
        """The exit code of the line that ended the job, or None while nobody said one."""
        from mpifc.runtime.sentinel import said_code

        return said_code(str(self.folder), wait_s)

    def mark_abort(self) -> None:
        """The job reports its own failure: the sentinel stays quiet (but still ends the node's ranks)."""
        try:
            (self.folder / "abort").touch()
        except OSError:
            pass

    def stage(self, partial: Path) -> str:
        """Register a partial output file the sentinel removes if the job fails; returns its key."""
        self._stages += 1
        key = f"stage-{self.rank}-{self._stages}"
        try:
            _write_atomic(self.folder / key, str(Path(partial).resolve()))
        except OSError:
            pass
        return key

    def unstage(self, key: str) -> None:
        try:
            (self.folder / key).unlink()
        except OSError:
            pass

    def committing(self, partial: Path, final: Path) -> None:
        """Note that ``partial`` is about to be renamed to ``final`` (or, ``partial`` = ``final``,
        that ``final`` was just written): if the job fails after all (a rank frozen or killed
        before the job ends), the sentinel removes ``final`` again, as long as it is still this
        file (same device and inode)."""
        self._commits += 1
        try:
            st = os.stat(partial)
            _write_atomic(self.folder / f"commit-{self.rank}-{self._commits}",
                          f"{Path(final).resolve()}\t{st.st_dev}\t{st.st_ino}")
        except OSError:
            pass

    def writing(self, final: Path) -> None:
        """Note that ``final`` is being written in place (atomically, through temp files beside
        it): the sentinel removes those temp files if the job fails."""
        self._stages += 1
        try:
            _write_atomic(self.folder / f"temps-{self.rank}-{self._stages}", str(Path(final).resolve()))
        except OSError:
            pass

    def note_shared_memory(self) -> list[str]:
        """Record the files of MPI's shared memory in ``/dev/shm`` this process maps, so the
        sentinel removes them once the ranks are gone: a job that does not reach
        ``MPI_Finalize`` leaves them otherwise. Returns them. (The sentinel also looks for them
        itself while the ranks are inside ``MPI_Init``, and removes what no process uses any more
        if the job fails: see :mod:`mpifc.runtime.sentinel`.)"""
        from mpifc.runtime.sentinel import shared_memory_of

        found = sorted(shared_memory_of(os.getpid()))
        if found:
            try:
                _write_atomic(self.folder / f"shm-{self.rank}", "\n".join(found))
            except OSError:
                pass
        return found

    def sentinel_gone(self) -> bool:
        """Whether the node's sentinel has ended (killed): the ranks then clean up themselves."""
        from mpifc.runtime.sentinel import gone

        pid = self.sentinel_pid
        try:
            pid = pid if pid is not None else int((self.folder / "sentinel.pid").read_text())
        except (OSError, ValueError):
            return False
        return gone(pid)

    def local_pids(self) -> dict[int, int]:
        """``{rank: pid}`` of the ranks registered in the node folder."""
        out = {}
        try:
            names = os.listdir(self.folder)
        except OSError:
            return out
        for name in names:
            if name.startswith("rank-") and "." not in name and name[5:].isdigit():
                try:
                    out[int(name[5:])] = int((self.folder / name).read_text())
                except (OSError, ValueError):
                    pass
        return out

    def claim_aborter(self) -> bool:
        """Claim the node's one ``MPI_Abort`` (``aborter``, created exclusively): True for the
        first rank of the node to ask, which then ends the job; the others wait for it."""
        try:
            fd = os.open(self.folder / "aborter", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            return False
        try:
            os.write(fd, str(self.rank).encode())
        finally:
            os.close(fd)
        return True

    def aborter_claimed(self) -> bool:
        """Whether a rank of this node has claimed the job's ``MPI_Abort``."""
        return (self.folder / "aborter").exists()

    def gather_peers(self, tell_peers: bool, timeout_s: float | None = None) -> None:
        """Note that this rank is ready to end (``rank-R.exit``, its partial outputs removed) and
        wait until every other rank of the node is ready or gone (``tell_peers``: ask them first,
        with SIGUSR1; see :mod:`mpifc.runtime.signals`). The wait lasts at most ``timeout_s``
        (default: the liveness limit, at least 1 s): on a loaded node a peer's signal thread may
        take seconds to run, and a peer silent for longer is frozen or stuck, which the node
        sentinel reports and ends in the same time."""
        from mpifc.runtime.sentinel import gone

        timeout_s = self.end_wait_s() if timeout_s is None else timeout_s
        peers = {r: pid for r, pid in self.local_pids().items() if r != self.rank and pid != os.getpid()}
        if tell_peers:
            for pid in peers.values():
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:
                    pass
        self.mark("exit")
        until = time.monotonic() + timeout_s
        while time.monotonic() < until and not all(
                gone(pid) or (self.folder / f"rank-{r}.exit").exists() for r, pid in peers.items()):
            time.sleep(0.001)

    def end_wait_s(self) -> float:
        """How long a failing rank waits for its node's peers: the liveness limit, at least 1 s."""
        return max(1.0, self.limit)

    def exit_together(self, code: int, tell_peers: bool, timeout_s: float | None = None) -> None:
        """Exit with ``code`` together with the other ranks of this node (see :meth:`gather_peers`).

        For ranks outside MPI (before ``MPI_Init`` or after ``MPI_Finalize``): the launcher does
        not end the job when such a rank exits. A rank inside MPI must not exit on its own while
        the job fails: the launcher kills every other rank at once and reports the killed rank's
        signal (9) rather than the code; those ranks end through one ``MPI_Abort``
        (:mod:`mpifc.runtime.failure`).
        """
        self.gather_peers(tell_peers, timeout_s)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream
                pass
        if self.aborter_claimed():
            # A peer inside MPI claimed the job's MPI_Abort (before it said it was ready), which
            # ends this rank too with the line's code. Exiting first, from inside MPI_Init where
            # the launcher already counts this rank, would make it kill the others and report
            # their signal (9).
            time.sleep(self.end_wait_s() + 3.0)
        os._exit(code or 1)

    def end(self) -> None:
        """Mark this rank's normal end (after ``MPI_Finalize``), unless it leaves a job it has not
        completed (a job function that returned before MPI started, as its peers went on): then
        it ends without a word, which the sentinel reports. The last rank to end removes the
        folder if the sentinel is gone."""
        if self.in_job:
            return
        self.mark("end")
        if self.sentinel_gone():
            self.remove_if_orphaned(all_ended=True)

    def remove_if_orphaned(self, all_ended: bool = False) -> None:
        """Without a sentinel: remove MPI's shared memory files and the folder, once every rank of
        the node has ended (``all_ended``), or at once (the job is failing)."""
        try:
            if all_ended and len(list(self.folder.glob("rank-*.end"))) < self.local_ranks:
                return
            records = list(self.folder.glob("shm-*"))
        except OSError:  # another rank of the node removed the folder first: nothing is left
            return
        from mpifc.runtime.sentinel import shm_segment

        for rec in records:
            try:
                for seg in rec.read_text().split("\n"):
                    if shm_segment(seg):
                        Path(seg).unlink(missing_ok=True)
            except OSError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def wait_for_local_ranks(self, timeout_s: float) -> bool:
        """Sleep until every rank of this node has registered and the sentinel watches them all
        (at most ``timeout_s``); True if so."""
        until = time.monotonic() + timeout_s
        sleep = 0.005
        while True:
            if (self.folder / "watching").exists():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(sleep)
            # Slower as the wait lasts: on a node of many ranks starting on few cores the last
            # ones come seconds later, and each poll costs a waiting rank a wake-up.
            sleep = min(sleep * 1.5, 0.1)


def join_early(argv: list[str], default_limit_s: float) -> "NodeView | None":
    """Meet the node as the process starts (before its imports), with the ``--liveness`` of
    ``argv`` (else ``default_limit_s``): a rank killed, frozen or interrupted from here on is
    seen by the sentinel, and so is the launcher."""
    from mpifc.runtime.launcher import env_rank

    limit = liveness_in(argv, default_limit_s)
    if current() is None and launcher_process() is None and local_rank_count() is not None and early.launcher_gone():
        # Started by a launcher whose daemon is gone (killed while this rank started): nobody
        # can hear this rank any more, and mpiexec has reported the failure.
        os._exit(1)
    view = current() or NodeView.join(env_rank(), limit)
    set_current(view)
    return view


_current: NodeView | None = None


def current() -> NodeView | None:
    """The node view of the job this process runs, if any."""
    return _current


def set_current(view: NodeView | None) -> None:
    global _current
    _current = view
