"""All-to-all traffic in two phases plus an actor round, ledger gathered to rank 0.

Usage: ledger_job.py LEDGER_CSV SUMMARY_CSV. Every rank r sends to every other rank d, in phase
"alpha", an array of ``expected_bytes(r, d)`` bytes and, in phase "beta", a pickled dict. Then
the clients report to the server's actor and shut it down. The test checks the CSVs against
these known sizes.
"""
from __future__ import annotations

import sys

import numpy as np

from mpifc.runtime.actor import Actor, actor_stop
from mpifc.runtime.job import JobContext, run_job
from mpifc.runtime.kinds import register_kind

DATA = register_kind("test.ledger.data", "likelihood_vector", "all-to-all arrays")
META = register_kind("test.ledger.meta", "control", "all-to-all dicts")
REPORT = register_kind("test.ledger.report", "count", "client -> server counts")


def expected_bytes(src: int, dst: int) -> int:
    """Payload size of the phase-alpha message src -> dst (spans inline and chunked sizes)."""
    return 8 * (1 + 997 * src + 3001 * dst)


def main(ctx: JobContext) -> int:
    tr, me = ctx.transport, ctx.rank
    others = [r for r in range(ctx.size) if r != me]
    ctx.ledger.set_phase("alpha")
    pending = [tr.isend(np.full(expected_bytes(me, d) // 8, me, dtype=np.float64), d, DATA) for d in others]
    for s in others:
        got = tr.recv(s, DATA)
        assert got.nbytes == expected_bytes(s, me) and np.all(got == s)
    for p in pending:
        p.wait()
    ctx.ledger.set_phase("beta")
    for d in others:
        tr.send_obj({"from": me, "to": d}, d, META)
    for _ in others:
        src, obj = tr.recv_any(META)
        assert obj == {"from": src, "to": me}
    ctx.ledger.set_phase("actor")
    if ctx.roles.is_server(me):
        totals: dict[int, int] = {}
        actor = Actor(tr)
        actor.on(REPORT, lambda src, value: totals.__setitem__(src, int(value.sum())))
        handled = actor.run(peers=ctx.roles.clients)
        assert handled == len(ctx.roles.clients) and totals == {c: c * 10 for c in ctx.roles.clients}, totals
    else:
        tr.send(np.array([c for c in range(10)]) * 0 + me, ctx.roles.coordinator, REPORT)
        actor_stop(tr, [ctx.roles.coordinator])
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main, ledger_csv=sys.argv[1], summary_csv=sys.argv[2], print_summary=True,
                     deadline=60.0))
