"""Time and peak memory of data_prep, against a plain load of the same raw files, in one run.

Run: ``python launch/bench/data_prep.py [--repeat R] [--data-root DIR]`` from the repo root.

Cases (the issue's targets: each under 20 s, peak memory under 3x the raw data size):

* ``adult``: Adult, hybrid setting, 3 clients;
* ``mnist``: MNIST, horizontal label split, 10 clients.

Each measurement runs in a fresh subprocess, which first imports everything it needs, so:

* ``seconds``: wall time of ``prepare(...)`` + ``write_shards(...)`` (load, preprocess,
  partition, write HDF5), imports excluded; ``cpu s`` is the CPU time (user + system) of
  the same span, which a busy shared machine inflates far less than the wall time;
* ``peak MB``: peak resident set size during the work minus the resident size after the
  imports (``ru_maxrss``, so C allocations of numpy and HDF5 count too);
* ``raw MB``: uncompressed size of the raw input files (the gzip trailer's size for
  ``mnist.pkl.gz``); ``mem/raw`` is the target ratio.

The peer is the plainest load of the same files: ``csv.reader`` over both Adult files into
lists, ``pickle.load`` of the MNIST pickle. The peer and data_prep alternate, repetition by
repetition, so both see the same machine load; the best repetition of each is reported and
``x peer`` is data_prep's time over the peer's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = {
    "adult": dict(dataset="adult", setting="hybrid", clients=3, seed=0),
    "mnist": dict(dataset="mnist", setting="horizontal", split="label", clients=10, seed=0),
}
TARGET_SECONDS = 20.0
TARGET_MEM_RATIO = 3.0


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_files(case: str, root: Path) -> list[Path]:
    if case == "adult":
        return [root / "adult" / "adult.data", root / "adult" / "adult.test"]
    return [root / "mnist" / "mnist.pkl.gz"]


def raw_size(files: list[Path]) -> int:
    """Uncompressed bytes of ``files`` (gzip: the trailer's ISIZE, exact below 4 GiB)."""
    total = 0
    for f in files:
        if f.suffix == ".gz":
            with open(f, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                total += struct.unpack("<I", fh.read(4))[0]
        else:
            total += f.stat().st_size
    return total


def child(case: str, mode: str, root: Path) -> dict:
    """One measurement in this (fresh) process; returns seconds and peak bytes."""
    import csv
    import gzip
    import pickle

    sys.path.insert(0, str(REPO))
    from data_prep.prepare import prepare
    from data_prep.shards import write_shards
    import sklearn.preprocessing  # noqa: F401  (imported up front: not part of the timing)

    files = raw_files(case, root)
    base = _rss_bytes()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    if mode == "peer":
        if case == "adult":
            rows = []
            for f in files:
                with open(f, newline="") as fh:
                    rows.extend(csv.reader(fh, skipinitialspace=True))
        else:
            with gzip.open(files[0], "rb") as fh:
                rows = pickle.load(fh, encoding="latin1")
        del rows
    else:
        with tempfile.TemporaryDirectory(prefix="bench-data-prep-") as tmp:
            prepared = prepare(data_root=str(root), **CASES[case])
            write_shards(prepared, Path(tmp) / "shards")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu": _cpu_seconds() - cpu0,
            "peak": max(0, _rss_bytes() - base)}


def measure(case: str, mode: str, root: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", case, mode, "--data-root",
                           str(root)], capture_output=True, text=True, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{case}/{mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--data-root", default=os.environ.get("MPIFC_DATA",
                                                         str(REPO.parent / "shared" / "data")))
    p.add_argument("--case", choices=list(CASES), action="append")
    p.add_argument("--child", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    root = Path(args.data_root)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], root)))
        return 0
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'case':6s} {'raw MB':>7s} {'peer s':>7s} {'prep s':>7s} {'x peer':>7s} "
          f"{'peer cpu':>8s} {'prep cpu':>8s} {'peer MB':>8s} {'prep MB':>8s} {'mem/raw':>8s}  "
          f"targets (<{TARGET_SECONDS:.0f} s, <{TARGET_MEM_RATIO:.0f}x raw)")
    ok = True
    for case in args.case or list(CASES):
        files = raw_files(case, root)
        if not all(f.exists() for f in files):
            print(f"{case:6s} skipped: {files[0]} not found")
            continue
        size = raw_size(files)
        runs = {"peer": [], "prep": []}
        for _ in range(args.repeat):
            for mode in ("peer", "prep"):
                runs[mode].append(measure(case, mode, root))
        peer = min(runs["peer"], key=lambda r: r["seconds"])
        prep = min(runs["prep"], key=lambda r: r["seconds"])
        peak = min(r["peak"] for r in runs["prep"])
        ratio = peak / size
        good = prep["seconds"] < TARGET_SECONDS and ratio < TARGET_MEM_RATIO
        ok &= good
        print(f"{case:6s} {size / 1e6:7.1f} {peer['seconds']:7.2f} {prep['seconds']:7.2f} "
              f"{prep['seconds'] / peer['seconds']:7.2f} {peer['cpu']:8.2f} {prep['cpu']:8.2f} "
              f"{peer['peak'] / 1e6:8.1f} "
              f"{peak / 1e6:8.1f} {ratio:8.2f}  {'ok' if good else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
