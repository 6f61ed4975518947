#!/usr/bin/env python
"""A wide vertical table from CSV to a model on default flags: few rows, many columns, two
clients, each command timed beside a peer run in the same process tree.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/wide_vertical.py [--rows 60] [--columns 10000] [--out DIR]

A synthetic CSV of ``--rows`` rows and ``--columns`` real columns (normal values rounded to four
decimals; a binary target set by the first two) is written to a temporary folder, never into
the repository. Then the real commands run there:

* ``python -m data_prep --dataset csv --path T.csv --target y --setting vertical --clients 2``,
  beside its peer: Python's ``csv`` module reading the same file into lists of floats;
* ``mpiexec -n 3 mpifc train DIR --model M --json`` (default flags: no ``--deadline``, default
  liveness), beside its peer: an import-floor job of as many ranks,
  ``mpiexec -n 3 python -c "import mpi4py.MPI, numpy, h5py"``.

Printed per command: wall seconds, CPU seconds of the command and its children (user + system),
exit code, and the ratio to its peer, with the 1-minute load average before and after. A
job that the liveness watch stops while its ranks compute (a false stop) shows as a non-zero
exit code; the script then exits 1.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = "import mpi4py.MPI, numpy, h5py"


def write_table(path: Path, rows: int, columns: int, seed: int = 0) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(rows, columns)), 4)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"c{j}" for j in range(columns)] + ["y"])
        for i in range(rows):
            w.writerow([repr(float(v)) for v in x[i]] + [int(y[i])])


def timed(cmd: list[str], cwd: Path) -> dict:
    """Wall and CPU seconds (the command and its children) of ``cmd``, its exit code and output."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "code": r.returncode, "out": r.stdout, "err": r.stderr}


READ_PEER = ("import csv, sys\n"
             "with open(sys.argv[1], newline='') as f:\n"
             "    rows = csv.reader(f)\n"
             "    next(rows)\n"
             "    table = [[float(v) for v in row] for row in rows]\n")
"""The peer of ``data_prep``: Python's ``csv`` module reading the table into lists of floats."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=60, help="rows of the table")
    ap.add_argument("--columns", type=int, default=10_000, help="real columns of the table")
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a new temp folder)")
    args = ap.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="mpifc-wide-"))
    work.mkdir(parents=True, exist_ok=True)
    py, mpiexec = sys.executable, str(Path(sys.executable).parent / "mpiexec")
    table = work / "wide.csv"
    write_table(table, args.rows, args.columns)
    load0 = os.getloadavg()[0]
    results = {}
    peer = timed([py, "-c", READ_PEER, str(table)], work)
    prep = timed([py, "-m", "data_prep", "--dataset", "csv", "--path", str(table), "--target", "y",
                  "--setting", "vertical", "--clients", "2", "--seed", "0", "--out", str(work / "shards")], work)
    results["data_prep"] = (prep, peer)
    floor = timed([mpiexec, "-n", "3", py, "-c", FLOOR], work)
    train = timed([mpiexec, "-n", "3", py, "-m", "mpifc", "train", str(work / "shards"), "--model",
                   str(work / "m.h5"), "--json"], work)
    results["train"] = (train, floor)
    load1 = os.getloadavg()[0]
    print(f"{args.rows} rows x {args.columns} columns, vertical, 2 clients; load {load0:.1f} -> {load1:.1f}")
    print(f"{'command':<10} {'wall s':>8} {'cpu s':>8} {'code':>5} {'peer wall s':>12} {'peer cpu s':>11} "
          f"{'x peer (cpu)':>13}")
    failed = False
    for name, (ours, ref) in results.items():
        failed |= ours["code"] != 0
        print(f"{name:<10} {ours['wall_s']:8.1f} {ours['cpu_s']:8.1f} {ours['code']:5d} {ref['wall_s']:12.1f} "
              f"{ref['cpu_s']:11.2f} {ours['cpu_s'] / max(ref['cpu_s'], 1e-9):13.1f}")
        if ours["code"] != 0:
            print(f"  {name} failed: {ours['err'].strip().splitlines()[-1:] or ours['out'][-200:]}")
    if train["code"] == 0:
        info = json.loads(train["out"].strip().splitlines()[-1])
        print(f"train: job {info['job_wall_seconds']:.1f} s wall, {info['bytes_train'] / 1e6:.2f} MB sent")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
