"""One launcher for every MPI job an experiment starts: ``mpiexec`` here, ``srun`` under Slurm.

A job is ``<launcher> -n R <python> <args...>`` run as a subprocess in a process group of its own, so
a timeout ends the launcher *and* every rank it started (killing mpiexec alone would leave ranks
spinning on a shared machine). A failed or timed-out job raises :class:`JobFailed` carrying the
command and the tail of the job's stderr, which is what a user needs to see first.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

REPO = Path(__file__).resolve().parents[2]
STDERR_TAIL = 3000  # characters of stderr kept in a JobFailed message


class JobFailed(RuntimeError):
    """An MPI job exited non-zero, timed out or printed no result.

    Attributes:
        cmd: the command line.
        returncode: exit code (``None`` after a timeout).
        stderr_tail: the last :data:`STDERR_TAIL` characters of stderr.
    """

    def __init__(self, what: str, cmd: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr_tail = (stderr or "")[-STDERR_TAIL:]
        tail = self.stderr_tail.strip() or "(no stderr)"
        super().__init__(f"{what}: {' '.join(self.cmd)}\n--- stderr (tail) ---\n{tail}")


@dataclass
class JobResult:
    """A finished job: its output and wall seconds (launch and teardown included)."""

    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def last_json(self) -> dict[str, Any]:
        """The last stdout line that parses as a JSON object (rank 0's ``--json`` summary)."""
        for line in reversed(self.stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue
        raise JobFailed("job printed no JSON result", self.cmd, self.returncode, self.stderr)


def under_slurm(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a Slurm allocation (``SLURM_JOB_ID`` set): jobs then start with ``srun``."""
    return bool((os.environ if environ is None else environ).get("SLURM_JOB_ID"))


def default_mpiexec(python: str = sys.executable) -> str:
    """The mpiexec matching mpi4py's MPI: ``$MPIFC_MPIEXEC``, the venv's, else the one on PATH."""
    env = os.environ.get("MPIFC_MPIEXEC")
    if env:
        return env
    beside = Path(python).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise JobFailed("no mpiexec found (pip install mpich, or set MPIFC_MPIEXEC)", ["mpiexec"], None, "")
    return found


@dataclass
class Launcher:
    """Starts MPI jobs of R ranks running ``python <args>``.

    Attributes:
        python: interpreter every rank runs.
        timeout: default seconds before a job is killed.
        slurm: use ``srun`` (default: when ``SLURM_JOB_ID`` is set).
        mpiexec: launcher binary for local runs (default: :func:`default_mpiexec`).
        env: extra environment for the ranks.
    """

    python: str = sys.executable
    timeout: float = 1800.0
    slurm: bool | None = None
    mpiexec: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def command(self, n_ranks: int, args: Sequence[str]) -> list[str]:
        """The full command line of a job of ``n_ranks`` ranks."""
        if n_ranks < 1:
            raise ValueError(f"a job needs at least 1 rank, got {n_ranks}")
        slurm = under_slurm() if self.slurm is None else self.slurm
        if slurm:
            # One task per rank; a failing rank takes the step down instead of hanging it.
            head = ["srun", f"--ntasks={n_ranks}", "--kill-on-bad-exit=1"]
        else:
            head = [self.mpiexec or default_mpiexec(self.python), "-n", str(n_ranks)]
        return [*head, self.python, *map(str, args)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # Ranks share few cores; BLAS threads per rank would oversubscribe them.
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(self.env)
        return env

    def run(self, n_ranks: int, args: Sequence[str], timeout: float | None = None,
            env: dict[str, str] | None = None) -> JobResult:
        """Run a job to completion (``env``: variables set for this job only).

        Raises:
            JobFailed: non-zero exit or timeout, with the stderr tail.
        """
        cmd = self.command(n_ranks, args)
        limit = self.timeout if timeout is None else timeout
        compile_bytecode()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                                env={**self.environment(), **(env or {})}, start_new_session=True)
        try:
            with _sigterm_raises():
                out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            out, err = proc.communicate()
            raise JobFailed(f"job timed out after {limit:g} s", cmd, None, err) from None
        except BaseException:
            _end_group(proc)
            raise
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise JobFailed(f"job failed with exit code {proc.returncode}", cmd, proc.returncode, err)
        return JobResult(cmd, proc.returncode, out, err, seconds)

    def run_module(self, n_ranks: int, module: str, args: Sequence[str], timeout: float | None = None
                   ) -> dict[str, Any]:
        """Run ``python -m module args`` on ``n_ranks`` ranks; returns its last JSON line."""
        return self.run(n_ranks, ["-m", module, *args], timeout).last_json()


PACKAGES = ("mpifc", "data_prep")
"""The repository's packages every rank of an mpifc job imports from."""


def compile_bytecode(root: Path = REPO) -> None:
    """Bring the cached bytecode of the repository's packages up to date (as ``pip install``
    does for installed ones) before a job starts.

    A rank imports its modules from the bytecode cache when that is current; else it compiles
    each one from source, and under ``PYTHONDONTWRITEBYTECODE`` it cannot save the result, so
    every rank of every job compiles again: on a hundred ranks sharing two cores, about a sixth
    of a client rank's CPU time. Modules already current cost one ``stat`` each; a folder that
    cannot be written is left as it is."""
    import compileall

    for name in PACKAGES:
        folder = root / name
        if folder.is_dir():
            compileall.compile_dir(str(folder), quiet=2, workers=1)


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while a job runs, so the ``except`` above ends the job too.

    The job runs in a process group of its own (so a timeout can end all of it), which also means a
    SIGTERM to this process alone would not reach it and would leave its ranks orphaned.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group, SIGKILL what is still there after a grace period."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
