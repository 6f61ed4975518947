"""Run real ``mpiexec`` jobs as subprocesses of pytest, always with a timeout."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def mpiexec_path() -> str:
    """The mpiexec that matches the MPI mpi4py loaded: the venv's (mpich wheel) first."""
    env = os.environ.get("MPIFC_MPIEXEC")
    if env:
        return env
    cand = Path(sys.executable).parent / "mpiexec"
    if cand.exists():
        return str(cand)
    found = shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found: install the mpich wheel (pip install mpich) or set MPIFC_MPIEXEC")
    return found


def run_mpi(n: int, args: list[str], timeout: float = 120.0, cwd: str | Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n n <python> <args...>``; returns the CompletedProcess (text output).

    ``args`` start after the interpreter, e.g. ``["-m", "mpifc", "info"]`` or a script path.
    The job is killed (and the test fails with subprocess.TimeoutExpired) after ``timeout`` s.
    """
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *args]
    # A process group of its own, so a timeout can end mpiexec *and* its proxies and ranks: killing
    # mpiexec alone would leave orphaned ranks spinning on a shared machine.
    return run_in_group(cmd, timeout=timeout, cwd=cwd or REPO, env=full_env)


def run_in_group(cmd: list, *, timeout: float, cwd: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``cmd`` in a process group of its own; on timeout (or any interruption) the whole group
    goes, then subprocess.TimeoutExpired is raised with what it printed."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(cwd), env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after 2 s."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
