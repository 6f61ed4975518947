"""The node sentinel: one small process per node that watches the job's ranks, and the launcher
processes that started them, from outside MPI.

Why a process of its own. What cannot be seen from inside an MPI rank:

* a rank killed by a signal: the launcher (MPICH's hydra, for one) answers by killing every
  other rank with SIGKILL within milliseconds, so no surviving rank can say which one was lost,
  and the launcher's own banner names a process id, not a rank;
* a frozen rank (SIGSTOP) while its peers block inside MPI (``MPI_Init``, a collective, or
  ``MPI_Finalize``), where no Python thread of theirs may run;
* the launcher itself killed or frozen: killing ``hydra_pmi_proxy`` leaves the ranks running
  as orphans (they would finish the job and write its outputs, while ``mpiexec`` reports a
  failure); freezing it or ``mpiexec`` leaves the ranks hanging in ``MPI_Finalize``;
* a partial output left by a rank that was killed while writing it, and what MPI leaves in
  ``/dev/shm`` when a job does not reach ``MPI_Finalize``.

The first rank of a job to reach a node starts the sentinel (:mod:`mpifc.runtime.node`) in a
process group of its own, so the launcher's kill does not reach it; it uses only the standard
library and starts in a few tens of milliseconds. It reads the node folder the ranks keep
(``rank-R``: the process id, touched as a beacon until the rank's MPI heartbeats run;
``rank-R.phase``; markers ``rank-R.ready`` (entering ``MPI_Init``), ``rank-R.up`` (heartbeats
running), ``rank-R.final`` (heartbeats stopped), ``rank-R.end`` (a normal end, written after
``MPI_Finalize``); ``said``: the one line that ends the job has been written (see
:func:`claim`); ``abort``: the job reported its own failure; ``stage-R-N``: a partial output file, or a folder made for outputs;
``commit-R-N``: an output renamed into place (or written after the job's end); ``temps-R-N``: an
output being written in place, whose temp files go if the job fails; ``shm-R``: the shared-memory files MPI mapped),
writes ``watching`` once it watches every rank of the node (the ranks wait for that before they
start MPI), and acts on what it sees:

* the first process to end, among the ranks and the launcher processes (the order the kernel
  reported their ends in, so a rank killed first is told from the ranks the launcher killed
  after it): a rank without ``rank-R.end``: ``mpifc: rank R ended without a word in phase 'P'
  ...``; the launcher (``mpiexec``, or its per-node daemon) while ranks still run: ``mpifc: the
  launcher's mpiexec (pid N) ended while the job ran ...``; then every rank of the node is killed;
* a rank or a launcher process that stays stopped (SIGSTOP) for the liveness limit, and a rank
  that has not reached its MPI heartbeats and shows no sign of life for the limit: ``mpifc: rank R
  stopped answering in phase 'P' ...``; the node's ranks are killed, and so is a stopped launcher
  process (which would otherwise never report the job's end);
* fewer ranks than the launcher started on this node registered within a generous start-up
  grace: one line, and the node's ranks are killed;
* once every rank of the node is gone (and the launcher processes with them): for a failed job
  its partial outputs are removed, and so are outputs already renamed into place (a job that
  fails after renaming them, e.g. frozen in ``MPI_Finalize``, must not leave them); MPI's shared
  memory files are removed; the folder is removed, and the sentinel exits. SIGTERM (``scancel``,
  a batch system's time limit) counts as a failure: the sentinel stays until the ranks are gone,
  then cleans up.

Every line is said once per job (:func:`claim`), on the standard error the sentinel inherited
from the rank that started it (the launcher forwards it as the rank's own output); while the
launcher is gone or stopped, on the standard error of ``mpiexec`` itself (opened when the
sentinel starts, appending), which is where the user reads the job's output.

Run as ``python -I -S sentinel.py FOLDER LIMIT_S LOCAL_RANKS [NAME:PID ...]``, one ``NAME:PID``
per launcher process to watch (the per-node daemon first, then ``mpiexec`` if it runs here).
With ``MPIFC_SENTINEL_CLAIM`` set, the node's claim is on descriptor 3 and this process makes
the folder (:func:`mpifc.runtime.early.meet`).
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_MIN_S = 0.02
UNSEEN_GRACE_S = 1.0
"""How long after this process starts a rank the launcher started may still be missing from its
children (the launcher starts them all before any can start this process)."""
REPORTED_GRACE_S = 2.0
"""How long the ranks of a job that reported its own failure have to exit on their own."""
SAID = "said"
"""The node folder's file that holds the code and the line that ended the job (see :func:`claim`)."""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of process ``pid`` from ``/proc`` (``T`` = stopped), or None if gone."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    end = text.rfind(")")
    return text[end + 2: end + 3] if end >= 0 else None


class Activity:
    """When process ``pid`` last showed that it works: its CPU time grew, or it was seen running
    (``R``) or in I/O (``D``), read from ``/proc``. A rank whose Python threads are starved (native
    code holding the GIL on an oversubscribed node) cannot beat, but it is busy, and this says so;
    a stopped (``T``), sleeping-forever or ended process shows no activity.

    Args:
        pid: the process.
        now: ``time.monotonic()`` at the first look.
        active: whether to count the first look as activity (a process just started).
    """

    __slots__ = ("pid", "ticks", "at")

    def __init__(self, pid: int, now: float, active: bool = False) -> None:
        self.pid = pid
        self.ticks: int | None = None
        self.at = now if active else float("-inf")
        self.idle_for(now)

    def idle_for(self, now: float) -> float:
        """Seconds since the last sign of work (``inf``: none seen, or the process is gone)."""
        text = _read(f"/proc/{self.pid}/stat")
        end = text.rfind(")") if text else -1
        if end < 0:
            self.at = float("-inf")
            return float("inf")
        fields = text[end + 2:].split()
        state, ticks = fields[0], int(fields[11]) + int(fields[12])  # utime + stime
        if state in ("Z", "X"):
            self.at = float("-inf")
        elif state in ("R", "D") or (self.ticks is not None and ticks != self.ticks):
            self.at = now
        self.ticks = ticks
        return now - self.at


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger)."""
    return proc_state(pid) in ("T", "t")


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie)."""
    return proc_state(pid) in (None, "Z", "X")


def claim(folder: str, code: int, line: str) -> bool:
    """Claim the right to say the line that ends the job: True for the first caller of a job
    (it then says ``line``), False for every later one, which stays quiet (one line per job).

    The claim is a file created exclusively in the node folder; it holds ``code`` and ``line``, so
    a rank ended by the claimer exits with the same code (:mod:`mpifc.runtime.failure`).
    """
    try:
        fd = os.open(os.path.join(folder, SAID), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True  # no folder to claim in: nobody else can have spoken through it
    try:
        os.write(fd, f"{int(code)}\n{line}\n".encode("utf-8", "replace"))
    finally:
        os.close(fd)
    return True


def said_code(folder: str, wait_s: float = 0.5) -> int | None:
    """The exit code in the node folder's claim, or None if nobody claimed (waits up to
    ``wait_s`` for a claim being written)."""
    path = os.path.join(folder, SAID)
    until = time.monotonic() + wait_s
    while True:
        text = _read(path)
        if text is None:
            return None
        head = text.split("\n", 1)[0].strip()
        if head.lstrip("-").isdigit():
            return int(head)
        if time.monotonic() >= until:
            return 1
        time.sleep(0.01)


def remove_partial(target: str) -> None:
    """Remove a partial output file and the temp files an atomic write of it left beside it."""
    try:
        os.unlink(target)
    except OSError:
        pass
    remove_temps(target)


def remove_temps(target: str) -> None:
    """Remove the temp files an atomic write of ``target`` left beside it (not ``target``)."""
    folder, name = os.path.split(target)
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return
    for other in names:
        if other.startswith(f".{name}.") and other.endswith(".tmp"):
            try:
                os.unlink(os.path.join(folder, other))
            except OSError:
                pass


def remove_files(paths) -> None:
    """Remove the files ``paths`` (those already gone are skipped)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_committed(record: str) -> None:
    """Remove an output renamed into place (record: ``path<TAB>device<TAB>inode``) if the file
    at its path is still the one the job wrote."""
    parts = record.strip().split("\t")
    if len(parts) != 3:
        return
    path, dev, ino = parts
    try:
        st = os.stat(path)
        if str(st.st_dev) == dev and str(st.st_ino) == ino:
            os.unlink(path)
    except OSError:
        pass


SHM_FOLDER = "/dev/shm"
SHM_PREFIXES = ("mpich_", "ucx_shm_")
"""How the files of MPI's shared memory in ``/dev/shm`` are named: MPICH's (``mpich_shm_*``,
``mpich_vci_*``, created in ``MPI_Init`` and removed in ``MPI_Finalize``) and those of its UCX
transport (removed as soon as every rank has mapped them). Only these are ever removed: a rank
may map other files there that are not the job's (another program's shared memory)."""


def shm_segment(path: str) -> str | None:
    """``path`` if it names a file of MPI's shared memory still linked in ``/dev/shm``."""
    head, _, name = path.partition(SHM_FOLDER + "/")
    if head or "/" in name or not name.startswith(SHM_PREFIXES) or name.endswith(" (deleted)"):
        return None
    return path


def shared_memory_of(pid: int) -> set[str]:
    """The files of MPI's shared memory (:data:`SHM_PREFIXES`) that process ``pid`` holds open
    or maps, still linked in ``/dev/shm``.

    The descriptors are read before the maps: MPI opens a segment, maps it, then closes the
    descriptor, so one held either way at the first read is seen by one of the two."""
    found: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            seg = shm_segment(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if seg:
            found.add(seg)
    text = _read(f"/proc/{pid}/maps") or ""
    start = text.find(SHM_FOLDER + "/")
    while start >= 0:
        end = text.find("\n", start)
        seg = shm_segment(text[start: end if end >= 0 else len(text)])
        if seg:
            found.add(seg)
        start = text.find(SHM_FOLDER + "/", end) if end >= 0 else -1
    return found


def shared_memory_files(since: float = float("-inf")) -> dict[str, float]:
    """``{path: ctime}`` of the files of MPI's shared memory in ``/dev/shm`` that belong to this
    user and changed (were created, at the latest) at ``since`` (wall time) or later."""
    import stat

    out = {}
    try:
        names = os.listdir(SHM_FOLDER)
    except OSError:
        return out
    for name in names:
        if not name.startswith(SHM_PREFIXES):
            continue
        path = os.path.join(SHM_FOLDER, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_ctime >= since:
            out[path] = st.st_ctime
    return out


def unheld(paths) -> list[str]:
    """Those of ``paths`` (files of MPI's shared memory) that no process holds open or maps: every
    process that made or used them is gone, so no running job can still need them."""
    left = set(paths)
    if not left:
        return []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            left -= shared_memory_of(int(name))
            if not left:
                break
    return sorted(left)


def children(pid: int) -> list[int]:
    """Process ids of the children of ``pid``."""
    text = _read(f"/proc/{pid}/task/{pid}/children")
    return [int(t) for t in text.split()] if text else []


RANK_VARIABLES = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMIX_RANK=", b"SLURM_PROCID=")


SIZE_VARIABLES = (b"PMI_SIZE=", b"OMPI_COMM_WORLD_SIZE=", b"PMIX_SIZE=", b"SLURM_NTASKS=")


def env_rank(pid: int) -> tuple[int | None, int | None]:
    """The rank a launcher gave process ``pid`` and the job's size, from its environment (None
    for what is not there)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return None, None
    found: list[int | None] = []
    for names in (RANK_VARIABLES, SIZE_VARIABLES):
        value = None
        for prefix in names:
            value = next((int(i[len(prefix):]) for i in items if i.startswith(prefix) and i[len(prefix):].isdigit()),
                         None)
            if value is not None:
                break
        found.append(value)
    return found[0], found[1]


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # older kernels: polled


class Watched:
    """One process this sentinel watches: a rank (``rank`` >= 0) or a launcher process
    (``rank`` = -1, with its ``name``)."""

    def __init__(self, rank: int, pid: int, name: str = "") -> None:
        self.rank = rank
        self.pid = pid
        self.name = name or f"rank {rank}"
        self.ended = False
        self.stopped_since: float | None = None
        self.fd = _pidfd(pid)
        self.activity = Activity(pid, time.monotonic(), active=True)
        # Gone before this process first looked (a zombie, or reaped): when it ended, against the
        # others that did, is unknown.
        self.seen_alive = not gone(pid)

    def gone(self) -> bool:
        if self.ended:
            return True
        if self.fd is not None:
            r, _, _ = select.select([self.fd], [], [], 0)
            return bool(r)
        return gone(self.pid)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Sentinel:
    """The watch over one node folder (see the module docstring)."""

    def __init__(self, folder: str, limit_s: float, local_ranks: int,
                 launchers: list[tuple[str, int]] | None = None) -> None:
        self.folder = folder
        self.limit = limit_s
        self.local_ranks = local_ranks
        self.period = min(max(limit_s / 6.0, POLL_MIN_S), 1.0)
        # Interpreter start-up and imports before a rank registers: slow on a loaded node, but
        # never this slow; a rank missing after it will not come.
        self.start_grace = max(3.0 * limit_s, 30.0)
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.segments: set[str] = set()  # files of MPI's shared memory the ranks were seen to use
        self._looked = 0
        self.watched: dict[int, Watched] = {}
        self.registered: set[int] = set()
        self.all_came = False  # every rank of the node registered ("watching" written)
        self.job_size = 0  # the job's size, when every rank runs on this node
        size = next((int(os.environ[n]) for n in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
                     if os.environ.get(n, "").isdigit()), 0)  # the rank that started this process
        if size == local_ranks:
            self.job_size = size
        # (one already gone, e.g. killed while this process started, is handled as it ends)
        self.launchers = [Watched(-1, pid, name) for name, pid in (launchers or [])]
        self.failed = False
        self.kill_at = 0.0
        self.released = False  # standard error let go of (see finished)
        self.poller = select.epoll() if hasattr(select, "epoll") else None
        self.by_fd: dict[int, Watched] = {}
        for w in self.launchers:
            self._register(w)
        self.user_err = self._open_user_stderr()

    # -- the folder ------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def has(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def phase(self, rank: int) -> str:
        return (_read(self.path(f"rank-{rank}.phase")) or "startup").strip() or "startup"

    def _register(self, w: Watched) -> None:
        if w.fd is not None and self.poller is not None:
            self.poller.register(w.fd, select.EPOLLIN)
            self.by_fd[w.fd] = w

    def _open_user_stderr(self) -> int | None:
        """The standard error of ``mpiexec`` (the last launcher process), opened for appending:
        where a line goes once the launcher cannot forward the sentinel's own."""
        top = [w for w in self.launchers if w.name.startswith(("mpiexec", "mpirun", "prterun", "orterun"))]
        if not top:
            return None
        try:
            return os.open(f"/proc/{top[-1].pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
        except OSError:
            return None

    def scan(self) -> None:
        """Watch the ranks: those registered in the folder (``rank-R`` holds the process id),
        and, before they register, the launcher daemon's children (their rank is in their
        environment), so that a rank killed or frozen while it starts is seen too."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            if not name.startswith("rank-") or "." in name:
                continue
            try:
                rank = int(name[5:])
            except ValueError:
                continue
            if rank in self.registered:
                continue
            text = _read(self.path(name))
            if text and text.strip().isdigit():
                pid = int(text.strip())
                old = self.watched.get(rank)
                if old is not None and old.pid != pid and not old.ended:
                    self._forget(old)  # a wrapper process seen first; the rank itself registered
                if old is None or old.pid != pid:
                    w = self.watched[rank] = Watched(rank, pid)
                    self._register(w)
                self.registered.add(rank)
                if len(self.registered) == self.local_ranks:
                    # The ranks wait for this before they go on (mpifc.runtime.node): every rank of
                    # the node has come, and a rank that dies from here on is seen before the ranks
                    # the launcher kills after it.
                    try:
                        open(self.path("watching"), "a").close()
                    except OSError:
                        pass
                    self.all_came = True
        if len(self.watched) < self.local_ranks and self.launchers:
            known = {w.pid for w in self.watched.values()}
            for pid in children(self.launchers[0].pid):
                rank, size = env_rank(pid) if pid not in known else (None, None)
                if rank is not None and rank not in self.watched:
                    w = self.watched[rank] = Watched(rank, pid)
                    self._register(w)
                    if size == self.local_ranks:  # the whole job runs on this node
                        self.job_size = size

    def unseen_ranks(self) -> list[int]:
        """Ranks of this node the launcher started but this process never saw (they ended
        before its first look), where the node holds the whole job (their numbers are known)."""
        if len(self.watched) >= self.local_ranks or not self.job_size:
            return []
        if self.launchers:
            known = {w.pid for w in self.watched.values()}
            if any(pid not in known and proc_state(pid) not in (None, "Z", "X")
                   for pid in children(self.launchers[0].pid)):
                return []  # a live child not told apart yet (not yet executed, on a loaded node): it may be one
        return sorted(set(range(self.job_size)) - set(self.watched))

    def lost_unwatched(self) -> list[int]:
        """Ranks that ended before this process could watch them: never seen (where the node holds
        the whole job), or already gone at the first look; which of them ended first is unknown."""
        early = [r for r, w in self.watched.items() if not w.seen_alive and not self.has(f"rank-{r}.end")]
        return sorted(set(self.unseen_ranks()) | set(early))

    def say_lost(self, lost: list[int]) -> None:
        if len(lost) == 1:
            self.say(f"mpifc: rank {lost[0]} ended without a word as it started (killed by a signal, or its "
                     f"process exited); ending the job")
        else:
            self.say(f"mpifc: ranks {', '.join(map(str, lost))} ended without a word as the job started, before "
                     f"the node sentinel could watch them (killed by a signal, or their process exited; the first "
                     f"to end made the launcher end the others, and which one it was is unknown); ending the job")

    def check_abandoned(self) -> None:
        """Before every rank of the node came: no rank of the node is left running (the launcher
        ended them, or is gone), so none will come; ends the job naming what is known."""
        if self.failed or self.all_came or not self.launchers or time.monotonic() - self.started < UNSEEN_GRACE_S:
            return
        if any(not w.ended and not w.gone() for w in self.watched.values()):
            return
        daemon = self.launchers[0]
        if not (daemon.ended or daemon.gone()) and any(
                proc_state(pid) not in (None, "Z", "X") for pid in children(daemon.pid)):
            return
        lost = self.lost_unwatched()
        if lost and not self.reported():
            self.say_lost(lost)
        elif not self.reported():
            self.say("mpifc: the ranks of this node ended as the job started, before the node sentinel could "
                     "watch them (killed by a signal, or their process exited); ending the job")
        self.end_job()

    def check_unseen(self) -> None:
        """Ranks that ended before this process first looked: ends the job naming them."""
        if self.failed or self.all_came or time.monotonic() - self.started < UNSEEN_GRACE_S:
            return
        unseen = self.unseen_ranks()
        if unseen and not self.reported():
            self.say_lost(self.lost_unwatched())
            self.end_job()

    def _forget(self, w: Watched) -> None:
        if w.fd is not None and self.poller is not None:
            try:
                self.poller.unregister(w.fd)
            except OSError:
                pass
            self.by_fd.pop(w.fd, None)
        w.close()

    def read_limit(self) -> None:
        """The job's liveness limit, as the ranks recorded it (``limit``)."""
        text = _read(self.path("limit"))
        try:
            limit = float(text) if text else self.limit
        except ValueError:
            return
        if limit > 0 and limit != self.limit:
            self.limit = limit
            self.period = min(max(limit / 6.0, POLL_MIN_S), 1.0)

    # -- acting ------------------------------------------------------------------------------
    def say(self, line: str, code: int = 1) -> None:
        """Say the line that ends the job, unless another process of the job already said one."""
        if not claim(self.folder, code, line):
            return
        launcher_down = self.released or any(w.ended or w.gone() or stopped(w.pid) for w in self.launchers)
        fd = self.user_err if launcher_down and self.user_err is not None else 2
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def end_job(self, grace_s: float = 0.0) -> None:
        """Kill every rank of this node (the launcher then ends the ranks elsewhere), and any
        stopped launcher process (it would never report the job's end).

        ``grace_s``: when the job reported its own failure, its ranks are ending together with
        one exit code (:mod:`mpifc.runtime.failure`): they are killed only if still there after it.
        """
        now = time.monotonic()
        if not self.failed:
            self.failed = True
            self.kill_at = now + grace_s
            try:
                open(self.path("abort"), "a").close()
            except OSError:
                pass
        if now < self.kill_at:
            return
        for w in self.watched.values():
            if not w.gone():
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except OSError:
                    pass
        for w in self.launchers:
            if not w.gone() and stopped(w.pid):
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except OSError:
                    pass

    def reported(self) -> bool:
        """Whether the job reported its own failure (a rank said the line, or aborted)."""
        return self.has(SAID) or self.has("abort")

    def ended(self, w: Watched) -> None:
        """Process ``w`` has ended (events come in the order the kernel saw them)."""
        if w.ended:
            return
        if w.rank >= 0 and not self.failed:
            # A launcher process watched without a pidfd (already reaped when this process first
            # looked, killed as the job started) is polled after the events: if it is gone, it
            # ended before this rank, whose end follows from its.
            for launcher in self.launchers:
                if not launcher.ended and launcher.fd is None and launcher.gone():
                    self.ended(launcher)
        w.ended = True
        self._forget(w)
        if self.failed:
            return
        if w.rank >= 0:
            if self.has(f"rank-{w.rank}.end"):
                return
            if self.reported():
                self.end_job(REPORTED_GRACE_S)
                return
            # Ranks that ended before this process could watch them ended before this one (if it
            # was seen alive), or with it in an order nobody saw.
            lost = self.lost_unwatched()
            if lost:
                self.say_lost(lost)
            else:
                self.say(f"mpifc: rank {w.rank} ended without a word in phase {self.phase(w.rank)!r} (killed by a "
                         f"signal, or its process exited); ending the job")
            self.end_job()
            return
        # The daemon ends after its ranks, and mpiexec after its daemon: one that ends while a
        # rank or its daemon is still there was killed, and the job reports a failure even if
        # the ranks had done their work.
        running = [r for r, x in self.watched.items() if not x.ended]
        daemon_left = w is not self.launchers[0] and not self.launchers[0].ended and not self.launchers[0].gone()
        if running or len(self.watched) < self.local_ranks or daemon_left:
            if self.reported():
                self.end_job(REPORTED_GRACE_S)
                return
            self.say(f"mpifc: the launcher's {w.name} (pid {w.pid}) ended while the job ran (killed?); "
                     f"ending the job")
            self.end_job()

    def poll(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for processes to end; handle them in the order they ended."""
        if self.poller is not None:
            try:
                events = self.poller.poll(wait)
            except InterruptedError:
                events = []
            for fd, _ in events:  # epoll reports ready descriptors in the order they became ready
                w = self.by_fd.get(fd)
                if w is not None:
                    self.ended(w)
        else:
            time.sleep(wait)
        for w in [*self.watched.values(), *self.launchers]:  # without pidfds (older kernels)
            if not w.ended and w.fd is None and w.gone():
                self.ended(w)

    def check_stopped(self, now: float) -> None:
        """Ranks and launcher processes that stay stopped (SIGSTOP) for the limit."""
        if self.failed:
            return
        for w in [*sorted(self.watched.values(), key=lambda x: x.rank), *self.launchers]:
            if w.ended:
                continue
            if not stopped(w.pid):
                w.stopped_since = None
                continue
            since = w.stopped_since = w.stopped_since if w.stopped_since is not None else now
            age = now - since
            if age > self.limit - self.period:
                if w.rank >= 0:
                    what = f"rank {w.rank} stopped answering in phase {self.phase(w.rank)!r}"
                else:
                    what = f"the launcher's {w.name} (pid {w.pid}) stopped answering"
                self.say(f"mpifc: {what} (its process is stopped: no sign of life for {age:.1f} s, "
                         f"--liveness {self.limit:g}); ending the job")
                self.end_job()
                return

    def check_silent(self) -> None:
        """Ranks before their MPI heartbeats that show no sign of life for the limit (their
        beacon stays stale, and their process does no work: see :class:`Activity`), and ranks
        that never registered."""
        if self.failed:
            return
        wall, now = time.time(), time.monotonic()
        for rank, w in sorted(self.watched.items()):
            if w.ended or self.has(f"rank-{rank}.up") or self.has(f"rank-{rank}.ready"):
                continue  # inside MPI_Init (no beacon), or judged by its MPI peers
            try:
                age = min(wall - os.stat(self.path(f"rank-{rank}")).st_mtime, w.activity.idle_for(now))
            except OSError:
                continue
            if age > self.limit - self.period:
                self.say(f"mpifc: rank {rank} stopped answering in phase {self.phase(rank)!r} (no sign of life "
                         f"for {age:.1f} s, --liveness {self.limit:g}); ending the job")
                self.end_job()
                return
        if len(self.registered) < self.local_ranks and time.monotonic() - self.started > self.start_grace:
            missing = self.local_ranks - len(self.registered)
            self.say(f"mpifc: {missing} of {self.local_ranks} ranks on this node did not start within "
                     f"{self.start_grace:g} s; ending the job")
            self.end_job()

    def in_mpi_init(self) -> list[Watched]:
        """The ranks inside ``MPI_Init`` (``ready``, not yet ``up``), while no file of MPI's shared
        memory is known: MPICH makes its files there."""
        if self.segments:
            return []
        return [w for r, w in sorted(self.watched.items())
                if not w.ended and self.has(f"rank-{r}.ready") and not self.has(f"rank-{r}.up")]

    def look_for_segments(self, ranks: list[Watched], most: int = 4) -> None:
        """Read which files of MPI's shared memory ``ranks`` use (a few ranks a look, in turn: the
        ranks of a node share them), so that they are removed if the job fails."""
        if not ranks:
            return
        for i in range(min(most, len(ranks))):
            self.segments |= shared_memory_of(ranks[(self._looked + i) % len(ranks)].pid)
        self._looked += most

    def stray_segments(self) -> set[str]:
        """Files of MPI's shared memory made since this process started that no process uses any
        more: the job's, where a rank was killed between making one and anyone's look at it (no
        other job's: one that runs holds its files, open or mapped)."""
        return set(unheld(shared_memory_files(since=self.started_wall - 1.0)))

    def cleanup(self) -> None:
        """After every rank is gone: a failed job's outputs (partial or renamed into place), MPI's
        shared memory files, then the folder."""
        failed = self.failed or any(not self.has(f"rank-{r}.end") for r in self.watched)
        segments = set(self.segments)
        try:
            names = os.listdir(self.folder)
        except OSError:
            names = []
        folders = []
        for name in names:
            if failed and name.startswith("stage-"):
                target = (_read(self.path(name)) or "").strip()
                if target and os.path.isdir(target):
                    folders.append(target)  # a folder made for outputs: removed below, once empty
                elif target:
                    remove_partial(target)
            elif failed and name.startswith("commit-"):
                remove_committed(_read(self.path(name)) or "")
            elif failed and name.startswith("temps-"):
                remove_temps((_read(self.path(name)) or "").strip())
            elif name.startswith("shm-"):
                segments |= {seg for seg in (_read(self.path(name)) or "").split("\n") if shm_segment(seg)}
            try:
                os.unlink(self.path(name))
            except OSError:
                pass
        remove_files(segments)
        if failed:  # after the known ones are gone: it looks at every process only when some file is
            remove_files(self.stray_segments())  # left to judge (a job that ends well removes its own)
        for folder in sorted(folders, key=len, reverse=True):  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: someone else's files are in it
        try:
            os.rmdir(self.folder)
        except OSError:
            pass

    def finished(self) -> bool:
        """Every rank of the node has registered and ended, and no launcher process is left
        (one stopped after the ranks ended is ended: a frozen ``mpiexec`` never returns)."""
        if len(self.watched) < self.local_ranks or not all(w.ended for w in self.watched.values()):
            return False
        self.release_stderr()
        return all(w.ended or w.gone() for w in self.launchers)

    def release_stderr(self) -> None:
        """Once the ranks are gone: the launcher waits for the end of their output, which this
        process holds too (its standard error): let go of it (a later line goes to mpiexec's own)."""
        if self.released:
            return
        self.released = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            pass

    def run(self) -> None:
        quiet_since = next_check = 0.0
        while True:
            self.read_limit()
            self.scan()
            # Until every rank of the node has come, look for new ones often: the ranks wait for
            # that before they start MPI.
            initializing = self.in_mpi_init()
            self.look_for_segments(initializing)
            self.poll(self.period if self.all_came and not initializing else POLL_MIN_S)
            if self.finished():
                break
            if not self.watched and time.monotonic() - self.started > self.start_grace:
                break  # nobody came (the job failed before any rank registered)
            if self.failed:
                self.end_job()  # a rank that registered after the failure goes too
                if all(w.gone() for w in self.watched.values()):
                    self.release_stderr()
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 3 * self.period:
                        break  # nobody left, and nobody new came meanwhile
                else:
                    quiet_since = 0.0
                continue
            now = time.monotonic()
            if now >= next_check:  # once a period, however often new ranks are looked for
                next_check = now + self.period
                self.check_stopped(now)
                self.check_silent()
                self.check_unseen()
                self.check_abandoned()
        self.cleanup()


def main(argv: list[str]) -> int:
    folder, limit, local_ranks = argv[1], float(argv[2]), int(argv[3])
    launchers = []
    for spec in argv[4:]:
        name, _, pid = spec.rpartition(":")
        if pid.isdigit():
            launchers.append((name, int(pid)))
    if os.environ.pop("MPIFC_SENTINEL_CLAIM", ""):
        # Started with the node's claim (held on a descriptor for this process's life): make the
        # folder, which from then on always has a sentinel to remove it (mpifc.runtime.early.meet).
        try:
            os.mkdir(folder, 0o700)
        except OSError:
            return 0  # there already (another sentinel's), or it cannot be made: nothing to watch
    # A rank may start this process with signals blocked for its own signal thread.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C on the terminal is for the ranks
    sentinel = Sentinel(folder, limit, local_ranks, launchers)
    sentinel.scan()
    try:  # written once this process watches: what ends from here on, it sees end
        with open(os.path.join(folder, "sentinel.pid"), "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass

    def terminated(signum: int, frame: object) -> None:
        # The job is being ended from outside (scancel, a batch system's time limit): the ranks
        # get the same signal; stay to see them gone, then remove their partial outputs.
        sentinel.failed = True

    signal.signal(signal.SIGTERM, terminated)
    sentinel.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
