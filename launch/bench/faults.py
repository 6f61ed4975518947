"""The fault matrix: signals to every process of a job at many moments, and faults inside a rank.

Run (from the repo root, venv python)::

    python launch/bench/faults.py [--liveness 3] [--parallel 3] [--moments 10] [--out faults.csv]
    python launch/bench/faults.py --sample          # the few cells tests/reliability runs
    python launch/bench/faults.py --jobs train --targets "rank 1,mpiexec" --when up,final

The jobs: ``mpiexec -n 3`` (a server and two clients on breast-cancer shards, ``--learner
factorized``) running ``mpifc train``, ``mpifc evaluate --distributed`` and ``mpifc query
--distributed --what predict``, each with ``--ledger``.

Signal cells (job x target x signal x moment): SIGSTOP (freeze), SIGKILL, SIGTERM and SIGINT,
sent from outside to each rank, to ``mpiexec`` and to its per-node daemon ``hydra_pmi_proxy``, at
``--moments`` moments of the job: spread over its run (fractions of the median time of clean
runs measured first, each before the last 0.5 s; start-up included), as soon as the launcher's
daemon has started every rank (their interpreters start), as soon as MPI is up and 0.25 s later,
and two in its last 0.5 s (as soon as rank 0 has put its outputs in place, and 0.1 s later).
Injected cells (phase x fault, the in-process
hooks of :mod:`mpifc.runtime.faults`): an exception or an early return of a client or of the
server at each phase of ``train`` and at ``query`` of ``evaluate --distributed``.

How a cell must end (``ok``):

* within ``--liveness`` + 5 s of the fault (``seconds``: from the fault to the end of ``mpiexec``);
* failed, cleanly: a non-zero exit code; exactly one line starting ``mpifc:`` (``lines``),
  naming the right process (``named``): ``rank R`` for a rank; for ``mpiexec`` and the daemon,
  the launcher (killed or frozen) or the whole job (SIGINT: ``interrupted``, exit code 130;
  SIGTERM: ``the job received SIGTERM``, 143), never a rank; no output (model, ledger, answer)
  at its final path nor partial file beside it; no file of MPI's shared memory in ``/dev/shm``
  that the job's ranks held open or mapped (read from ``/proc`` while they live, so that the
  files of other jobs on the machine never count; see :class:`SegmentWatch`), no node folder and
  no process of the job left a few seconds after ``mpiexec`` ended;
* or, where the signal ends a process before any process of the job can see it go
  (``unwatched``, see :func:`_unwatched`: before the node sentinel's first look, SIGKILL of a rank,
  ``mpiexec`` or its daemon, or SIGTERM/SIGINT that reaches a rank before its first line of mpifc
  has run, whose default action ends it; the launcher kills the other ranks within milliseconds,
  so nobody is left who saw which process ended first): failed, within the same time, with no
  leftovers, and no ``mpifc:`` line or one that names the rank among those that ended (never
  another rank alone). The table counts these cells apart;
* or, where the signal does not end the job (SIGTERM and SIGINT to the daemon, which hydra
  ignores), succeeded, cleanly, however long the rest of the job took: exit code 0, no
  ``mpifc:`` line, every output in place, nothing else left.

``lost`` (counted apart, neither ok nor failed): SIGTERM or SIGINT to ``mpiexec`` before any
rank ran its program, after which the job ran to its end and succeeded cleanly (exit code 0, no
``mpifc:`` line, every output in place, nothing else left). hydra drops such a signal: its
``mpiexec`` passes a signal on to the daemons it is connected to, and a daemon to the process
groups of the ranks it has started. One that comes before the daemon has connected back is
written nowhere (MPICH 5.0.2's ``mpiexec`` may print ``HYDU_sock_write ... write error (Bad file
descriptor)``), and a rank still between its fork and its exec runs hydra's own handler, which
ignores it. No process of mpifc exists yet at that point. The same happens without mpifc:
:func:`hydra_drops` sends the signal to the ``mpiexec`` of a plain mpi4py job before its daemon
has started a rank, and the matrix prints how often that job still completed with exit code 0
whenever a cell was lost (measured by hand at the moment the daemon has forked every rank, none
yet running Python: 5 plain jobs of 20 completed). A second Ctrl-C makes hydra kill the job. A
cell signalled at that point that ends any other way is judged as above.

A signal that finds its process gone or done (a rank that marked its normal end and is exiting;
``mpiexec`` or its daemon once every rank has marked its normal end or is gone; an ``mpiexec``
with no daemon left) is counted ``missed``, not run. Printed: the table of failed cells, then per
job and target the runs, hangs (no end within ``liveness + 5`` s), the worst end time, misnamed
runs, runs with leftovers, unwatched and lost cells; the lost cells and hydra's own figure; the
files of MPI's shared memory the cells left, and those that appeared during the run, stay and
are used by nobody, that no cell's ranks were seen to use (:func:`stray_segments`); the load
average beside the figures. The exit status is 0 only if no cell failed.
"""

import argparse
import csv
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
N_RANKS = 3
JOBS = ("train", "evaluate", "query")
TARGETS = ("rank 0", "rank 1", "rank 2", "mpiexec", "hydra_pmi_proxy")
SIGNALS = ("STOP", "KILL", "TERM", "INT")
IGNORED = {("hydra_pmi_proxy", "TERM"), ("hydra_pmi_proxy", "INT")}  # hydra's daemon ignores these
PHASES = ("startup", "read", "learn", "gather", "write", "query")
INJECTED = {  # label -> (rank, kind)
    "client raise": (2, "raise"), "server raise": (0, "raise"),
    "client return": (2, "return"), "server return": (0, "return"),
}
SAMPLE_SIGNALS = [  # (job, target, signal, moment): the sample tests/reliability runs
    ("evaluate", "rank 0", "STOP", "phase:query"), ("train", "rank 2", "KILL", "phase:learn"),
    ("train", "rank 1", "TERM", "up+0.1"), ("query", "mpiexec", "INT", "up"),
    ("evaluate", "hydra_pmi_proxy", "KILL", "up+0.2"), ("train", "mpiexec", "STOP", "final"),
    ("query", "rank 1", "INT", "up+0.3"), ("train", "rank 2", "KILL", "phase:startup"),
    ("evaluate", "rank 1", "TERM", "phase:startup"), ("train", "hydra_pmi_proxy", "KILL", "launched"),
    ("evaluate", "rank 1", "KILL", "shm"),
]
SAMPLE_INJECTED = [("learn", "client raise"), ("query", "server return"), ("write", "client return")]


@dataclass
class Cell:
    """How one faulted job ended."""

    job: str
    target: str
    fault: str
    moment: str
    injected: bool = False
    missed: bool = False
    seconds: float | None = None
    exit: int | None = None
    named: bool = False
    lines: int = 0
    line: str = ""
    leftovers: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)  # files of MPI's shared memory the job's ranks held
    unwatched: bool = False  # a rank ended by the signal before any process of mpifc could see it go
    lost: bool = False  # SIGTERM/SIGINT that hydra's mpiexec dropped (see the module docstring)
    ok: bool = False


def _mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else "mpiexec"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("MPIFC_FAULT", "MPIFC_FAULT_LOG"):
        env.pop(name, None)
    env.update(extra or {})
    return env


def prepare(work: Path, liveness: float) -> dict[str, Path]:
    """Breast-cancer shards for two clients, a model trained on them, and query rows."""
    shards, model, rows = work / "shards", work / "model.h5", work / "rows.csv"
    if not (shards / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "breast-cancer", "--setting", "horizontal",
                        "--clients", str(N_RANKS - 1), "--seed", "0", "--out", str(shards)],
                       check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
    if not model.is_file():
        subprocess.run([_mpiexec(), "-n", str(N_RANKS), sys.executable, "-m", "mpifc", "train", str(shards),
                        "--learner", "factorized", "--seed", "0", "--model", str(model), "--liveness", str(liveness)],
                       check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
    if not rows.is_file():
        subprocess.run([sys.executable, "-c", _ROWS_SCRIPT, str(model), str(shards), str(rows)],
                       check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
    return {"shards": shards, "model": model, "rows": rows}


_ROWS_SCRIPT = """
import csv, sys
import numpy as np
from data_prep.codec import RowCodec
from data_prep.shards import read_test
from mpifc.federated.serialize import load_fc
model, shards, out = sys.argv[1:]
codec = RowCodec.from_json(load_fc(model).meta["codec"])
test = read_test(shards)
x = test.x[:, [test.features.index(f) for f in codec.features]]
cols = codec.decode(x)
with open(out, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(codec.features)
    for i in range(len(x)):
        w.writerow(["" if v is None or (isinstance(v, float) and np.isnan(v)) else v
                    for v in (cols[name][i] for name in codec.features)])
"""


def job_command(job: str, files: dict[str, Path], out: Path, liveness: float) -> tuple[list[str], list[Path]]:
    """``(mpiexec command, its output files)`` of one job writing into ``out``."""
    if job == "train":
        args = ["train", str(files["shards"]), "--learner", "factorized", "--seed", "0",
                "--model", str(out / "model.h5"), "--ledger", str(out / "ledger.csv")]
        finals = [out / "model.h5", out / "ledger.csv"]
    elif job == "evaluate":
        args = ["evaluate", str(files["shards"]), "--model", str(files["model"]), "--distributed",
                "--ledger", str(out / "ledger.csv"), "--output-npz", str(out / "joint.npz")]
        finals = [out / "ledger.csv", out / "joint.npz"]
    else:
        args = ["query", str(files["model"]), "--data", str(files["rows"]), "--what", "predict", "--distributed",
                "--out", str(out / "answers.csv"), "--ledger", str(out / "ledger.csv")]
        finals = [out / "answers.csv", out / "ledger.csv"]
    cmd = [_mpiexec(), "-n", str(N_RANKS), sys.executable, "-m", "mpifc", *args, "--liveness", f"{liveness:g}",
           "--quiet"]
    return cmd, finals


# -- processes --------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, str] | None:
    """``(comm, state)`` of a process, or None if gone."""
    from mpifc.runtime.early import _stat_fields

    got = _stat_fields(pid)
    return None if got is None or not got[1] else (got[0], got[1][0])


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
            return [int(t) for t in f.read().split()]
    except OSError:
        return []


def rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"PMI_RANK="):
            return int(item[9:])
    return None


class JobProcesses:
    """The processes of one running job, found from its ``mpiexec``."""

    def __init__(self, mpiexec: int) -> None:
        self.mpiexec = mpiexec
        self.proxy: int | None = None
        self.ranks: dict[int, int] = {}
        self.start: str | None = None  # the daemon's start time (its node folder's name)

    def refresh(self) -> None:
        if self.proxy is None:
            for c in children(self.mpiexec):
                st = _stat(c)
                if st and st[0] == "hydra_pmi_proxy":
                    self.proxy = c
                    try:
                        with open(f"/proc/{c}/stat", encoding="utf-8") as f:
                            self.start = f.read().rsplit(")", 1)[1].split()[19]
                    except (OSError, IndexError):
                        pass
        if self.proxy is not None and len(self.ranks) < N_RANKS:
            for c in children(self.proxy):
                r = rank_of(c)
                if r is not None:
                    self.ranks.setdefault(r, c)

    def pid_of(self, target: str) -> int | None:
        self.refresh()
        if target == "mpiexec":
            return self.mpiexec
        if target == "hydra_pmi_proxy":
            return self.proxy
        return self.ranks.get(int(target.split()[1]))

    def folder(self) -> Path | None:
        if self.proxy is None or self.start is None:
            return None
        return Path("/dev/shm") / f"mpifc-{os.getuid()}-{self.proxy}-{self.start}"


class SegmentWatch:
    """The files of MPI's shared memory in ``/dev/shm`` that a job's ranks hold open or map, read
    from ``/proc`` by a thread while they live: what the job made, told apart from the files of
    the other jobs on the machine (other cells, other users' jobs) by who uses them, never by
    their names or times. Often (every few milliseconds) while a rank is inside ``MPI_Init``,
    where MPICH makes its files, then once in a while."""

    FAST_S, WAIT_S, SLOW_S = 0.004, 0.05, 0.25  # inside MPI_Init; before it; once the files are known

    def __init__(self, procs: "JobProcesses") -> None:
        self.procs = procs
        self.seen: set[str] = set()
        self._shown: set[int] = set()  # ranks (pids) seen holding a file
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults-shm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from mpifc.runtime.sentinel import shared_memory_of

        while True:
            self.procs.refresh()
            folder = self.procs.folder()
            fast = False
            for r, pid in list(self.procs.ranks.items()):
                got = shared_memory_of(pid)
                self.seen |= got
                if got:
                    self._shown.add(pid)
                elif folder is None or (folder / f"rank-{r}.ready").exists() or not folder.exists():
                    fast = True  # inside MPI_Init (or not told): its files come any moment
            if fast or len(self.procs.ranks) < N_RANKS:
                wait = self.FAST_S
            else:
                wait = self.SLOW_S if self._shown else self.WAIT_S
            if self._stop.wait(wait):
                return

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(timeout=5.0)
        return self.seen


def stray_segments(before: set[str], cells: list["Cell"]) -> list[str]:
    """Files of MPI's shared memory that appeared in ``/dev/shm`` since ``before`` (a listing
    taken as the matrix started), stay, and are used by no process, but that no cell's ranks were
    seen to use: made by a job of the matrix killed in the few milliseconds between making one
    and the next look, or by another job on the machine (which of the two is unknown)."""
    from mpifc.runtime.sentinel import shared_memory_files, unheld

    ours = {s for c in cells for s in c.segments}
    return unheld(set(shared_memory_files()) - before - ours)


# -- one cell -----------------------------------------------------------------------------------
def named_in(stderr: str, target: str) -> tuple[bool, str]:
    """Whether the ``mpifc:`` line names ``target`` (a rank: ``rank R``/``ranks A, R``; the
    launcher: the launcher or the whole job, and no rank); the first ``mpifc:`` line."""
    line = next((ln for ln in stderr.splitlines() if ln.startswith("mpifc:")), "")
    if target.startswith("rank "):
        rank = int(target.split()[1])
        m = re.match(r"mpifc: ranks? (\d+(?:, \d+)*)", line)
        return bool(m and rank in {int(t) for t in m.group(1).split(", ")}), line
    ok = re.match(r"mpifc: (the launcher's |interrupted |the job received )", line) is not None
    return ok, line


def _event(moment: str, folder: Path | None) -> bool:
    """Whether the node folder shows the event a moment waits for."""
    if folder is None:
        return False
    if moment.startswith("folder"):
        return folder.exists()
    if moment.startswith("up"):
        return (folder / "rank-0.up").exists()
    if moment.startswith("final"):
        return (folder / "rank-0.final").exists()
    phase = moment.split(":", 1)[1]
    for p in folder.glob("rank-*.phase"):
        try:
            if p.read_text().strip() == phase:
                return True
        except OSError:
            pass
    return False


def _moment_waiter(moment: str, procs: JobProcesses, t0: float, duration: float,
                   segments: "SegmentWatch | None" = None):
    """A function that returns True once the cell's moment has come (False if the job ended
    first). A moment is a fraction of ``duration`` after the start, or an event of the job:
    ``daemon`` (the launcher's daemon runs), ``launched`` (the daemon has started every rank:
    their interpreters start), ``folder`` (the node folder exists), ``shm`` (inside ``MPI_Init``,
    as soon as a rank is seen to use a file of MPI's shared memory, see :class:`SegmentWatch`),
    ``up`` (rank 0's heartbeats run: MPI is up), ``phase:P`` (a rank announced phase ``P``),
    ``final`` (rank 0 has put its outputs in place); the last five with an optional
    ``+SECONDS``. ``daemon``, ``folder`` and ``shm`` are not among :func:`moments` (for targeted
    runs, ``--when``)."""
    event, _, delay = moment.partition("+")

    def wait(proc: subprocess.Popen) -> bool:
        if event in ("daemon", "launched"):
            while proc.poll() is None:
                procs.refresh()
                if procs.proxy is not None and len(children(procs.proxy)) >= (N_RANKS if event == "launched" else 0):
                    return True
                time.sleep(0.0005)
            return False
        if event == "shm":
            while proc.poll() is None:
                if segments is not None and segments.seen:
                    time.sleep(float(delay or 0.0))
                    return proc.poll() is None
                time.sleep(0.001)
            return False
        if event[0].isdigit():
            at = t0 + float(event) * duration
            while time.monotonic() < at:
                if proc.poll() is not None:
                    return False
                procs.refresh()
                time.sleep(min(0.005, max(0.0, at - time.monotonic())))
            return proc.poll() is None
        while proc.poll() is None:
            procs.refresh()
            if _event(event, procs.folder()):
                time.sleep(float(delay or 0.0))
                return proc.poll() is None
            time.sleep(0.002)
        return False
    return wait


def run_cell(job: str, target: str, fault: str, moment: str, files: dict[str, Path], work: Path,
             liveness: float, duration: float, timeout: float = 120.0) -> Cell:
    """Run one job, fault it, and check how it ended (see the module docstring).

    ``fault``: a signal name (``STOP``, ``KILL``, ``TERM``, ``INT``) sent to ``target`` at
    ``moment`` (see :func:`_moment_waiter`), or an injected fault label (:data:`INJECTED`) at
    phase ``moment``.
    """
    cell = Cell(job, target, fault, moment)
    d = work / "cells" / f"{job}-{target.replace(' ', '')}-{fault.replace(' ', '-')}-{moment}"
    shutil.rmtree(d, ignore_errors=True)
    log, out = d / "log", d / "out"
    out.mkdir(parents=True)
    cmd, finals = job_command(job, files, out, liveness)
    extra = {"MPIFC_FAULT_LOG": str(log)}
    if fault in INJECTED:
        rank, kind = INJECTED[fault]
        extra["MPIFC_FAULT"] = f"{rank}:{moment}:{kind}"
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(extra),
                            cwd=REPO, start_new_session=True)
    procs = JobProcesses(proc.pid)
    segments = SegmentWatch(procs)
    err_parts: list[str] = []
    reader = threading.Thread(target=lambda: err_parts.append(proc.stderr.read()), daemon=True)
    reader.start()
    fault_at = None
    before_ranks = False
    if fault not in INJECTED:
        if _moment_waiter(moment, procs, t0, duration, segments)(proc):
            pid = procs.pid_of(target)
            while pid is None and proc.poll() is None:  # a rank not started yet: send as it appears
                time.sleep(0.002)
                pid = procs.pid_of(target)
            if pid is not None and alive(pid) and not _done(target, procs):
                cell.unwatched = _unwatched(target, fault, pid, procs)
                before_ranks = target == "mpiexec" and fault in ("TERM", "INT") and not _a_rank_runs(procs)
                os.kill(pid, getattr(signal, f"SIG{fault}"))
                fault_at = time.monotonic()
        if fault_at is None:
            cell.missed = True
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        cell.leftovers.append(f"job still running after {timeout:g} s")
    ended = time.monotonic()
    reader.join(timeout=10.0)  # stderr ends once every holder of it (ranks, sentinel) is gone
    procs.refresh()
    err = "".join(err_parts)
    cell.exit = proc.returncode
    if fault in INJECTED:
        fault_file = log / "fault"
        if fault_file.is_file():
            cell.injected = True
            cell.seconds = time.time() - (time.monotonic() - ended) - float(fault_file.read_text().split()[3])
        else:
            cell.missed = True
    elif fault_at is not None:
        cell.injected = True
        cell.seconds = ended - fault_at
    cell.lines = sum(1 for ln in err.splitlines() if ln.startswith("mpifc:"))
    cell.named, cell.line = named_in(err, target if fault not in INJECTED else f"rank {INJECTED[fault][0]}")
    # A signal to mpiexec before any rank ran its program, after which the job ran to its end:
    # hydra dropped it (no process of mpifc existed yet to see it); anything else is judged below.
    dropped = before_ranks and proc.returncode == 0
    cell.leftovers += _leftovers(procs, log, out, finals, segments,
                                 success=(target, fault) in IGNORED or dropped)
    cell.segments = sorted(segments.seen)
    cell.lost = dropped and cell.lines == 0 and not cell.leftovers
    cell.ok = cell.injected and not cell.missed and not cell.lost and _ended_well(cell, liveness)
    return cell


_PLAIN_JOB = "from mpi4py import MPI; import time; c = MPI.COMM_WORLD; c.Barrier(); time.sleep(1.0); c.Barrier()"


def hydra_drops(sig: str, tries: int = 3) -> tuple[int, int]:
    """hydra on its own: ``SIG<sig>`` to the ``mpiexec`` of a plain mpi4py job of ``N_RANKS``
    ranks (no mpifc), once its daemon runs and before the daemon has started a rank; ``(times the
    signal went at that point, times the job then completed with exit code 0)``."""
    sent = completed = 0
    for _ in range(4 * tries):
        if sent >= tries:
            break
        proc = subprocess.Popen([_mpiexec(), "-n", str(N_RANKS), sys.executable, "-c", _PLAIN_JOB],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd=REPO,
                                start_new_session=True)
        procs = JobProcesses(proc.pid)
        until = time.monotonic() + 30.0
        while procs.proxy is None and proc.poll() is None and time.monotonic() < until:
            procs.refresh()
            time.sleep(0.0005)
        hit = procs.proxy is not None and not children(procs.proxy)
        if hit:
            os.kill(proc.pid, getattr(signal, f"SIG{sig}"))
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        sent += hit
        completed += hit and proc.returncode == 0
    return sent, completed


def _a_rank_runs(procs: JobProcesses) -> bool:
    """Whether a rank of ``mpiexec``'s daemon runs its program: a child of the daemon no longer
    runs hydra's own code (between its fork and its exec, where hydra's handler ignores SIGTERM
    and SIGINT)."""
    procs.refresh()
    return procs.proxy is not None and any((_stat(c) or ("hydra_pmi_proxy",))[0] != "hydra_pmi_proxy"
                                           for c in children(procs.proxy))


def _takes_signals(pid: int) -> bool:
    """Whether process ``pid`` blocks SIGTERM for its signal thread (mpifc's first line has run)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            blocked = next((int(ln.split()[1], 16) for ln in f if ln.startswith("SigBlk:")), 0)
    except (OSError, ValueError):
        return False
    return bool(blocked & (1 << (signal.SIGTERM - 1)))


def _unwatched(target: str, fault: str, pid: int, procs: JobProcesses) -> bool:
    """Whether a signal to ``target`` now ends a process that no process of the job can see go:
    the node sentinel does not watch yet (it writes ``sentinel.pid`` after its first look), and

    * to a rank: SIGKILL, or SIGTERM/SIGINT before the rank's first line of mpifc has run (their
      default action ends it). The launcher then kills every other rank within milliseconds;
    * to ``mpiexec`` or its daemon: SIGKILL (the daemon, and the ranks with it, end at once;
      with no sentinel watching, nobody is left to say why), or, to ``mpiexec``, SIGTERM/SIGINT
      while a rank has not started or has not run its first line of mpifc (hydra passes the
      signal on to every rank, and its default action ends such a rank, with Python's own
      message at most)."""
    if fault == "STOP":
        return False
    folder = procs.folder()
    if folder is not None and (folder / "sentinel.pid").exists():
        return False
    if target.startswith("rank "):
        return fault == "KILL" or not _takes_signals(pid)
    if fault == "KILL":
        return True
    return target == "mpiexec" and (len(procs.ranks) < N_RANKS or
                                    not all(_takes_signals(p) for p in procs.ranks.values()))


def _done(target: str, procs: JobProcesses) -> bool:
    """Whether ``target`` has done its part of the job (a signal then comes after the job): a
    rank has marked its normal end (it is exiting); the daemon and mpiexec once every rank has
    marked its normal end or is gone; mpiexec with no daemon left."""
    folder = procs.folder()
    if target.startswith("rank "):
        return folder is not None and (folder / f"rank-{target.split()[1]}.end").exists()
    if len(procs.ranks) == N_RANKS and all(not alive(p) or (folder is not None and (folder / f"rank-{r}.end").exists())
                                           for r, p in procs.ranks.items()):
        return True
    return target == "mpiexec" and procs.proxy is not None and not alive(procs.proxy)


def moments(n: int) -> list[str]:
    """``n`` moments (see :func:`_moment_waiter`): ``n - 5`` fractions of the job's time spread
    before its last 0.5 s (start-up included), the ranks just started by the launcher, MPI up and
    0.25 s later, and the job's last 0.5 s: rank 0's outputs in place and 0.1 s later."""
    k = max(n - 5, 1)
    return [f"{(i + 0.5) / k:.2f}" for i in range(k)] + ["launched", "up", "up+0.25", "final", "final+0.1"]


def _leftovers(procs: JobProcesses, log: Path, out: Path, finals: list[Path], segments: SegmentWatch,
               success: bool) -> list[str]:
    """What the job left behind a few seconds after mpiexec ended (killing leftover processes): the
    sentinel of a job whose ranks it never saw (killed as they started) waits a moment for late
    ones before it removes the node folder, and its process id may be unknown here. A file of
    MPI's shared memory the job's ranks used (``segments``, and those the ranks noted) that is
    still there counts, and is removed (no process of the job is left to use it)."""
    pids = {f"rank {r}": p for r, p in procs.ranks.items()}
    if procs.proxy is not None:
        pids["hydra_pmi_proxy"] = procs.proxy
    pids["mpiexec"] = procs.mpiexec
    for p in log.glob("sentinel-*.pid") if log.is_dir() else []:
        pids["sentinel"] = int(p.read_text())
    folder = procs.folder()
    until = time.time() + 5.0  # the node sentinel removes the folder once the ranks are gone
    while time.time() < until and (any(alive(p) for p in pids.values()) or (folder is not None and folder.exists())):
        time.sleep(0.05)
    left = []
    for name, pid in sorted(pids.items()):
        if alive(pid):
            left.append(f"process {name} (pid {pid})")
            try:
                os.kill(pid, signal.SIGKILL)  # do not leave it running on the machine
            except OSError:
                pass
    if success:
        left += [f"missing {p.name}" for p in finals if not p.exists()]
    else:
        left += [f"file {p.name}" for p in finals if p.exists()]
    left += [f"partial {p.name}" for p in out.iterdir() if ".partial-" in p.name or p.name.endswith(".tmp")]
    seen = segments.stop()
    for p in log.glob("shm-*") if log.is_dir() else []:
        seen |= {s for s in p.read_text().split("\n") if s}
    for s in sorted(seen):
        if os.path.exists(s):
            left.append(f"shm {s}")
            Path(s).unlink(missing_ok=True)
    if folder is not None and folder.exists():
        try:
            inside = " ".join(sorted(os.listdir(folder)))
        except OSError:
            inside = ""
        left.append(f"node folder {folder.name} ({inside})")
        shutil.rmtree(folder, ignore_errors=True)
    return left


def _ended_well(c: Cell, liveness: float) -> bool:
    if (c.target, c.fault) in IGNORED:  # the job goes on as if nothing happened
        return c.exit == 0 and c.lines == 0 and not c.leftovers
    if c.seconds is None or c.seconds > liveness + 5.0 or c.leftovers:
        return False
    if c.unwatched:  # nobody saw it go: no line, or one that names it among those that ended
        # (a signal to mpiexec that ends ranks before their first line ends every one of them:
        # a line naming those ranks is true)
        return c.exit not in (0, None) and (c.lines == 0 or (c.lines == 1 and (
            c.named or not c.target.startswith("rank ") or not re.match(r"mpifc: ranks? \d", c.line))))
    if c.exit in (0, None) or c.lines != 1 or not c.named:
        return False
    if c.target in ("mpiexec", "hydra_pmi_proxy") and c.fault in ("INT", "TERM"):
        return c.exit == 128 + getattr(signal, f"SIG{c.fault}")
    return True


# -- the matrix ---------------------------------------------------------------------------------
def clean_durations(files: dict[str, Path], work: Path, liveness: float, repeat: int = 2) -> dict[str, float]:
    """Median wall seconds of clean runs of each job (they place the moments)."""
    out: dict[str, float] = {}
    for job in JOBS:
        times = []
        for i in range(repeat):
            d = work / "clean" / f"{job}-{i}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            cmd, _ = job_command(job, files, d, liveness)
            t0 = time.monotonic()
            subprocess.run(cmd, check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
            times.append(time.monotonic() - t0)
        out[job] = statistics.median(times)
    return out


def run_cells(specs: list[tuple[str, str, str, str]], work: Path, liveness: float, parallel: int,
              durations: dict[str, float] | None = None) -> list[Cell]:
    """Run the cells ``(job, target, fault, moment)``, ``parallel`` jobs at a time."""
    work.mkdir(parents=True, exist_ok=True)
    files = prepare(work, liveness)
    if durations is None:
        durations = clean_durations(files, work, liveness)
    # a fraction is of the time before the job's last 0.5 s
    spans = {job: max(t - 0.5, 0.2) for job, t in durations.items()}
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(lambda s: run_cell(*s, files, work, liveness, spans[s[0]]), specs))


def full_specs(n_moments: int, jobs=JOBS, targets=TARGETS, signals=SIGNALS, when=None,
               injected: bool = True) -> list[tuple[str, str, str, str]]:
    specs = [(job, target, sig, m) for job in jobs for target in targets for sig in signals
             for m in (when or moments(n_moments))]
    if injected:
        specs += [("evaluate" if ph == "query" else "train", f"rank {INJECTED[f][0]}", f, ph)
                  for ph in PHASES for f in INJECTED if ("evaluate" if ph == "query" else "train") in jobs]
    return specs


def sample_specs() -> list[tuple[str, str, str, str]]:
    return list(SAMPLE_SIGNALS) + [("evaluate" if ph == "query" else "train", f"rank {INJECTED[f][0]}", f, ph)
                                   for ph, f in SAMPLE_INJECTED]


def summary(cells: list[Cell], liveness: float) -> str:
    run = [c for c in cells if not c.missed]
    lines = [f"{'job':9s} {'target':16s} {'runs':>5s} {'missed':>6s} {'hangs':>5s} {'worst s':>8s} {'misnamed':>8s} "
             f"{'not 1 line':>10s} {'leftovers':>9s} {'unwatched':>9s} {'lost':>5s} {'failed':>6s}"]
    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.job, c.target if c.fault not in INJECTED else "injected"), []).append(c)
    for (job, target), cs in list(groups.items()) + [(("all", ""), cells)]:
        r = [c for c in cs if not c.missed]
        worst = max((c.seconds for c in r if c.seconds is not None), default=float("nan"))
        hangs = sum(1 for c in r if (c.seconds is None or c.seconds > liveness + 5.0)
                    and not (((c.target, c.fault) in IGNORED or c.lost) and c.exit == 0))
        lines.append(f"{job:9s} {target:16s} {len(r):5d} {len(cs) - len(r):6d} {hangs:5d} {worst:8.2f} "
                     f"{sum(1 for c in r if not c.named and (c.target, c.fault) not in IGNORED and not c.lost):8d} "
                     f"{sum(1 for c in r if c.lines != (0 if (c.target, c.fault) in IGNORED or c.lost else 1)):10d} "
                     f"{sum(1 for c in r if c.leftovers):9d} {sum(1 for c in r if c.unwatched):9d} "
                     f"{sum(1 for c in r if c.lost):5d} {sum(1 for c in r if failed(c)):6d}")
    return "\n".join(lines) + f"\n{len(run)} runs"


def failed(c: Cell) -> bool:
    """A cell that ran and did not end as it must (a cell hydra's mpiexec dropped the signal of
    is counted apart: ``lost``)."""
    return not c.missed and not c.ok and not c.lost


def failed_table(cells: list[Cell]) -> str:
    bad = [c for c in cells if failed(c)]
    rows = [f"{c.job:9s} {c.target:16s} {c.fault:14s} {c.moment:9s}{' (unwatched)' if c.unwatched else ''} "
            f"{c.seconds if c.seconds is None else round(c.seconds, 2)!s:>7s} "
            f"exit {c.exit!s:>4s} lines {c.lines} {'named' if c.named else 'NOT NAMED'}  {c.line[:110]!r} "
            f"{'; '.join(c.leftovers)}" for c in bad]
    return "\n".join(rows) if rows else "(no failed cell)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--liveness", type=float, default=3.0, help="--liveness of every job")
    ap.add_argument("--parallel", type=int, default=3, help="jobs at a time")
    ap.add_argument("--moments", type=int, default=10, help="moments per job, target and signal (at least 6: one fraction and five events)")
    ap.add_argument("--sample", action="store_true", help="only the sample of cells that tests/reliability runs")
    ap.add_argument("--jobs", default=",".join(JOBS), help="jobs to run (comma-separated)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="processes to signal (comma-separated)")
    ap.add_argument("--signals", default=",".join(SIGNALS), help="signals to send (comma-separated)")
    ap.add_argument("--when", default=None, help="moments instead of --moments (comma-separated, e.g. up,final)")
    ap.add_argument("--no-injected", action="store_true", help="signal cells only")
    ap.add_argument("--work", default=None, help="working folder (default: a new temp folder)")
    ap.add_argument("--out", default=None, help="CSV of every cell")
    args = ap.parse_args()
    import tempfile

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mpifc-faults-"))
    t0 = time.time()
    load0 = os.getloadavg()[0]
    split = lambda text: [t.strip() for t in text.split(",") if t.strip()]  # noqa: E731
    specs = sample_specs() if args.sample else full_specs(
        args.moments, split(args.jobs), split(args.targets), split(args.signals),
        split(args.when) if args.when else None, not args.no_injected)
    from mpifc.runtime.sentinel import shared_memory_files

    shm_before = set(shared_memory_files())
    cells = run_cells(specs, work, args.liveness, args.parallel)
    strays = stray_segments(shm_before, cells)
    print(failed_table(cells))
    print(summary(cells, args.liveness))
    for c in cells:
        if c.lost:
            print(f"lost: {c.job} {c.target} SIG{c.fault} at {c.moment}: sent before any rank ran its program; "
                  f"the job completed (exit 0, every output in place, {c.seconds:.1f} s after the signal)")
    for sig in sorted({c.fault for c in cells if c.lost}):
        sent, completed = hydra_drops(sig)
        print(f"hydra alone (a plain mpi4py job, no mpifc): SIG{sig} to mpiexec once its daemon ran and before it "
              f"started a rank, {sent} times: the job completed with exit 0 {completed} times")
    leaked = [s for c in cells for s in c.leftovers if s.startswith("shm ")]
    print(f"/dev/shm: {len(leaked)} files of MPI's shared memory left by the cells' jobs (each a cell's leftover, "
          f"removed), {len(strays)} more appeared during the run and stay, used by no process and by no cell's "
          f"ranks as seen (a cell's job killed between making one and the next look, or another job on this "
          f"machine; left in place){': ' + ', '.join(strays) if strays else ''}")
    bad = sum(1 for c in cells if failed(c))
    print(f"{len(cells)} cells, {sum(1 for c in cells if c.missed)} missed (the job had ended), "
          f"{sum(1 for c in cells if c.lost)} lost (hydra dropped the signal), {bad} failed; "
          f"--liveness {args.liveness:g}, {args.parallel} jobs at a time, {time.time() - t0:.0f} s; "
          f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores")
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(cells[0])))
            w.writeheader()
            for c in cells:
                w.writerow({**asdict(c), "leftovers": "; ".join(c.leftovers), "segments": " ".join(c.segments)})
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
