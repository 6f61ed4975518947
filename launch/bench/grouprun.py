"""Run a benchmark's command in a process group of its own (shared by the benchmark scripts).

A timeout, Ctrl-C or SIGTERM ends the whole group: mpiexec, its proxies and every rank, so a
benchmark never leaves ranks spinning on a shared machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def run_group(cmd: list[str], timeout: float, env: dict[str, str], cwd: str | Path
              ) -> tuple[subprocess.CompletedProcess, float]:
    """(the completed process, wall seconds) of ``cmd``, whatever its exit code."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=5)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.perf_counter() - t0


def run_checked(cmd: list[str], timeout: float, env: dict[str, str], cwd: str | Path) -> tuple[str, float]:
    """(stdout, wall seconds) of ``cmd``; SystemExit with its stderr's tail if it fails."""
    r, wall = run_group(cmd, timeout, env, cwd)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr.strip()[-2000:]}")
    return r.stdout, wall
