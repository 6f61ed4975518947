"""The node sentinel: one small process per node that watches the job's ranks from outside MPI.

Why a process of its own. Three things cannot be seen from inside an MPI rank:

* a rank killed by a signal: the launcher (MPICH's hydra, for one) answers by killing every
  other rank with SIGKILL within milliseconds, so no surviving rank can say which one was lost,
  and the launcher's own banner names a process id, not a rank;
* a rank frozen before MPI is up: ``MPI_Init`` waits for every rank, with the GIL held, so no
  Python thread of a waiting rank runs until the frozen one arrives;
* a partial output left by a rank that was killed while writing it.

The first rank of a job to reach a node starts the sentinel (:mod:`mpifc.runtime.node`) in a
process group of its own, so the launcher's kill does not reach it; it uses only the standard
library and starts in a few tens of milliseconds. It reads the node folder the ranks keep
(``rank-R``: the process id, touched as a beacon until the rank's MPI heartbeats run;
``rank-R.phase``; markers ``rank-R.ready`` (entering ``MPI_Init``), ``rank-R.up`` (heartbeats
running), ``rank-R.final`` (heartbeats stopped), ``rank-R.end`` (a normal end); ``abort``: the job
reported its own failure; ``stage-R-N``: a partial output file, or a folder made for outputs), writes ``watching`` once it
watches every rank of the node (the ranks wait for that before they start MPI), and acts on
what it sees:

* a rank whose process ended without ``rank-R.end``: unless the job reported its failure
  itself, one line ``mpifc: rank R ended without a word in phase 'P' ...``; then every rank of
  the node is killed, so that the launcher ends the whole job;
* a rank that has not reached its MPI heartbeats (start-up) and shows no sign of life for the
  liveness limit (its beacon went stale, or, while it is inside ``MPI_Init`` or past its
  heartbeats, its process is stopped): ``mpifc: rank R stopped answering in phase 'P' ...``,
  and the node's ranks are killed;
* fewer ranks than the launcher started on this node registered within a generous start-up
  grace: one line, and the node's ranks are killed;
* once every rank of the node is gone: partial outputs of a failed job are removed, the
  folder is removed, and the sentinel exits. SIGTERM (``scancel``, a batch system's time
  limit) counts as a failure: the sentinel stays until the ranks are gone, then cleans up.

Ranks whose MPI heartbeats run are judged by their peers (:mod:`mpifc.runtime.liveness`), not
here. The sentinel prints on the standard error it inherited from the rank that started it,
which the launcher forwards as the rank's own output.

Run as ``python -I -S sentinel.py FOLDER LIMIT_S LOCAL_RANKS``.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_MIN_S = 0.02


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


PF_EXITING = 0x4
"""The kernel's per-task flag (``/proc/PID/stat`` field 9) of a process inside ``exit``."""


def exiting(pid: int) -> bool:
    """Whether process ``pid`` is on its way out: gone, a zombie, or inside ``exit`` (killed, its
    exit not yet complete)."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return True
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return False


def remove_partial(target: str) -> None:
    """Remove a partial output file and the temp files an atomic write of it left beside it."""
    folder, name = os.path.split(target)
    try:
        os.unlink(target)
    except OSError:
        pass
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


class Watched:
    """One rank of this node: its process id and, where the kernel has them, a pidfd."""

    def __init__(self, rank: int, pid: int) -> None:
        self.rank = rank
        self.pid = pid
        self.ended = False
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None  # older kernels: polled with kill(pid, 0)

    def gone(self) -> bool:
        if self.ended:
            return True
        if self.fd is not None:
            r, _, _ = select.select([self.fd], [], [], 0)
            return bool(r)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return proc_state(self.pid) in (None, "Z", "X")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Sentinel:
    """The watch over one node folder (see the module docstring)."""

    def __init__(self, folder: str, limit_s: float, local_ranks: int) -> None:
        self.folder = folder
        self.limit = limit_s
        self.local_ranks = local_ranks
        self.period = min(max(limit_s / 6.0, POLL_MIN_S), 1.0)
        # Interpreter start-up and imports before a rank registers: slow on a loaded node, but
        # never this slow; a rank missing after it will not come.
        self.start_grace = max(3.0 * limit_s, 30.0)
        self.started = time.monotonic()
        self.watched: dict[int, Watched] = {}
        self.failed = False
        self.stopped_since: dict[int, float] = {}

    # -- the folder ------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def has(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def phase(self, rank: int) -> str:
        return (_read(self.path(f"rank-{rank}.phase")) or "startup").strip() or "startup"

    def scan(self) -> None:
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
            if rank in self.watched:
                continue
            text = _read(self.path(name))
            if text and text.strip().isdigit():
                self.watched[rank] = Watched(rank, int(text.strip()))
                if len(self.watched) == self.local_ranks:
                    # The ranks wait for this before they go on (mpifc.runtime.node): from here on
                    # a rank that dies is seen before the ranks the launcher kills after it.
                    try:
                        open(self.path("watching"), "a").close()
                    except OSError:
                        pass

    # -- acting ------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        try:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def end_job(self) -> None:
        """Kill every rank of this node (the launcher then ends the ranks elsewhere)."""
        self.failed = True
        try:
            open(self.path("abort"), "a").close()
        except OSError:
            pass
        for w in self.watched.values():
            if not w.gone():
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except OSError:
                    pass

    def check_ended(self) -> bool:
        """Handle ranks whose process ended; True once every rank of the node is gone."""
        lost = []
        for rank, w in sorted(self.watched.items()):
            if w.ended or not w.gone():
                continue
            w.ended = True
            w.close()
            if not self.has(f"rank-{rank}.end"):
                lost.append(rank)
        if lost and not self.failed:
            # A rank killed by a signal makes the launcher kill the others, and one of those may
            # finish exiting first: every rank already on its way out without its end mark is
            # named with the lost one (the first to die among them cannot be told apart).
            lost = sorted(set(lost) | {r for r, w in self.watched.items()
                                       if not w.ended and not self.has(f"rank-{r}.end") and exiting(w.pid)})
            if not self.has("abort"):
                who = f"rank {lost[0]}" if len(lost) == 1 else "ranks " + ", ".join(str(r) for r in lost)
                phases = sorted({self.phase(r) for r in lost})
                self.say(f"mpifc: {who} ended without a word in phase {phases[0]!r} (killed by a signal, "
                         f"or its process exited); ending the job")
            self.end_job()
        return len(self.watched) >= self.local_ranks and all(w.ended for w in self.watched.values())

    def check_silent(self, now: float) -> None:
        """Ranks outside their MPI heartbeats that show no sign of life for the limit."""
        if self.failed:
            return
        wall = time.time()
        for rank, w in sorted(self.watched.items()):
            if w.ended:
                continue
            up, final = self.has(f"rank-{rank}.up"), self.has(f"rank-{rank}.final")
            final = final or self.has(f"rank-{rank}.end")  # past its heartbeats, on its way out
            if up and not final:
                continue  # its MPI peers judge it (mpifc.runtime.liveness)
            state = proc_state(w.pid)
            if state == "T" or state == "t":
                since = self.stopped_since.setdefault(rank, now)
            else:
                self.stopped_since.pop(rank, None)
                since = None
            if final or self.has(f"rank-{rank}.ready"):
                # Inside MPI_Init (the GIL is held: no beacon) or past its heartbeats: only a
                # stopped process is silent.
                age = now - since if since is not None else 0.0
            else:
                try:
                    age = wall - os.stat(self.path(f"rank-{rank}")).st_mtime
                except OSError:
                    continue
            if age > self.limit - self.period:
                self.say(f"mpifc: rank {rank} stopped answering in phase {self.phase(rank)!r} (no sign of life "
                         f"for {age:.1f} s, --liveness {self.limit:g}); ending the job")
                self.end_job()
                return
        if len(self.watched) < self.local_ranks and now - self.started > self.start_grace:
            missing = self.local_ranks - len(self.watched)
            self.say(f"mpifc: {missing} of {self.local_ranks} ranks on this node did not start within "
                     f"{self.start_grace:g} s; ending the job")
            self.end_job()

    def cleanup(self) -> None:
        """After every rank is gone: a failed job's partial outputs, then the folder."""
        failed = self.failed or any(not self.has(f"rank-{r}.end") for r in self.watched)
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
            try:
                os.unlink(self.path(name))
            except OSError:
                pass
        for folder in sorted(folders, key=len, reverse=True):  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: someone else's files are in it
        try:
            os.rmdir(self.folder)
        except OSError:
            pass

    def run(self) -> None:
        quiet_since = 0.0
        while True:
            self.scan()
            fds = [w.fd for w in self.watched.values() if w.fd is not None and not w.ended]
            # Until every rank of the node is watched, look for new ones often: a rank killed
            # before it is watched could not be told from the ranks the launcher kills after it.
            wait = self.period if len(self.watched) >= self.local_ranks else POLL_MIN_S
            if fds:
                select.select(fds, [], [], wait)
            else:
                time.sleep(wait)
            if self.check_ended():
                break
            if not self.watched and time.monotonic() - self.started > self.start_grace:
                break  # nobody came (the job failed before any rank registered)
            if self.failed:
                self.end_job()  # a rank that registered after the failure goes too
                if all(w.gone() for w in self.watched.values()):
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 3 * self.period:
                        break  # nobody left, and nobody new came meanwhile
                else:
                    quiet_since = 0.0
                continue
            self.check_silent(time.monotonic())
        self.cleanup()


def main(argv: list[str]) -> int:
    folder, limit, local_ranks = argv[1], float(argv[2]), int(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C on the terminal is for the ranks
    try:
        with open(os.path.join(folder, "sentinel.pid"), "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass
    sentinel = Sentinel(folder, limit, local_ranks)

    def terminated(signum: int, frame: object) -> None:
        # The job is being ended from outside (scancel, a batch system's time limit): the ranks
        # get the same signal; stay to see them gone, then remove their partial outputs.
        sentinel.failed = True

    signal.signal(signal.SIGTERM, terminated)
    sentinel.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
