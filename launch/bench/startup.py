#!/usr/bin/env python
"""Start-up time and memory per rank of a user's job, each beside the import floor of the same run.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/startup.py [--repeat 3] [--out DIR] [--timeout 300]

Breast cancer on 3 horizontal clients (``python -m data_prep --dataset breast-cancer --setting
horizontal --clients 3 --seed 0``), 4 ranks. Every time is the median wall time of ``--repeat``
runs of the whole command, printed with its ratio to the floor, ``python -c "import mpi4py.MPI,
numpy, h5py"``, measured in the same run (a shared machine's load moves both alike):

* ``mpifc train DIR --seed 0 --model M`` (LearnSPN, the adaptive defaults);
* ``mpifc evaluate DIR --model M --distributed``.

Beside each, the old path: the same command with torch and scikit-learn's k-means imported by
every rank first and (training) ``--warm-up``, as every rank did before. Peak RSS per rank (MB,
``MPIFC_MODULE_REPORT``, :func:`mpifc.runtime.job.write_module_report`): the server and a client
of LearnSPN, factorized (``--clusters 1``) and DT (``--learner dt --clusters 1``) training jobs,
with whether the rank loaded torch / scikit-learn. Goals: the new train and evaluate at most
2.5 s and 9x the floor; every rank at most 150 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from grouprun import run_checked  # beside this script

REPO = Path(__file__).resolve().parents[2]
FLOOR = "import mpi4py.MPI, numpy, h5py"
OLD_PRELUDE = "import torch, sklearn.cluster"
"""What every rank imported before its work on the old path (the warm-up's torch and k-means)."""

GOAL_SECONDS, GOAL_RATIO, GOAL_MB = 2.5, 9.0, 150.0


def _env(report: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MPIFC_MODULE_REPORT", None)
    if report is not None:
        env["MPIFC_MODULE_REPORT"] = str(report)
    return env


def run(cmd: list[str], timeout: float, report: Path | None = None) -> float:
    """Wall seconds of ``cmd`` (in a process group of its own; a timeout ends the whole group)."""
    return run_checked(cmd, timeout, _env(report), REPO)[1]


def mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else "mpiexec"


def mpifc(n: int, args: list[str], old: bool = False) -> list[str]:
    """``mpiexec -n n python -m mpifc args``; ``old``: every rank imports :data:`OLD_PRELUDE` first."""
    if not old:
        return [mpiexec(), "-n", str(n), sys.executable, "-m", "mpifc", *args]
    code = f"{OLD_PRELUDE}; import sys; from mpifc.cli import main; sys.argv[0] = 'mpifc'; sys.exit(main())"
    return [mpiexec(), "-n", str(n), sys.executable, "-c", code, *args]


def median_wall(cmd: list[str], repeat: int, timeout: float) -> float:
    return statistics.median(run(cmd, timeout) for _ in range(repeat))


def reports(folder: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in sorted(folder.glob("rank-*.json"))}


def rank_line(label: str, rep: dict[str, Any]) -> tuple[str, bool]:
    mb = rep["peak_rss_mb"]
    mods = rep["modules"]
    loaded = ", ".join(m for m in ("torch", "sklearn") if m in mods) or "neither"
    ok = mb <= GOAL_MB
    return f"  {label:<34} {mb:7.1f} MB   torch/sklearn loaded: {loaded:<14} {'ok' if ok else 'over'}", ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    p.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before one command is killed")
    a = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="mpifc-startup-") if a.out is None else None
    out = Path(a.out) if a.out else Path(tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    shards = out / "bc"
    if not (shards / "manifest.json").exists():
        run([sys.executable, "-m", "data_prep", "--dataset", "breast-cancer", "--setting", "horizontal",
             "--clients", "3", "--seed", "0", "--out", str(shards)], a.timeout)
    model = out / "fc.h5"
    train = ["train", str(shards), "--seed", "0", "--model", str(model), "--quiet"]
    evaluate = ["evaluate", str(shards), "--model", str(model), "--distributed", "--quiet"]

    floor = median_wall([sys.executable, "-c", FLOOR], a.repeat, a.timeout)
    t_new = median_wall(mpifc(4, train), a.repeat, a.timeout)
    t_old = median_wall(mpifc(4, train + ["--warm-up"], old=True), a.repeat, a.timeout)
    e_new = median_wall(mpifc(4, evaluate), a.repeat, a.timeout)
    e_old = median_wall(mpifc(4, evaluate, old=True), a.repeat, a.timeout)

    rss: dict[str, dict[int, dict[str, Any]]] = {}
    jobs = {"learnspn": train, "factorized": train[:-3] + ["--learner", "factorized", "--clusters", "1", "--model",
                                                            str(out / "fz.h5"), "--quiet"],
            "dt": train[:-3] + ["--learner", "dt", "--clusters", "1", "--model", str(out / "dt.h5"), "--quiet"]}
    for name, args in jobs.items():
        folder = out / f"report-{name}"
        for f in folder.glob("rank-*.json"):
            f.unlink()
        run(mpifc(4, args), a.timeout, report=folder)
        rss[name] = reports(folder)
    folder = out / "report-old"
    for f in folder.glob("rank-*.json"):
        f.unlink()
    run(mpifc(4, train + ["--warm-up"], old=True), a.timeout, report=folder)
    rss["old"] = reports(folder)

    print(f"mpifc start-up, breast cancer, 3 horizontal clients, 4 ranks; medians of {a.repeat} (wall seconds)")
    print(f"  import floor  python -c \"{FLOOR}\": {floor:.2f} s")
    goals = []
    for what, new, old in (("mpifc train", t_new, t_old), ("mpifc evaluate --distributed", e_new, e_old)):
        ok = new <= GOAL_SECONDS and new <= GOAL_RATIO * floor
        goals.append(ok)
        print(f"  {what:<29} new {new:6.2f} s = {new / floor:5.1f}x floor   "
              f"old (torch{' + --warm-up' if 'train' in what else ''}) {old:6.2f} s = {old / floor:5.1f}x floor   "
              f"goal <= {GOAL_SECONDS} s and <= {GOAL_RATIO:g}x: {'ok' if ok else 'not met'}")
    print(f"peak RSS per rank (goal <= {GOAL_MB:g} MB)")
    lines = [("server (LearnSPN job)", rss["learnspn"][0]), ("LearnSPN client", rss["learnspn"][1]),
             ("factorized client (--clusters 1)", rss["factorized"][1]), ("DT client (--clusters 1)", rss["dt"][1]),
             ("old path: server", rss["old"][0]), ("old path: LearnSPN client", rss["old"][1])]
    for i, (label, rep) in enumerate(lines):
        text, ok = rank_line(label, rep)
        if i < 4:
            goals.append(ok)
        print(text)
    print("all goals met" if all(goals) else "some goals not met (see above)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
