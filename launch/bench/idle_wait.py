"""CPU a rank spends while it waits for a peer that computes, per kind of wait, beside a busy wait.

Run (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/idle_wait.py [--seconds 4] [--repeat 3]

Each repeat is one ``mpiexec -n 2`` job of this script: for each kind of wait, rank 1 computes
(sleeps) for ``--seconds`` while rank 0 waits for it, then rank 0 reports its process CPU time
over the wait (every thread: the deadline watchdog and the heartbeat thread included). The
waits: ``recv`` (a header wait inside MPI, then polled), ``barrier``, ``send`` (a 1 MiB send
the peer receives late), ``recv_any`` (several kinds from one rank), ``await`` (the query
passes' wait on several peers), and ``spin``, the peer: a wait that polls ``Iprobe`` without
sleeping, as MPI's own blocking waits do. Printed per wait: the median and the largest share
of a core over the repeats, and their ratio to the busy wait's in the same run, with the load
average (a busy wait gets less of a core on a loaded machine; a sleeping one spends about the
same CPU time at any load).

The rank side (``--rank-side SECONDS WAIT ...`` under mpiexec) prints one JSON line per wait;
tests/reliability/test_liveness.py runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WAITS = ("recv", "barrier", "send", "recv_any", "await", "spin")


def _rank_side(seconds: float, waits: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    import numpy as np

    from mpifc.runtime.job import run_job
    from mpifc.runtime.kinds import register_kind

    wake = register_kind("bench.idle.wake", "control", "the message a waiting rank waits for")

    def wait_once(ctx, wait: str) -> None:
        t = ctx.transport
        if ctx.rank == 1:
            time.sleep(seconds)  # the peer computes
            if wait == "barrier":
                t.barrier()
            elif wait == "send":
                t.recv(0, wake)
            else:
                t.send(np.zeros(4), 0, wake)
            return
        c0, w0 = time.process_time(), time.perf_counter()
        if wait == "recv":
            t.recv(1, wake)
        elif wait == "barrier":
            t.barrier()
        elif wait == "send":
            t.send(np.zeros(1 << 17), 1, wake)  # 1 MiB: a rendezvous send, complete once received
        elif wait == "recv_any":
            t.recv_any_kind([wake], [1])
        elif wait == "await":
            from mpifc.fedpc.query import await_messages

            await_messages(t, [1], wake)
        else:
            while not t.comm.Iprobe(1, wake.kind_id):  # a busy wait
                pass
            t.recv(1, wake)
        print(json.dumps({"wait": wait, "wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}),
              flush=True)

    def main(ctx) -> int:
        for wait in waits:
            ctx.transport.barrier()
            wait_once(ctx, wait)
        return 0

    return run_job(main)


def run_once(seconds: float, waits: list[str], timeout: float = 300.0) -> dict[str, dict]:
    """One job: ``{wait: {"wall", "cpu"}}`` of rank 0."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", "2", sys.executable, __file__,
                        "--rank-side", str(seconds), *waits], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return {d["wait"]: d for d in map(json.loads, r.stdout.strip().splitlines())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-side"]:
        return _rank_side(float(argv[1]), argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="how long the peer computes per wait")
    p.add_argument("--repeat", type=int, default=3, help="jobs (each measures every wait once)")
    a = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    runs = [run_once(a.seconds, list(WAITS)) for _ in range(a.repeat)]
    share = {w: [r[w]["cpu"] / r[w]["wall"] for r in runs] for w in WAITS}
    spin = statistics.median(share["spin"])
    print(f"CPU of a rank waiting {a.seconds:g} s for a computing peer, share of one core (process CPU time / "
          f"wall time); {a.repeat} runs; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    for w in WAITS:
        med, worst = statistics.median(share[w]), max(share[w])
        print(f"  {w:<9} median {100 * med:6.2f} %   largest {100 * worst:6.2f} %   "
              f"{med / spin if spin else float('nan'):6.3f}x the busy wait")
    return 0


if __name__ == "__main__":
    sys.exit(main())
