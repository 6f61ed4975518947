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


def run_group(cmd: list[str], timeout: float, env: dict[str, str], cwd: str | Path,
              keep_going: bool = False) -> tuple[subprocess.CompletedProcess, float, bool]:
    """``(completed process, wall seconds, timed out)`` of ``cmd``. A timeout ends the whole group
    and raises ``subprocess.TimeoutExpired``, or with ``keep_going`` returns what was printed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except BaseException as exc:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=5)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        if not (keep_going and isinstance(exc, subprocess.TimeoutExpired)):
            raise
        out, err = proc.communicate()
        timed_out = True
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.perf_counter() - t0, timed_out


def run_checked(cmd: list[str], timeout: float, env: dict[str, str], cwd: str | Path) -> tuple[str, float]:
    """(stdout, wall seconds) of ``cmd``; SystemExit with its stderr's tail if it fails."""
    done, wall, _ = run_group(cmd, timeout, env, cwd)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr.strip()[-2000:]}")
    return done.stdout, wall
