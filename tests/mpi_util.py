"""Run real ``mpiexec`` jobs as subprocesses of the pytest session, always with a timeout."""
from __future__ import annotations

import os
import shutil
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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=str(cwd or REPO), env=full_env)
