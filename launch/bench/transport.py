"""Ping-pong latency and bandwidth: mpifc transport vs raw mpi4py Send/Recv, in the same run.

Run: ``mpiexec -n 2 python launch/bench/transport.py [--reps N] [--out results.csv]`` (or ``mpifc
bench transport``).

What is compared (each pair does the same work apart from the transport itself):

* **prealloc**: raw ``comm.Send``/``comm.Recv`` into one preallocated, already touched buffer,
  vs mpifc ``send`` + ``recv(..., out=buf)`` into the same buffer;
* **fresh**: raw ``comm.Recv`` into a new ``np.empty`` array per message, vs mpifc ``recv``
  returning a new array per message (its default; large ones come from its buffer pool). Each
  side sends back the array it has just received. The raw side's arrays are where numpy puts them
  (below 4 MiB on ordinary 4 KiB pages, from 4 MiB up numpy asks for huge pages); mpifc's pool
  puts arrays of 1 MiB and more on 2 MiB-aligned huge-page mappings
  (:mod:`mpifc.runtime.bufpool`). Measured side by side, that placement does not make the
  receive itself faster, but sending the received array on is: part of what this pair measures
  is the cost of *using* the received array, which is a property of what ``recv`` returns.

Both mpifc paths also pack the typed header, record a ledger row per message and keep every wait
under the deadline.

How (identical treatment of both sides of each pair). Per message size, each pair is timed on its
own: first one untimed repetition of every member (warm-up: buffers touched, pool filled, MPI
connections and caches warm), then ``--reps`` repetitions; in each repetition every member runs
``iters`` round trips back to back, same buffer, in an order that rotates and reverses from one
repetition to the next, so each member comes first, last and after each other member equally
often. The two pairs are not interleaved with each other: raw ``Recv(np.empty)`` maps and
page-faults a fresh array on every message (numpy asks for huge pages from 4 MiB up), and when all
four variants were rotated together ``recv(out=)`` always ran right after it, and raw ``Recv(buf)``
never did. (Whether that cost ``recv(out=)`` anything was not confirmed; the design rules it out.)
Latencies are medians over repetitions; ``ratio`` and ``added`` are medians of the
*per-repetition* ratio and difference: the members of a repetition run within milliseconds of each
other, so slow drift of the machine's load or memory bandwidth cancels out of their ratio, which it
does not out of a ratio of medians (on the shared 2-core machine the interquartile range of one
variant's repetitions at 8 MiB was 8-24 % of its median, more than the effect sought).
``ratio_*_p25``/``p75`` in the CSV give the spread of the per-repetition ratios. ``fresh/prealloc``
(mpifc fresh ``recv`` vs raw ``Recv(buf)``) crosses the pairs and is a ratio of medians.

``--two-message-peer`` adds a third raw member to the prealloc pair, **raw_2msg**: the same header +
payload as two raw MPI messages, both receives posted up front (the shape of mpifc's large-message
protocol, without mpifc's Python work). It splits mpifc's gap to raw ``Recv(buf)`` into what the
two-message protocol costs in MPI (raw_2msg vs raw) and what the transport's own code costs (mpifc
vs raw_2msg); see :mod:`mpifc.runtime.transport` for why large messages are two MPI messages.

Columns, per size and per pair:

* ``lat``: one-way time per message = round-trip time / 2, in microseconds (median);
* ``MB/s``: message bytes / one-way time (1 MB = 1e6 bytes);
* ``ratio``: mpifc / raw bandwidth, median per-repetition (target >= 0.9 from 1 MB up);
* ``added``: mpifc latency - raw latency, median per-repetition, in microseconds (target <= 20 for
  small messages).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from mpifc.atomic import atomic_write_text
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


CSV_HEADER = ["bytes", "iterations",
              "raw_latency_us", "mpifc_out_latency_us", "added_out_us", "raw_MBps", "mpifc_out_MBps", "ratio_out",
              "raw_fresh_latency_us", "mpifc_latency_us", "added_fresh_us", "raw_fresh_MBps", "mpifc_MBps",
              "ratio_fresh", "ratio_fresh_vs_prealloc"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15,
                    help="repetitions per size and pair, order rotating (medians taken)")
    ap.add_argument("--max-iters", type=int, default=300, help="round trips per repetition for small messages")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message size")
    ap.add_argument("--min-bytes", type=int, default=0,
                    help="smallest message size (e.g. 1048576: only the bandwidth sizes, a short run)")
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
    pairs = [["raw", "mpifc_out"] + (["raw_2msg"] if opts.two_message_peer else []), ["raw_fresh", "mpifc_fresh"]]
    rows = []
    two_msg: list[list[float]] = []  # raw_2msg per size: median one-way time (s), ratios vs raw and mpifc
    spread: list[list[float]] = []  # per size: p25, p75 of the per-repetition ratio, out= and fresh pairs
    for size in [s for s in SIZES if opts.min_bytes <= s <= opts.max_bytes]:
        buf = np.zeros(size, dtype=np.uint8)
        iters = iterations_for(size, max(1, opts.max_iters))
        times: dict[str, list[float]] = {}
        for group in pairs:
            for v in group:
                run[v](buf, iters)  # warm-up, untimed
            times.update({v: [] for v in group})
            for rep in range(opts.reps):
                k = rep % len(group)
                order = group[k:] + group[:k]
                if (rep // len(group)) % 2:
                    order.reverse()  # so that each member also follows each other member equally often
                for v in order:
                    times[v].append(run[v](buf, iters))
        t = {v: np.asarray(x) for v, x in times.items()}
        med = {v: float(np.median(x)) for v, x in t.items()}
        r_out, r_fresh = t["raw"] / t["mpifc_out"], t["raw_fresh"] / t["mpifc_fresh"]
        if opts.two_message_peer:
            two_msg.append([med["raw_2msg"], float(np.median(t["raw"] / t["raw_2msg"])),
                            float(np.median(t["raw_2msg"] / t["mpifc_out"]))])
        spread.append([float(np.percentile(r_out, 25)), float(np.percentile(r_out, 75)),
                       float(np.percentile(r_fresh, 25)), float(np.percentile(r_fresh, 75))])
        raw, rawf, out, fresh = med["raw"], med["raw_fresh"], med["mpifc_out"], med["mpifc_fresh"]
        rows.append([size, iters,
                     raw * 1e6, out * 1e6, float(np.median(t["mpifc_out"] - t["raw"])) * 1e6, size / raw / 1e6,
                     size / out / 1e6, float(np.median(r_out)),
                     rawf * 1e6, fresh * 1e6, float(np.median(t["mpifc_fresh"] - t["raw_fresh"])) * 1e6,
                     size / rawf / 1e6, size / fresh / 1e6, float(np.median(r_fresh)), raw / fresh])
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
            print("  recv(out=) per-repetition ratio, p25-p75: " + ", ".join(
                f"{r[0] >> 20} MiB {q[0]:.3f}-{q[1]:.3f}" for r, q in zip(rows, spread) if r[0] >= 1 << 20))
        if two_msg:
            print(f"two-message raw peer (header + payload as two raw MPI messages, both receives posted first; "
                  f"sizes above inline_max={tr.inline_max}, below it mpifc sends one message):")
            print(f"{'bytes':>10} | {'raw_2msg lat':>12} {'raw_2msg/raw':>12} | {'mpifc(out=)/raw_2msg':>20}")
            for r, (t2, r2, r_out2) in zip(rows, two_msg):
                if r[0] <= tr.inline_max:
                    continue
                # bandwidth ratios (time ratios inverted, per repetition, median): raw_2msg vs raw,
                # mpifc recv(out=) vs raw_2msg
                print(f"{r[0]:>10} | {t2 * 1e6:>12.2f} {r2:>12.3f} | {r_out2:>20.3f}")
        load = os.getloadavg()
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} cores")
        if load[0] > 2.5 + (os.cpu_count() or 1) / 2:
            # Other processes compete with the two ranks for cores and memory bandwidth: absolute
            # times swell several-fold and the ratios stop meaning "mpifc vs raw" (mpifc, which
            # backs off from long waits, can then even beat raw). Rerun on a quiet machine.
            print("WARNING: the machine is loaded; these are not quiet-machine figures")
        if opts.out:
            header = CSV_HEADER + ["ratio_out_p25", "ratio_out_p75", "ratio_fresh_p25", "ratio_fresh_p75"]
            table = [list(r) + q for r, q in zip(rows, spread)]
            if two_msg:
                header += ["raw_2msg_latency_us", "ratio_2msg_vs_raw", "ratio_out_vs_2msg"]
                for r, (t2, r2, r_out2) in zip(table, two_msg):
                    r += [t2 * 1e6, r2, r_out2]
            lines = [",".join(header)]
            lines += [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in table]
            atomic_write_text(opts.out, "\n".join(lines) + "\n")
            print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
