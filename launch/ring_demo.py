"""A small demo of mpifc's runtime on its own: arrays around a ring, a report to the server, a ledger table.

Run: ``mpiexec -n 3 python launch/ring_demo.py [--rounds N] [--floats N]`` (from the repository root). Each round
every rank passes a float64 vector to the next rank (phase ``ring``); then every client reports
the sum it saw to rank 0's actor (phase ``report``). Rank 0 checks the sums and prints the
per-link / per-phase byte table from the ledger.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np

from mpifc.errors import UserError
from mpifc.runtime.actor import Actor, actor_stop
from mpifc.runtime.job import JobContext, run_job
from mpifc.runtime.kinds import register_kind

RING = register_kind("demo.ring.vector", "likelihood_vector", "a vector passed around the ring")
REPORT = register_kind("demo.ring.report", "count", "a client's checksum sent to the server")


def ring_job(ctx: JobContext) -> int:
    rounds, floats = ctx.config["rounds"], ctx.config["floats"]
    tr, me, n = ctx.transport, ctx.rank, ctx.size
    nxt, prev = (me + 1) % n, (me - 1) % n
    ctx.ledger.set_phase("ring")
    seen = 0.0
    for r in range(rounds):
        out = np.full(floats, float(me + r), dtype=np.float64)
        pending = tr.isend(out, nxt, RING)
        got = tr.recv(prev, RING)
        pending.wait()
        seen += float(got.sum())
    ctx.ledger.set_phase("report")
    if ctx.roles.is_server(me):
        sums: dict[int, float] = {}
        actor = Actor(tr)
        actor.on(REPORT, lambda src, v: sums.__setitem__(src, float(v[0])))
        actor.run(ctx.roles.clients)
        for c in ctx.roles.clients:
            want = floats * sum(float((c - 1) % n + r) for r in range(rounds))
            if sums[c] != want:
                raise RuntimeError(f"rank {c} reported {sums[c]}, expected {want}")
        print(f"ring demo: {n} ranks, {rounds} rounds of {floats} floats; all {len(sums)} client sums correct")
    else:
        tr.send(np.array([seen]), ctx.roles.coordinator, REPORT)
        actor_stop(tr, [ctx.roles.coordinator])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="launch/ring_demo.py", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--floats", type=int, default=100_000)
    ap.add_argument("--ledger-csv", help="write the per-message ledger here")
    ap.add_argument("--deadline", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.floats < 1:
        raise UserError("--rounds and --floats must be at least 1")
    return run_job(ring_job, config={"rounds": args.rounds, "floats": args.floats}, min_clients=1,
                   deadline=args.deadline, ledger_csv=args.ledger_csv, print_summary=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        from mpifc.runtime.failure import abort_job

        abort_job(e)
