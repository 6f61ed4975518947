"""Run a function as an MPI job: communicator, ledger, transport, roles and device, fail-fast.

Example::

    def main(ctx: JobContext) -> int:
        if ctx.roles.is_server(ctx.rank):
            ...
        return 0

    sys.exit(run_job(main, deadline=60.0, ledger_csv="ledger.csv"))
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from mpifc.runtime.failure import abort_job
from mpifc.runtime.ledger import CommLedger, LedgerTable


@dataclass
class JobContext:
    """Everything a rank's job function needs.

    Attributes:
        comm: the job's private communicator (a duplicate of COMM_WORLD; never share tags with
            user code on COMM_WORLD).
        rank, size: this rank and the number of ranks.
        transport: byte-counted, deadline-bounded messaging.
        ledger: this rank's communication ledger.
        roles: server and client ranks.
        config: the job's settings (e.g. the parsed CLI namespace as a dict).
        local_rank, local_size: index of this rank among the ranks on its node, and their number.
        device_override: the ``--device`` value, if any.
    """

    comm: Any
    rank: int
    size: int
    transport: Any
    ledger: CommLedger
    roles: Any
    config: dict[str, Any] = field(default_factory=dict)
    local_rank: int = 0
    local_size: int = 1
    device_override: str | None = None

    @cached_property
    def device(self) -> Any:
        """This rank's ``torch.device`` (chosen on first use: importing torch takes seconds)."""
        from mpifc.runtime.device import select_device

        return select_device(self.local_rank, self.device_override)

    @property
    def is_server(self) -> bool:
        return self.roles.is_server(self.rank)


def run_job(main: Callable[[JobContext], int | None], *, config: dict[str, Any] | None = None,
            servers: tuple[int, ...] | int = (0,), min_clients: int = 0, deadline: float = 300.0,
            device: str | None = None, ledger_csv: str | Path | None = None,
            summary_csv: str | Path | None = None, print_summary: bool = False,
            on_ledger: Callable[[LedgerTable], None] | None = None) -> int:
    """Run ``main(ctx)`` on every rank of ``COMM_WORLD``.

    After ``main`` returns on every rank (a deadline-bounded barrier), the ledgers are gathered to
    rank 0, which writes ``ledger_csv`` / ``summary_csv`` (atomically), prints the summary table
    if asked, and calls ``on_ledger(table)``.

    Any exception on any rank prints ``mpifc: rank R: <ErrorType>: <message>`` and aborts the
    whole job (``MPI_Abort``, exit code 2 for a :class:`~mpifc.errors.UserError`, 1 otherwise), or
    exits the process when the job has one rank: this function returns only on success.

    Args:
        main: the job function, run on every rank; returns an exit code (``None`` = 0).
        config: settings handed to ``main`` as ``ctx.config``.
        servers: server ranks, or their number.
        min_clients: fail with a clear error when fewer client ranks are started.
        deadline: seconds any single send/receive may wait.
        device: ``--device`` override (``None``/``"auto"`` picks ``cuda:(local_rank % n_gpus)``).
        ledger_csv, summary_csv: where rank 0 writes the per-message and the summary CSVs.
        print_summary: rank 0 prints the per-link / per-phase table on stdout.
        on_ledger: called on rank 0 with the gathered :class:`LedgerTable`.

    Returns:
        The largest exit code returned by ``main`` over all ranks.
    """
    try:
        from mpi4py import MPI

        from mpifc.runtime.device import local_rank_of
        from mpifc.runtime.launcher import check_launcher_matches
        from mpifc.runtime.roles import Roles
        from mpifc.runtime.transport import Transport

        world = MPI.COMM_WORLD
        check_launcher_matches(world.Get_size())
        comm = world.Dup()
        rank, size = comm.Get_rank(), comm.Get_size()
        roles = Roles.build(size, servers, min_clients)
        ledger = CommLedger(rank, size)
        transport = Transport(comm, ledger, deadline)
        local_rank, local_size = local_rank_of(comm)
        ctx = JobContext(comm=comm, rank=rank, size=size, transport=transport, ledger=ledger,
                         roles=roles, config=dict(config or {}), local_rank=local_rank,
                         local_size=local_size, device_override=device)
        try:
            code = main(ctx)
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            code = 0
        code = int(code or 0)
        # Every rank must be done before the collective gather; the barrier keeps the deadline.
        ledger.set_phase("teardown")
        transport.flush()
        transport.barrier()
        table = ledger.gather(comm)
        code = comm.allreduce(code, op=MPI.MAX)
        if table is not None:
            if ledger_csv:
                table.write_csv(ledger_csv)
            if summary_csv or print_summary:
                summary = table.summary()
                if summary_csv:
                    summary.write_csv(summary_csv)
                if print_summary:
                    print(summary.to_table(), flush=True)
            if on_ledger is not None:
                on_ledger(table)
        comm.Free()
        return code
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        abort_job(exc)


def main_entry(main: Callable[[JobContext], int | None], **kwargs: Any) -> None:
    """``sys.exit(run_job(main, **kwargs))``, for ``if __name__ == "__main__"`` blocks."""
    sys.exit(run_job(main, **kwargs))
