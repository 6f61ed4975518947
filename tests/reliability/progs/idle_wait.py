"""Rank 0 waits about SECONDS for rank 1, which computes (sleeps) meanwhile, once per WAIT; prints
per wait rank 0's process CPU seconds (every thread: the watchdog and heartbeat threads
included) as one JSON line.

Usage: idle_wait.py SECONDS WAIT [WAIT ...], WAIT one of recv, barrier, send, recv_any, await.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from mpifc.runtime.job import JobContext, run_job
from mpifc.runtime.kinds import register_kind

WAKE = register_kind("test.wake", "control", "the message a waiting rank waits for")


def wait_once(ctx: JobContext, wait: str, seconds: float) -> None:
    t = ctx.transport
    if ctx.rank == 1:
        time.sleep(seconds)  # the peer computes
        if wait == "barrier":
            t.barrier()
        elif wait == "send":
            t.recv(0, WAKE)
        else:
            t.send(np.zeros(4), 0, WAKE)
        return
    c0, w0 = time.process_time(), time.perf_counter()
    if wait == "recv":
        t.recv(1, WAKE)
    elif wait == "barrier":
        t.barrier()
    elif wait == "send":
        t.send(np.zeros(1 << 17), 1, WAKE)  # 1 MiB: a rendezvous send, complete once received
    elif wait == "recv_any":
        t.recv_any_kind([WAKE], [1])
    else:
        from mpifc.fedpc.query import await_messages

        await_messages(t, [1], WAKE)
    print(json.dumps({"wait": wait, "wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}), flush=True)


def main(ctx: JobContext) -> int:
    seconds = float(sys.argv[1])
    for wait in sys.argv[2:]:
        ctx.transport.barrier()
        wait_once(ctx, wait, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main, deadline=60.0))
