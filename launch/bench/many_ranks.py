#!/usr/bin/env python
"""Many ranks on few cores: the weak sweep's largest point beside an import-floor job of as many
ranks, in one run.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/many_ranks.py [--ranks 128] [--rows-per-client 100] \\
        [--dataset adult] [--out DIR]

Side by side, on the same machine:

* the floor: ``mpiexec -n R python -c "import mpi4py.MPI, numpy, h5py"`` (interpreters, the
  imports every rank needs, ``MPI_Init`` and ``MPI_Finalize``), run before and after;
* the ``R``-rank point of ``python launch/sweep.py --ranks ... --modes weak --rows-per-client N
  --dataset D`` (``R - 1`` clients, horizontal, N training rows each; the same code,
  :func:`mpifc.experiments.scaling.run`): the training job's wall time and its largest peak RSS
  of any rank.

Printed: both wall times and their ratio (goal: <= 2x), the largest rank's peak RSS (goal:
<= 150 MB), and where a client's CPU time goes, from the ranks' module reports
(:data:`mpifc.runtime.job.MODULE_REPORT_ENV`): start-up up to the job runner (interpreter and
imports), meeting the node and starting MPI, the job function, and per thread (the heartbeat,
the wait watchdog, the signal thread), with the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

FLOOR = "import mpi4py.MPI, numpy, h5py"
GOAL_RATIO, GOAL_MB = 2.0, 150.0


def floor_seconds(launcher, ranks: int) -> float:
    return launcher.run(ranks, ["-c", FLOOR]).seconds


def client_cpu(reports: Path) -> dict[str, float]:
    """Mean CPU seconds of a client rank per stage and per thread, from the module reports."""
    stages: dict[str, list[float]] = {}
    for p in sorted(reports.glob("rank-*.json")):
        rep = json.loads(p.read_text())
        if rep.get("role") != "client":
            continue
        cpu = rep.get("cpu_s", {})
        start, up, done = cpu.get("runner_start"), cpu.get("mpi_up"), cpu.get("job_done")
        if None in (start, up, done):
            continue
        stages.setdefault("start-up: interpreter, imports", []).append(start)
        stages.setdefault("node, MPI_Init, heartbeats", []).append(up - start)
        stages.setdefault("job function (learning, messages)", []).append(done - up)
        stages.setdefault("total to job end", []).append(done)
        threads: dict[str, float] = {}
        for name, s in rep.get("thread_cpu_s", {}).items():
            key = "others (MPI, libraries)" if name.startswith("native-") else name
            threads[key] = threads.get(key, 0.0) + s
        for name, s in threads.items():
            stages.setdefault(f"  thread {name}", []).append(s)
    return {k: statistics.mean(v) for k, v in stages.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=128, help="ranks of both jobs")
    p.add_argument("--rows-per-client", type=int, default=100, help="weak scaling: training rows per client")
    p.add_argument("--dataset", default="adult", help="data_prep dataset")
    p.add_argument("--out", default=None, help="work folder (default: a temporary one; shards are cached there)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before one job is killed")
    a = p.parse_args(argv)
    from mpifc.experiments.launcher import Launcher
    from mpifc.experiments.scaling import run

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.TemporaryDirectory(prefix="mpifc-many-") if a.out is None else None
    out = Path(a.out) if a.out else Path(tmp.name)
    launcher = Launcher(timeout=a.timeout)
    import shutil

    shutil.rmtree(out / "shards" / "runs", ignore_errors=True)  # cached training runs: time a new one
    load0 = os.getloadavg()[0]
    floors = [floor_seconds(launcher, a.ranks)]
    sweep = out / f"sweep-{int(time.time())}"  # a new result folder: the sweep skips finished cells
    run(sweep, [0], datasets=[a.dataset], ranks=[a.ranks], modes=["weak"], rows_per_client=a.rows_per_client,
        shards=out / "shards", timeout=a.timeout, progress=False, launcher=launcher)
    floors.append(floor_seconds(launcher, a.ranks))
    load1 = os.getloadavg()[0]
    import csv

    with open(sweep / "cells.csv", newline="") as f:
        cell = next(r for r in csv.DictReader(f) if r.get("setting") == "weak")
    if not cell.get("wall_seconds"):
        # the training job failed: its error (the launcher's, with the job's stderr tail), no ratio
        print(f"{a.ranks} ranks: the training job failed (load average {load0:.1f} -> {load1:.1f}; floor "
              f"{floors[0]:.1f} s before, {floors[1]:.1f} s after): {cell.get('error') or cell.get('status')}")
        if tmp is not None:
            tmp.cleanup()
        return 1
    wall, rss = float(cell["wall_seconds"]), float(cell["peak_rss_mb_max"] or "nan")
    reports = sorted((out / "shards").glob("runs/*/rank-reports"))
    newest = max(reports, key=lambda d: d.stat().st_mtime) if reports else None
    floor = statistics.mean(floors)
    print(f"{a.ranks} ranks on {os.cpu_count()} cores, weak scaling, {a.dataset}, {a.rows_per_client} rows per "
          f"client; load average {load0:.1f} -> {load1:.1f}")
    print(f"  import floor  mpiexec -n {a.ranks} python -c \"{FLOOR}\": {floors[0]:.1f} s before, "
          f"{floors[1]:.1f} s after (mean {floor:.1f} s)")
    ok_t, ok_m = wall <= GOAL_RATIO * floor, rss <= GOAL_MB
    print(f"  training job  {wall:.1f} s = {wall / floor:.2f}x the floor (goal <= {GOAL_RATIO:g}x: "
          f"{'met' if ok_t else 'not met'})")
    print(f"  largest rank  {rss:.0f} MB peak RSS (goal <= {GOAL_MB:g} MB: {'met' if ok_m else 'not met'})")
    if newest is not None:
        print(f"  a client's CPU seconds (mean over clients, from {newest.parent.name}):")
        for k, v in client_cpu(newest).items():
            print(f"    {k:<40} {v:7.3f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
