"""Ping-pong latency and bandwidth: mpifc transport vs raw mpi4py Send/Recv, in the same run.

Run: ``mpiexec -n 2 python launch/bench/transport.py [--out results.csv]`` (or ``mpifc bench
transport``). For each message size the two transports alternate, repetition by repetition, so
both see the same machine load; the table reports medians over repetitions.

* latency: one-way time per message = round-trip time / 2, in microseconds;
* bandwidth: message bytes / one-way time, in MB/s (1 MB = 1e6 bytes);
* ``bw ratio``: mpifc / raw bandwidth (target >= 0.9 from 1 MB up);
* ``added us``: mpifc latency - raw latency (target <= 20 us for small messages);
* ``cpu added``: the same difference in CPU time of rank 0 (``time.process_time``) per message:
  on a loaded machine wall time is dominated by waiting to be scheduled, CPU time much less so.

mpifc's receive allocates a fresh array per message (the API returns a new array) and records a
ledger row; raw receives into a preallocated buffer, which is the best case for raw.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from mpifc.runtime.atomic import atomic_write_text
from mpifc.runtime.kinds import register_kind
from mpifc.runtime.ledger import CommLedger
from mpifc.runtime.transport import Transport

BENCH = register_kind("bench.transport.pingpong", "control", "transport benchmark payload")
RAW_TAG = 7  # raw traffic on another communicator than mpifc's, so tags cannot clash
SIZES = [8 * 4**i for i in range(12)] + [64 << 20]  # 8 B ... 32 MiB, then 64 MiB


def iterations_for(size: int) -> int:
    """Round trips per timed repetition: many for small messages, few for big ones."""
    return int(max(3, min(300, 2e7 // max(size, 1))))


def raw_pingpong(comm: MPI.Comm, buf: np.ndarray, iters: int) -> tuple[float, float]:
    """(wall, CPU) seconds per one-way message with raw Send/Recv (rank 0 sends first)."""
    peer = 1 - comm.Get_rank()
    spec = [buf, buf.nbytes, MPI.BYTE]
    comm.Barrier()
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(iters):
        if comm.Get_rank() == 0:
            comm.Send(spec, peer, RAW_TAG)
            comm.Recv(spec, peer, RAW_TAG)
        else:
            comm.Recv(spec, peer, RAW_TAG)
            comm.Send(spec, peer, RAW_TAG)
    return (time.perf_counter() - t0) / (2 * iters), (time.process_time() - c0) / (2 * iters)


def mpifc_pingpong(tr: Transport, arr: np.ndarray, iters: int, into: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds per one-way message with the mpifc transport.

    ``into=False`` receives a new array per message (what ``recv`` returns by default);
    ``into=True`` receives into ``arr`` itself (``recv(..., out=arr)``), as the raw peer does.
    """
    out = arr if into else None
    peer = 1 - tr.rank
    tr.comm.Barrier()
    c0 = time.process_time()
    t0 = time.perf_counter()
    x = arr
    for _ in range(iters):
        if tr.rank == 0:
            tr.send(x, peer, BENCH)
            x = tr.recv(peer, BENCH, out=out)
        else:
            x = tr.recv(peer, BENCH, out=out)
            tr.send(x, peer, BENCH)
    return (time.perf_counter() - t0) / (2 * iters), (time.process_time() - c0) / (2 * iters)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="alternating repetitions per size (median taken)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message size")
    ap.add_argument("--out", help="CSV file for the results (written by rank 0, atomically)")
    opts = ap.parse_args()
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        if world.Get_rank() == 0:
            print(f"mpifc: transport benchmark needs exactly 2 ranks, got {world.Get_size()} "
                  f"(run: mpiexec -n 2 python launch/bench/transport.py)", file=sys.stderr)
        return 2
    raw_comm = world.Dup()
    tr = Transport(world.Dup(), CommLedger(world.Get_rank(), 2, capacity=1 << 16), deadline=120.0)
    rows = []
    for size in [s for s in SIZES if s <= opts.max_bytes]:
        buf = np.zeros(size, dtype=np.uint8)
        iters = iterations_for(size)
        raw_pingpong(raw_comm, buf, 1), mpifc_pingpong(tr, buf, 1), mpifc_pingpong(tr, buf, 1, True)  # warm-up
        raw_t, our_t, into_t = [], [], []
        for rep in range(opts.reps):
            # Rotate which goes first so drift in machine load hits all alike.
            for which in [(0, 1, 2), (1, 2, 0), (2, 0, 1)][rep % 3]:
                if which == 0:
                    raw_t.append(raw_pingpong(raw_comm, buf, iters))
                elif which == 1:
                    our_t.append(mpifc_pingpong(tr, buf, iters))
                else:
                    into_t.append(mpifc_pingpong(tr, buf, iters, into=True))
        raw_s, our_s = float(np.median([t[0] for t in raw_t])), float(np.median([t[0] for t in our_t]))
        raw_c, our_c = float(np.median([t[1] for t in raw_t])), float(np.median([t[1] for t in our_t]))
        into_s = float(np.median([t[0] for t in into_t]))
        rows.append((size, iters, raw_s * 1e6, our_s * 1e6, (our_s - raw_s) * 1e6, (our_c - raw_c) * 1e6,
                     size / raw_s / 1e6, size / our_s / 1e6, raw_s / our_s, raw_s / into_s))
    if world.Get_rank() == 0:
        head = (f"{'bytes':>10} {'iters':>6} {'raw us':>10} {'mpifc us':>10} {'added us':>9} {'cpu added':>9} "
                f"{'raw MB/s':>10} {'mpifc MB/s':>11} {'bw ratio':>9} {'ratio out=':>10}")
        print(head)
        for size, iters, r_us, o_us, add, cpu_add, r_bw, o_bw, ratio, ratio_into in rows:
            print(f"{size:>10} {iters:>6} {r_us:>10.2f} {o_us:>10.2f} {add:>9.2f} {cpu_add:>9.2f} {r_bw:>10.1f} "
                  f"{o_bw:>11.1f} {ratio:>9.3f} {ratio_into:>10.3f}")
        small = [r for r in rows if r[0] <= 1024]
        big = [r for r in rows if r[0] >= 1 << 20]
        if small:
            print(f"small messages (<= 1 KiB): median added latency "
                  f"{np.median([r[4] for r in small]):.2f} us wall, {np.median([r[5] for r in small]):.2f} us CPU "
                  f"(target <= 20)")
        if big:
            print(f"large messages (>= 1 MiB): min bandwidth ratio {min(r[8] for r in big):.3f}, "
                  f"median {np.median([r[8] for r in big]):.3f} (target >= 0.9); receiving into out=: "
                  f"min {min(r[9] for r in big):.3f}, median {np.median([r[9] for r in big]):.3f}")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
        if opts.out:
            lines = ["bytes,iterations,raw_latency_us,mpifc_latency_us,added_latency_us,added_cpu_us,raw_MBps,"
                     "mpifc_MBps,bandwidth_ratio,bandwidth_ratio_out"]
            lines += [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in rows]
            atomic_write_text(opts.out, "\n".join(lines) + "\n")
            print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
