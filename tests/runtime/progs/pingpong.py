"""Ping-pong of many dtypes and shapes between ranks 0 and 1, checked bit for bit.

Also checks every ledger row against MPI's own byte counts (see counting_comm.py) and the
sender's counters. Argument: ``--big-mb N`` for one extra array of N MB each way.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from mpi4py import MPI

from mpifc.runtime.kinds import register_kind
from mpifc.runtime.ledger import CommLedger
from mpifc.runtime.transport import Transport
from tests.runtime.progs.counting_comm import CountingComm

ARR = register_kind("test.pingpong.array", "model_parameters", "test arrays")
OBJ = register_kind("test.pingpong.object", "control", "test objects")
TEN = register_kind("test.pingpong.tensor", "likelihood_vector", "test tensors")

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8,
          np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128]
SHAPES = [(), (0,), (3, 0), (1,), (7,), (4, 5), (2, 3, 4), (3000,), (300, 17)]


def make(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    raw = rng.standard_normal(shape) * 100
    if np.dtype(dtype).kind == "c":
        return (raw + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return raw > 0
    if np.dtype(dtype).kind == "u":
        return np.abs(raw).astype(dtype)
    return raw.astype(dtype)


def check_ledger_against_mpi(ledger: CommLedger, counting: CountingComm) -> int:
    """Each row's bytes == sum of MPI's counts of its header and chunks; returns rows checked."""
    counts = counting.counts
    i = 0
    for row in ledger.rows:
        total = 0
        for j in range(int(row["n_mpi_messages"])):
            s, t, b = counts[i + j]
            assert s == row["src"] and t == row["kind"], (counts[i + j], row)
            total += b
        assert total == row["payload_bytes"] + row["header_bytes"], (total, row)
        i += int(row["n_mpi_messages"])
    assert i == len(counts), (i, len(counts))
    return len(ledger.rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-mb", type=float, default=0)
    ap.add_argument("--chunk-bytes", type=int, default=1 << 30)
    opts = ap.parse_args()
    world = MPI.COMM_WORLD
    comm = CountingComm(world.Dup())
    rank = world.Get_rank()
    ledger = CommLedger(rank, world.Get_size(), capacity=4)  # tiny: exercises growth
    # A long spin_s: the watchdog's soft cancel of a slow header wait re-posts the receive, which
    # the counting proxy would see (and count) twice; on a loaded machine that can happen.
    tr = Transport(comm, ledger, deadline=60.0, chunk_bytes=opts.chunk_bytes, spin_s=50.0)
    peer = 1 - rank
    rng = np.random.default_rng(0)
    cases = [make(d, s, rng) for d in DTYPES for s in SHAPES]
    cases.append(np.asfortranarray(rng.standard_normal((6, 5))))      # non-contiguous input
    cases.append(rng.standard_normal((10, 10))[::2, 1::3])
    cases.append(np.arange(6, dtype=">i4"))                            # non-native byte order
    if opts.big_mb:
        cases.append(rng.integers(0, 255, int(opts.big_mb * 2**20), dtype=np.uint8))
    objects = [None, {"round": 3, "names": ["age", "income"]}, list(range(1000)), "x" * 20000]
    tensors = [torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.zeros(0, dtype=torch.int64),
               torch.tensor(2.5, dtype=torch.float64), torch.randn(4, 4, requires_grad=True),
               torch.randn(5, dtype=torch.bfloat16), torch.randn(3, dtype=torch.complex64).conj(),
               torch.arange(20000, dtype=torch.float64)[::2]]
    n = 0
    for a in cases:
        if rank == 0:
            tr.send(a, peer, ARR)
            b = tr.recv(peer, ARR)
            assert b.dtype == a.dtype.newbyteorder("=") and b.shape == a.shape, (a.dtype, a.shape, b.dtype, b.shape)
            assert np.array_equal(a, b), (a, b)
            assert b.flags.writeable
        else:
            tr.send(tr.recv(peer, ARR), peer, ARR)
        n += 1
    for o in objects:
        if rank == 0:
            tr.send_obj(o, peer, OBJ)
            assert tr.recv_obj(peer, OBJ) == o
        else:
            tr.send_obj(tr.recv_obj(peer, OBJ), peer, OBJ)
    for t in tensors:
        if rank == 0:
            tr.send(t, peer, TEN)
            u = tr.recv_tensor(peer, TEN)
            ref = t.detach().resolve_conj()
            assert u.dtype == ref.dtype and u.shape == ref.shape and torch.equal(u, ref), (t, u)
        else:
            tr.send(tr.recv_tensor(peer, TEN), peer, TEN)
    # Interleaved kinds: both messages are in flight before either is received; tags keep them apart.
    if rank == 0:
        p1 = tr.isend(np.arange(3.0), peer, ARR)
        p2 = tr.isend_obj("ctrl", peer, OBJ)
        p1.wait(), p2.wait()
    else:
        assert tr.recv_obj(peer, OBJ) == "ctrl"
        assert np.array_equal(tr.recv(peer, ARR), np.arange(3.0))
    rows = check_ledger_against_mpi(ledger, comm)
    # What this rank sent == what the peer recorded (exchange the totals with raw MPI).
    mine_sent = ledger.sent[peer].copy()
    peer_recv = np.array([len(ledger.rows), ledger.rows["payload_bytes"].sum(), ledger.rows["header_bytes"].sum()],
                         dtype=np.int64)
    theirs = np.empty(3, dtype=np.int64)
    world.Sendrecv(peer_recv, peer, 99, theirs, peer, 99)
    assert np.array_equal(mine_sent, theirs), (mine_sent, theirs)
    print(f"rank {rank}: ok {n} arrays {len(objects)} objects {len(tensors)} tensors; {rows} ledger rows match MPI counts;"
          f" most MPI messages in one row {int(ledger.rows['n_mpi_messages'].max())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
