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

Where the launcher or its local rank count cannot be found (a single process, an unknown
launcher), there is no node view: the MPI heartbeats of :mod:`mpifc.runtime.liveness` still
watch the job once MPI is up.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping

LAUNCHER_PROCESSES = ("hydra_pmi_proxy", "orted", "prted", "slurmstepd")
"""Process names of the launchers' per-node daemons that start the ranks."""


def _stat_fields(pid: int) -> tuple[str, list[str]] | None:
    """``(comm, fields after comm)`` of ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    lo, hi = text.find("("), text.rfind(")")
    if lo < 0 or hi < 0:
        return None
    return text[lo + 1: hi], text[hi + 2:].split()


def launcher_process(max_depth: int = 6) -> tuple[int, str] | None:
    """``(pid, start time)`` of the nearest ancestor that is a launcher daemon, or None.

    Walks up from the parent, so wrappers between the daemon and the rank (``timeout``, a
    shell) do not matter.
    """
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return None
        info = _stat_fields(pid)
        if info is None:
            return None
        comm, rest = info
        if comm in LAUNCHER_PROCESSES:
            return pid, rest[19]  # field 22 of stat: start time in clock ticks since boot
        pid = int(rest[1])
    return None


def _tasks_on_node(spec: str, node: int) -> int | None:
    """Slurm's ``SLURM_STEP_TASKS_PER_NODE`` (e.g. ``"4(x2),3"``) for node index ``node``."""
    counts: list[int] = []
    for part in spec.split(","):
        n, _, rep = part.partition("(x")
        try:
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        except ValueError:
            return None
    return counts[node] if 0 <= node < len(counts) else None


def local_rank_count(environ: Mapping[str, str] | None = None) -> int | None:
    """How many ranks the launcher started on this node, from its environment, or None."""
    env = os.environ if environ is None else environ
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        v = env.get(name, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE"), env.get("SLURM_NODEID", "")
    if spec and node.isdigit():
        return _tasks_on_node(spec, int(node))
    return None


def _base_folder() -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


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
        self.sentinel: subprocess.Popen | None = None
        self._stop_beacon = threading.Event()
        self._stages = 0
        self._me = folder / f"rank-{rank}"

    @classmethod
    def join(cls, rank: int | None, limit_s: float, environ: Mapping[str, str] | None = None
             ) -> "NodeView | None":
        """Register this rank in its node folder (starting the sentinel if it is the first), or
        None where there is no launcher to find (see the module docstring)."""
        local = local_rank_count(environ)
        launcher = launcher_process()
        if rank is None or local is None or launcher is None:
            return None
        pid, start = launcher
        folder = _base_folder() / f"mpifc-{os.getuid()}-{pid}-{start}"
        try:
            folder.mkdir(mode=0o700)
            first = True
        except FileExistsError:
            first = False
        except OSError:
            return None
        view = cls(folder, rank, limit_s, local)
        try:
            if first:
                view._start_sentinel()
            for what in ("ready", "up", "final", "end"):  # from an earlier job of this process
                (folder / f"rank-{rank}.{what}").unlink(missing_ok=True)
            view.enter("startup")
            _write_atomic(view._me, str(os.getpid()))
        except OSError:
            return None
        threading.Thread(target=view._beacon, name="mpifc-node-beacon", daemon=True).start()
        return view

    def _start_sentinel(self) -> None:
        script = Path(__file__).with_name("sentinel.py")
        # A process group of its own: the launcher's kill of the ranks' process groups must not reach
        # it. Standard error is the rank's, so its lines reach the user through the launcher.
        self.sentinel = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script), str(self.folder), repr(self.limit), str(self.local_ranks)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)

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

    def wait_for_local_ranks(self, timeout_s: float) -> bool:
        """Sleep until every rank of this node has registered and the sentinel watches them all
        (at most ``timeout_s``); True if so."""
        until = time.monotonic() + timeout_s
        while True:
            if (self.folder / "watching").exists():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.02)


_current: NodeView | None = None


def current() -> NodeView | None:
    """The node view of the job this process runs, if any."""
    return _current


def set_current(view: NodeView | None) -> None:
    global _current
    _current = view
