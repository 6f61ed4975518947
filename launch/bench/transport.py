"""Ping-pong latency and bandwidth: mpifc transport vs raw mpi4py Send/Recv, in the same run.

Run: ``mpiexec -n 2 python launch/bench/transport.py [--reps N] [--out results.csv]`` (or ``mpifc
bench transport``). For each message size four ping-pongs alternate, repetition by repetition and
in rotating order, so all see the same machine load; the table reports medians over repetitions.

What is compared (each pair does the same work apart from the transport itself):

* **prealloc**: raw ``comm.Send``/``comm.Recv`` into one preallocated, already touched buffer,
  vs mpifc ``send`` + ``recv(..., out=buf)`` into the same kind of buffer;
* **fresh**: raw ``comm.Recv`` into a new ``np.empty`` array per message, vs mpifc ``recv``
  returning a new array per message (its default; large ones come from its buffer pool).

Both mpifc paths also pack the typed header, record a ledger row per message and keep every wait
under the deadline.

``--two-message-peer`` adds a third raw peer, **raw_2msg**: the same header + payload as two raw
MPI messages, both receives posted up front (the shape of mpifc's large-message protocol, without
mpifc's Python work). It splits mpifc's gap to raw ``Recv(buf)`` into what the two-message protocol
costs in MPI (raw_2msg vs raw) and what the transport's own code costs (mpifc vs raw_2msg); see
:mod:`mpifc.runtime.transport` for why large messages are two MPI messages. Columns, per size and per pair:

* ``lat``: one-way time per message = round-trip time / 2, in microseconds;
* ``MB/s``: message bytes / one-way time (1 MB = 1e6 bytes);
* ``ratio``: mpifc / raw bandwidth (target >= 0.9 from 1 MB up);
* ``added``: mpifc latency - raw latency, in microseconds (target <= 20 for small messages).
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
SIZES = sorted([8 * 4**i for i in range(12)] + [1 << 20, 64 << 20])  # 8 B ... 32 MiB, plus 1 MiB and 64 MiB


def iterations_for(size: int, most: int = 300) -> int:
    """Round trips per timed repetition: many for small messages (at most ``most``), few for big ones."""
    return int(max(min(3, most), min(most, 1e8 // max(size, 1))))


def raw_pingpong(comm: MPI.Comm, buf: np.ndarray, iters: int, fresh: bool = False) -> float:
    """Seconds per one-way message with raw Send/Recv (rank 0 sends first).

    ``fresh=False`` receives into ``buf`` itself; ``fresh=True`` into a new ``np.empty`` per message.
    """
    peer = 1 - comm.Get_rank()
    first = comm.Get_rank() == 0
    n = buf.nbytes
    x = buf
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if first:
            comm.Send([x, n, MPI.BYTE], peer, RAW_TAG)
        y = np.empty(n, np.uint8) if fresh else buf
        comm.Recv([y, n, MPI.BYTE], peer, RAW_TAG)
        x = y
        if not first:
            comm.Send([x, n, MPI.BYTE], peer, RAW_TAG)
    return (time.perf_counter() - t0) / (2 * iters)


def mpifc_pingpong(tr: Transport, buf: np.ndarray, iters: int, fresh: bool = False) -> float:
    """Seconds per one-way message with the mpifc transport.

    ``fresh=False`` receives into ``buf`` itself (``recv(..., out=buf)``); ``fresh=True`` receives a
    new array per message (what ``recv`` returns by default).
    """
    out = None if fresh else buf
    peer = 1 - tr.rank
    first = tr.rank == 0
    x = buf
    tr.comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if first:
            tr.send(x, peer, BENCH)
        x = tr.recv(peer, BENCH, out=out)
        if not first:
            tr.send(x, peer, BENCH)
    return (time.perf_counter() - t0) / (2 * iters)


def raw_two_message_pingpong(comm: MPI.Comm, buf: np.ndarray, iters: int) -> float:
    """Seconds per one-way message when each message is a 40-byte header (what mpifc sends before a
    1-D payload) and the payload as a second raw message; the receiver posts both receives first."""
    peer = 1 - comm.Get_rank()
    first = comm.Get_rank() == 0
    n = buf.nbytes
    header, header_in = bytearray(40), bytearray(4096)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if first:
            MPI.Request.Waitall([comm.Isend([header, 40, MPI.BYTE], peer, RAW_TAG),
                                 comm.Isend([buf, n, MPI.BYTE], peer, RAW_TAG)])
        h = comm.Irecv([header_in, len(header_in), MPI.BYTE], peer, RAW_TAG)
        p = comm.Irecv([buf, n, MPI.BYTE], peer, RAW_TAG)
        h.Wait()
        p.Wait()
        if not first:
            MPI.Request.Waitall([comm.Isend([header, 40, MPI.BYTE], peer, RAW_TAG),
                                 comm.Isend([buf, n, MPI.BYTE], peer, RAW_TAG)])
    return (time.perf_counter() - t0) / (2 * iters)


VARIANTS = ("raw", "raw_fresh", "mpifc_out", "mpifc_fresh")
CSV_HEADER = ["bytes", "iterations",
              "raw_latency_us", "mpifc_out_latency_us", "added_out_us", "raw_MBps", "mpifc_out_MBps", "ratio_out",
              "raw_fresh_latency_us", "mpifc_latency_us", "added_fresh_us", "raw_fresh_MBps", "mpifc_MBps",
              "ratio_fresh", "ratio_fresh_vs_prealloc"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="alternating repetitions per size (median taken)")
    ap.add_argument("--max-iters", type=int, default=300, help="round trips per repetition for small messages")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message size")
    ap.add_argument("--out", help="CSV file for the results (written by rank 0, atomically)")
    ap.add_argument("--two-message-peer", action="store_true",
                    help="also time raw header + payload as two MPI messages (raw_2msg; see the module docstring)")
    opts = ap.parse_args()
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        if world.Get_rank() == 0:
            print(f"mpifc: transport benchmark needs exactly 2 ranks, got {world.Get_size()} "
                  f"(run: mpiexec -n 2 python launch/bench/transport.py)", file=sys.stderr)
        return 2
    raw_comm = world.Dup()
    tr = Transport(world.Dup(), CommLedger(world.Get_rank(), 2, capacity=1 << 16), deadline=120.0)
    run = {"raw": lambda b, n: raw_pingpong(raw_comm, b, n), "raw_fresh": lambda b, n: raw_pingpong(raw_comm, b, n, True),
           "mpifc_out": lambda b, n: mpifc_pingpong(tr, b, n), "mpifc_fresh": lambda b, n: mpifc_pingpong(tr, b, n, True),
           "raw_2msg": lambda b, n: raw_two_message_pingpong(raw_comm, b, n)}
    variants = VARIANTS + (("raw_2msg",) if opts.two_message_peer else ())
    rows = []
    two_msg: list[float] = []  # raw_2msg median one-way time per size, s
    for size in [s for s in SIZES if s <= opts.max_bytes]:
        buf = np.zeros(size, dtype=np.uint8)
        iters = iterations_for(size, max(1, opts.max_iters))
        for v in variants:
            run[v](buf, 1)  # warm-up
        times: dict[str, list[float]] = {v: [] for v in variants}
        for rep in range(opts.reps):
            # Rotate which goes first so drift in machine load hits all alike.
            k = rep % len(variants)
            for v in variants[k:] + variants[:k]:
                times[v].append(run[v](buf, iters))
        med = {v: float(np.median(t)) for v, t in times.items()}
        if opts.two_message_peer:
            two_msg.append(med["raw_2msg"])
        raw, rawf, out, fresh = med["raw"], med["raw_fresh"], med["mpifc_out"], med["mpifc_fresh"]
        rows.append([size, iters,
                     raw * 1e6, out * 1e6, (out - raw) * 1e6, size / raw / 1e6, size / out / 1e6, raw / out,
                     rawf * 1e6, fresh * 1e6, (fresh - rawf) * 1e6, size / rawf / 1e6, size / fresh / 1e6,
                     rawf / fresh, raw / fresh])
    if world.Get_rank() == 0:
        print(f"{'':>17}| {'prealloc: raw Recv(buf) vs mpifc recv(out=buf)':^53}| "
              f"{'fresh: raw Recv(np.empty) vs mpifc recv()':^53}|")
        sub = f"{'raw lat':>9} {'mpifc lat':>9} {'added':>8} {'raw MB/s':>8} {'mpifc MB/s':>10} {'ratio':>5} "
        print(f"{'bytes':>10} {'iters':>6} | {sub}| {sub}| {'fresh/prealloc':>14}")
        for r in rows:
            cells = [f"{r[i]:>9.2f} {r[i + 1]:>9.2f} {r[i + 2]:>8.2f} {r[i + 3]:>8.1f} {r[i + 4]:>10.1f} {r[i + 5]:>5.3f} "
                     for i in (2, 8)]
            print(f"{r[0]:>10} {r[1]:>6} | {cells[0]}| {cells[1]}| {r[14]:>14.3f}")
        small = [r for r in rows if r[0] <= 1024]
        big = [r for r in rows if r[0] >= 1 << 20]
        if small:
            print(f"small messages (<= 1 KiB): median added latency {np.median([r[4] for r in small]):.2f} us "
                  f"(recv(out=)), {np.median([r[10] for r in small]):.2f} us (fresh recv) (target <= 20)")
        if big:
            print(f"large messages (>= 1 MiB): bandwidth ratio recv(out=) vs raw Recv(buf): min {min(r[7] for r in big):.3f}, "
                  f"median {np.median([r[7] for r in big]):.3f}; fresh recv vs raw Recv(np.empty): min "
                  f"{min(r[13] for r in big):.3f}, median {np.median([r[13] for r in big]):.3f}; fresh recv vs raw "
                  f"Recv(buf): min {min(r[14] for r in big):.3f} (target >= 0.9)")
        if two_msg:
            print(f"two-message raw peer (header + payload as two raw MPI messages, both receives posted first; "
                  f"sizes above inline_max={tr.inline_max}, below it mpifc sends one message):")
            print(f"{'bytes':>10} | {'raw_2msg lat':>12} {'raw_2msg/raw':>12} | {'mpifc(out=)/raw_2msg':>20}")
            for r, t2 in zip(rows, two_msg):
                if r[0] <= tr.inline_max:
                    continue
                # bandwidth ratios (time ratios inverted): raw_2msg vs raw, mpifc recv(out=) vs raw_2msg
                print(f"{r[0]:>10} | {t2 * 1e6:>12.2f} {r[2] / (t2 * 1e6):>12.3f} | {t2 * 1e6 / r[3]:>20.3f}")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
        if opts.out:
            header, table = list(CSV_HEADER), [list(r) for r in rows]
            if two_msg:
                header += ["raw_2msg_latency_us", "ratio_2msg_vs_raw", "ratio_out_vs_2msg"]
                for r, t2 in zip(table, two_msg):
                    r += [t2 * 1e6, r[2] / (t2 * 1e6), t2 * 1e6 / r[3]]
            lines = [",".join(header)]
            lines += [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in table]
            atomic_write_text(opts.out, "\n".join(lines) + "\n")
            print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
