#!/usr/bin/env python
"""The times README.md quotes, measured again with the README's own commands.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/readme.py [--only demo_s,quickstart_s] [--timeout 900]

Every ``bench:KEY`` figure of README.md (``launch/figures.py``) is measured here: the demo
(``bash launch/demo.sh``), each ``<!-- tested NAME -->`` block (``NAME_s``) and each command of
the "four common jobs" table (``job_a_s`` ... ``job_d_s``; (a) is the "your own table" block),
every one as the wall time of the whole command, in a scratch folder holding a copy of
``examples/`` and a link to ``launch/`` (so nothing is written into the repository). Each figure is printed beside its
measurement and its tolerance, with the 1-minute load average; the exit code is 1 when a figure
is out of its tolerance. The peer is the import floor of the same run (``python -c "import
mpi4py.MPI, numpy, h5py"``), printed so a loaded machine shows as such.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
# grouprun.py (beside this script) and launch/figures.py, imported with their folders on
# sys.path for the import only: this folder's data_prep.py would shadow the data_prep package
# for whoever imports it later in the same process (a test loading this script)
_FOLDERS = [str(Path(__file__).resolve().parent), str(REPO / "launch")]
sys.path[:0] = _FOLDERS
try:
    import figures  # noqa: E402
    from grouprun import run_checked  # noqa: E402
finally:
    for _f in _FOLDERS:
        sys.path.remove(_f)

README = REPO / "README.md"
BLOCK = re.compile(r"<!-- tested ([\w-]+) -->\s*\n```(?:bash|sh)?\n(.*?)\n```", re.DOTALL)
JOB = re.compile(r"^\| \((?P<job>[a-z])\) [^|]*\| `(?P<cmd>[^`]+)` \|", re.MULTILINE)


def _env() -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))


def _timed(cmd: list[str], cwd: Path, timeout: float) -> float:
    return run_checked(cmd, timeout, _env(), cwd)[1]


def _block(name: str) -> str:
    return dict(BLOCK.findall(README.read_text(encoding="utf-8")))[name]


def _job(letter: str) -> str:
    return {m["job"]: m["cmd"] for m in JOB.finditer(README.read_text(encoding="utf-8"))}[letter]


def _run_block(name: str) -> Callable[[Path, float], float]:
    return lambda d, timeout: _timed(["bash", "-euo", "pipefail", "-c", _block(name)], d, timeout)


def _run_job(letter: str) -> Callable[[Path, float], float]:
    return lambda d, timeout: _timed(["bash", "-euo", "pipefail", "-c", _job(letter)], d, timeout)


def _demo(d: Path, timeout: float) -> float:
    env_out = d / "results" / "demo"
    return run_checked(["bash", str(REPO / "launch" / "demo.sh")], timeout,
                       dict(_env(), MPIFC_DEMO_OUT=str(env_out)), d)[1]


MEASURED: dict[str, Callable[[Path, float], float]] = {
    "demo_s": _demo,
    "quickstart_s": _run_block("quickstart"),
    "job_a_s": _run_block("patients"),
    "job_b_s": _run_job("b"),
    "job_c_s": _run_job("c"),
    "job_d_s": _run_job("d"),
}
"""How each ``bench:KEY`` figure of README.md is measured: ``f(scratch folder, timeout) -> seconds``."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="measure the times README.md quotes")
    ap.add_argument("--only", default=None, help="comma-separated keys to measure (default: every bench figure)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per command")
    a = ap.parse_args(argv)
    figs = [f for f in figures.figures(README.read_text(encoding="utf-8")) if f.checker == "bench"]
    keys = a.only.split(",") if a.only else [f.key for f in figs]
    unknown = [f.key for f in figs if f.key not in MEASURED]
    if unknown:
        raise SystemExit(f"README figures nobody measures: {unknown}")
    floor = _timed([sys.executable, "-c", "import mpi4py.MPI, numpy, h5py"], REPO, 120)
    print(f"import floor {floor:.2f} s, load average (1 min) {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}", flush=True)
    bad = 0
    for fig in figs:
        if fig.key not in keys:
            continue
        with tempfile.TemporaryDirectory(prefix="readme-bench-") as tmp:
            d = Path(tmp)
            shutil.copytree(REPO / "examples", d / "examples")
            (d / "launch").symlink_to(REPO / "launch")  # the jobs' scripts (launch/sweep.py), read only
            load = os.getloadavg()[0]
            seconds = MEASURED[fig.key](d, a.timeout)
        ok = fig.allows(seconds)
        bad += not ok
        print(f"{fig.describe(seconds)} (load {load:.1f}, {seconds / floor:.0f}x the floor)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
