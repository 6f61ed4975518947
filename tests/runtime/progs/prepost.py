"""recv(out=) between two processes: the header and payload receives are posted together.

Checks, on ranks 0 and 1 (run with ``mpiexec -n 2``):

* round trips of several dtypes/shapes into ``out=`` (up to 2 MiB: MPICH's rendezvous sizes),
  bit-exact, with every ledger row equal to MPI's own byte counts (see counting_comm.py);
* a sender whose message turns out inline (small): a clear ValueError, the early payload
  receive is cancelled and the next message still arrives whole;
* a wrong-size ``out=`` (larger and smaller than the payload): a clear ValueError, no hang, the
  message is dropped and the next one arrives whole;
* the deadline passing while both receives are posted (after the soft limit, and with the
  watchdog's hard deadline): DeadlineExceeded naming the peer and kind, nothing left posted.

Prints one ``rank R: prepost ok ...`` line per rank.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from mpifc.runtime.kinds import register_kind
from mpifc.runtime.ledger import CommLedger
from mpifc.runtime.transport import DeadlineExceeded, Transport
from tests.runtime.progs.counting_comm import CountingComm

ARR = register_kind("test.prepost.array", "model_parameters", "arrays into out=")
DL = register_kind("test.prepost.deadline", "control", "never sent in time")

CASES = [(np.float64, (1 << 18,)), (np.float32, (300, 17)), (np.int16, (9000,)), (np.complex128, (64, 16, 2)),
         (np.uint8, (3, 7000)), (np.bool_, (20000,))]


def check_ledger_against_mpi(ledger: CommLedger, counting: CountingComm) -> int:
    """Each row's bytes == MPI's counts of its header and payload messages; returns rows checked.

    (As in pingpong.py, which imports torch: too slow to import here.)
    """
    counts, i = counting.counts, 0
    for row in ledger.rows:
        n = int(row["n_mpi_messages"])
        assert all(s == row["src"] and t == row["kind"] for s, t, _ in counts[i: i + n]), (counts[i: i + n], row)
        assert sum(b for _, _, b in counts[i: i + n]) == row["payload_bytes"] + row["header_bytes"], row
        i += n
    assert i == len(counts), (i, len(counts))
    return len(ledger.rows)


def expect_error(fn, exc, *needles) -> str:
    try:
        fn()
    except exc as e:
        msg = str(e)
        for n in needles:
            assert n in msg, (n, msg)
        return msg
    raise AssertionError(f"no {exc.__name__}")


def main() -> int:
    world = MPI.COMM_WORLD
    rank, peer = world.Get_rank(), 1 - world.Get_rank()
    rng = np.random.default_rng(1)

    # 1. Round trips into out=, ledger rows == MPI's counts (a long spin_s: see pingpong.py).
    counting = CountingComm(world.Dup())
    tr = Transport(counting, CommLedger(rank, 2), deadline=60.0, spin_s=50.0)
    for dtype, shape in CASES:
        a = (rng.standard_normal(shape) * 50).astype(dtype)
        out = np.empty(shape, dtype)
        if rank == 0:
            tr.send(a, peer, ARR)
            assert tr.recv(peer, ARR, out=out) is out
            assert out.tobytes() == a.tobytes(), dtype
        else:
            tr.send(tr.recv(peer, ARR, out=out), peer, ARR)
    rows = check_ledger_against_mpi(tr.ledger, counting)
    assert rows == len(CASES) and (tr.ledger.rows["n_mpi_messages"] == 2).all()

    # 2. The sender's message turns out inline: refused, the stream goes on.
    tr = Transport(world.Dup(), CommLedger(rank, 2), deadline=20.0)
    out = np.zeros(5000)
    if rank == 0:
        tr.send(np.arange(3.0), peer, ARR)
        world.Barrier()  # the next message only after rank 1 saw the error
        tr.send(np.arange(5000.0), peer, ARR)
    else:
        expect_error(lambda: tr.recv(peer, ARR, out=out), ValueError,
                     "'test.prepost.array' from rank 0 is float64[3]; out= is float64[5000]")
        world.Barrier()
        assert tr.recv(peer, ARR, out=out) is out and np.array_equal(out, np.arange(5000.0))

    # 3. out= of the wrong size (larger, smaller): a clear error; the message is received and
    # dropped (whether or not the early payload receive had already taken its payload), so the
    # next message arrives whole.
    for sent, expected in [(3000, 2500), (2500, 3000), (1 << 18, 1 << 17), (1 << 17, 1 << 18)]:
        if rank == 0:
            tr.send(np.ones(sent), peer, ARR)
        else:
            expect_error(lambda: tr.recv(peer, ARR, out=np.empty(expected)), ValueError,
                         f"rank 1: 'test.prepost.array' from rank 0 is float64[{sent}]; "
                         f"out= is float64[{expected}] (the message was received and dropped)")
    if rank == 0:
        tr.send(np.arange(3000.0), peer, ARR)
    else:
        out = np.empty(3000)
        assert tr.recv(peer, ARR, out=out) is out and np.array_equal(out, np.arange(3000.0))
    world.Barrier()

    # 4. The deadline passes while header and payload receives are posted.
    for spin_s in (0.02, 60.0):  # soft limit first (the default), or the hard deadline itself
        tr = Transport(world.Dup(), CommLedger(rank, 2), deadline=0.5, spin_s=spin_s)
        big = np.arange(float(1 << 18))
        if rank == 1:
            out = np.zeros(1 << 18)
            expect_error(lambda: tr.recv(peer, DL, out=out), DeadlineExceeded,
                         "deadline of 0.5 s passed waiting for a 'test.prepost.deadline' message from rank 0")
            world.Barrier()
            got = tr.recv(peer, DL)  # arrives whole: nothing of the failed receive is left posted
            assert np.array_equal(got, big) and not out.any()
        else:
            world.Barrier()
            tr.send(big, peer, DL)
    print(f"rank {rank}: prepost ok {rows} ledger rows match MPI counts", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
