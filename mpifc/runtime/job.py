"""Run a function as an MPI job: communicator, ledger, transport, roles and device, fail-fast,
liveness, and outputs that appear only when the job succeeds.

Example::

    def main(ctx: JobContext) -> int:
        if ctx.roles.is_server(ctx.rank):
            ...
        return 0

    sys.exit(run_job(main, deadline=60.0, ledger_csv="ledger.csv"))
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from mpifc.errors import UserError
from mpifc.runtime import faults
from mpifc.runtime.failure import abort_job, abort_with_line, env_rank
from mpifc.runtime.ledger import CommLedger, LedgerTable
from mpifc.runtime.liveness import DEFAULT_LIMIT_S
from mpifc.runtime.outputs import StagedOutputs


class ProtocolError(RuntimeError):
    """A rank's part of the protocol did not complete (found at the end of a job)."""

    brief = True  # one line, no traceback: the message says what is wrong


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
        liveness: the rank's heartbeats (:mod:`mpifc.runtime.liveness`), or None in a one-rank job.
        outputs: this rank's output files not yet in place (:meth:`stage`).
        notes: what the job function wants this rank's module report to say about it (e.g. its
            learners, whether it warmed up); see :data:`MODULE_REPORT_ENV`.
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
    liveness: Any = None
    outputs: StagedOutputs = field(default_factory=StagedOutputs)
    notes: dict[str, Any] = field(default_factory=dict)

    def enter(self, phase: str) -> None:
        """Announce what this rank does now (``"read"``, ``"learn"``, ...): carried by its
        heartbeats and named if it falls silent; also a fault-injection point
        (:mod:`mpifc.runtime.faults`)."""
        if self.liveness is not None:
            self.liveness.enter(phase)
        faults.at(self.rank, phase)

    def stage(self, path: str | Path) -> Path:
        """Where to write the output file ``path``: a partial file beside it that the runner
        renames to ``path`` only once every rank has finished (:mod:`mpifc.runtime.outputs`)."""
        return self.outputs.stage(path)

    @cached_property
    def device(self) -> Any:
        """This rank's ``torch.device`` (chosen on first use: importing torch takes seconds).
        Ask for it only where this rank computes on torch; the protocol code passes it on
        down as a string (``str(ctx.device)``)."""
        from mpifc.runtime.device import select_device

        return select_device(self.local_rank, self.device_override)

    def device_facts(self) -> dict[str, Any]:
        """What this rank computed on (:func:`mpifc.runtime.device.device_facts`): the CPU unless
        it resolved :attr:`device` (a rank that never did computed nothing on torch)."""
        from mpifc.runtime.device import cpu_facts, device_facts

        return device_facts(self.__dict__["device"]) if "device" in self.__dict__ else cpu_facts()

    def gather_device_facts(self) -> dict[str, dict[str, Any]] | None:
        """Every rank's :meth:`device_facts`, keyed by rank (as a string), on rank 0; None elsewhere.

        Collective (every rank must call it). Like the ledger's own gather it is bookkeeping,
        not part of any protocol: it is not recorded in the ledger, so a run on GPUs sends the
        same recorded messages and bytes as one on CPUs. A deadline-bounded barrier first, so a
        rank waits asleep, not spinning inside MPI.
        """
        self.transport.barrier()
        facts = self.transport.gather_obj(self.device_facts(), root=0)  # polled and watched, like the barrier
        return None if facts is None else {str(r): f for r, f in enumerate(facts)}

    @property
    def is_server(self) -> bool:
        return self.roles.is_server(self.rank)


def run_job(main: Callable[[JobContext], int | None], *, config: dict[str, Any] | None = None,
            servers: tuple[int, ...] | int = (0,), min_clients: int = 0, deadline: float | None = None,
            liveness: float = DEFAULT_LIMIT_S, device: str | None = None, ledger_csv: str | Path | None = None,
            summary_csv: str | Path | None = None, print_summary: bool = False,
            on_ledger: Callable[[LedgerTable], None] | None = None) -> int:
    """Run ``main(ctx)`` on every rank of ``COMM_WORLD``.

    After ``main`` returns on every rank (a barrier), the ledgers are gathered to rank 0, which
    writes ``ledger_csv`` / ``summary_csv``, prints the summary table if asked, and calls
    ``on_ledger(table)``. Only then, after one more barrier, does every rank rename the outputs
    it staged (:meth:`JobContext.stage`, the ledger CSVs included) to their final paths: a failed
    job leaves none of them there (one that fails later still, e.g. frozen in ``MPI_Finalize``,
    has them removed by the node sentinel).

    From the start every rank shows it is alive: before MPI is up through its node folder and
    the node sentinel (:mod:`mpifc.runtime.node`), then by heartbeats
    (:mod:`mpifc.runtime.liveness`). A rank silent for ``liveness`` seconds, one that ended
    while a peer waits for it, or a job whose every rank waits for another, ends the job with
    one line naming the rank and its phase. Every wait of the runner itself (barriers, the
    ledger gather) is polled from Python with sleeps, so the heartbeat threads always run.

    Any exception on any rank prints ``mpifc: rank R: <ErrorType>: <message>`` and ends the
    whole job (exit code 2 for a :class:`~mpifc.errors.UserError`, 1 otherwise; see
    :mod:`mpifc.runtime.failure`), or exits the process when the job has one rank: this function
    returns only on success. SIGINT and SIGTERM end the job with one line and exit codes 130 and
    143 (:mod:`mpifc.runtime.signals`).

    Args:
        main: the job function, run on every rank; returns an exit code (``None`` = 0).
        config: settings handed to ``main`` as ``ctx.config``.
        servers: server ranks, or their number.
        min_clients: fail with a clear error when fewer client ranks are started.
        deadline: the job's wall-clock limit in seconds (> 0), or None for none: a job still
            running then ends with one line saying what each rank was doing. Waits themselves
            have no limit: a peer that is silent, ended or waiting in turn is found by liveness.
        liveness: seconds a rank may show no sign of life before the job ends (> 0).
        device: ``--device`` override (``None``/``"auto"`` picks ``cuda:(local_rank % n_gpus)``).
        ledger_csv, summary_csv: where rank 0 writes the per-message and the summary CSVs.
        print_summary: rank 0 prints the per-link / per-phase table on stdout.
        on_ledger: called on rank 0 with the gathered :class:`LedgerTable`.

    Returns:
        The largest exit code returned by ``main`` over all ranks.
    """
    try:
        _cpu_mark("runner_start")
        if deadline is not None and not deadline > 0:
            raise UserError(f"--deadline must be > 0 seconds, got {deadline:g}")
        if not liveness > 0:
            raise UserError(f"--liveness must be > 0 seconds, got {liveness:g}")
        from mpifc.runtime.device import parse_device

        device = parse_device(device)
        faults.load()
        from mpifc.runtime import node as node_mod
        from mpifc.runtime import signals
        from mpifc.runtime.launcher import launcher_size, tune_one_node_mpich
        from mpifc.runtime.roles import Roles

        rank0 = env_rank()
        started = launcher_size()
        if started is not None:
            # Too few (or too many) ranks: said before MPI starts, by rank 0 alone.
            Roles.build(started[1], servers, min_clients)
        if rank0 is not None:
            signals.install(rank0)
        node = node_mod.current()  # met at the command's start (mpifc.cli), or now
        if node is not None:
            node.begin_job(liveness)
        else:
            node = node_mod.NodeView.join(rank0, liveness)
            node_mod.set_current(node)
        if node is not None:
            node.in_job = True
        if rank0 is not None:
            faults.note(f"rank-{rank0}.pid", str(os.getpid()))
            if node is not None and node.sentinel_pid is not None:
                faults.note(f"sentinel-{rank0}.pid", str(node.sentinel_pid))
        if node is not None:
            # Meet the node's other ranks here, asleep: MPI_Init would wait for them spinning,
            # with the GIL held. A rank that never comes is the sentinel's to report.
            node.wait_for_local_ranks(max(3.0 * liveness, 30.0))
        try:
            faults.at(rank0, "startup")
        except faults.ReturnEarly:
            return 0
        if node is not None:
            node.mark("ready")
        # Where a job still ends through MPI_Abort, MPICH adds a line of its own unless told not to.
        os.environ.setdefault("MPIR_CVAR_SUPPRESS_ABORT_MESSAGE", "1")
        tune_one_node_mpich()

        from mpi4py import MPI

        from mpifc.runtime.device import local_rank_of
        from mpifc.runtime.launcher import check_launcher_matches
        from mpifc.runtime.liveness import DONE, FINAL, Liveness, set_current
        from mpifc.runtime.outputs import set_current as set_outputs
        from mpifc.runtime.transport import Transport

        world = MPI.COMM_WORLD
        check_launcher_matches(world.Get_size())
        comm = world.Dup()
        rank, size = comm.Get_rank(), comm.Get_size()
        if node is not None:
            shm = node.note_shared_memory()
            faults.note(f"shm-{rank}", "\n".join(shm))
        ledger = CommLedger(rank, size)
        transport = Transport(comm, ledger, float("inf"))
        live = Liveness(world, liveness, node, transport, on_silent=lambda line: abort_with_line(line, 1)) \
            if size > 1 else None
        if live is not None:
            set_current(live)
            live.start()
        if node is not None:
            node.mark("up")
        _cpu_mark("mpi_up")
        clock = _job_clock(deadline, rank, transport, live)
        outputs = StagedOutputs(node)
        set_outputs(outputs)
        roles = Roles.build(size, servers, min_clients)
        local_rank, local_size = local_rank_of(comm)
        check_devices(comm, local_rank, device)
        ctx = JobContext(comm=comm, rank=rank, size=size, transport=transport, ledger=ledger,
                         roles=roles, config=dict(config or {}), local_rank=local_rank,
                         local_size=local_size, device_override=device, liveness=live, outputs=outputs)
        try:
            code = main(ctx)
        except faults.ReturnEarly:
            code = 0
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            code = 0
        code = int(code or 0)
        write_module_report(rank, "server" if roles.is_server(rank) else "client", ctx.notes)
        if live is not None:
            live.set_state(DONE)
        # Every rank must be done before the ledgers are gathered.
        ledger.set_phase("teardown")
        transport.flush()
        transport.barrier()
        left = transport.unreceived()
        if left is not None:
            # Every rank has ended its job function, so nobody will receive it: the rank skipped
            # part of the protocol (e.g. it returned early), and its result cannot be trusted.
            raise ProtocolError(f"ended its job with an unreceived {left[1]!r} message from rank {left[0]} "
                                f"(the job's protocol did not complete)")
        table = ledger.gather(transport)
        code = transport.allreduce_max(code)
        if table is not None:
            if ledger_csv:
                table.write_csv(ctx.stage(ledger_csv))
            if summary_csv or print_summary:
                summary = table.summary()
                if summary_csv:
                    summary.write_csv(ctx.stage(summary_csv))
                if print_summary:
                    print(summary.to_table(), flush=True)
            if on_ledger is not None:
                on_ledger(table)
        # Rank 0 has written everything: every rank may put its outputs in place.
        transport.barrier()
        if clock is not None:
            clock.cancel()
        if code == 0:
            outputs.commit()
        else:
            outputs.discard()
        set_outputs(None)
        if live is not None:
            live.set_state(FINAL)
            live.stop()
            set_current(None)
        if node is not None:
            node.mark("final")
            node.in_job = False
        comm.Free()
        return code
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        abort_job(exc)


def check_devices(comm: Any, local_rank: int, device: str) -> None:
    """Before any work: an explicit ``--device cuda``/``cuda:N`` must name a GPU of every rank's
    node. Otherwise the job ends with ONE line naming the first such rank and its host (exit
    code 2), however many ranks lack it. ``auto`` and ``cpu`` need no check (and no torch)."""
    from mpifc.runtime.device import device_problem, wants_cuda

    if not wants_cuda(device):
        return
    import socket

    problem = device_problem(local_rank, device)
    found = comm.allgather(None if problem is None else (problem, socket.gethostname()))
    bad = [(r, p) for r, p in enumerate(found) if p is not None]
    if not bad:
        return
    rank, (why, host) = bad[0]
    more = f" (and on {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
    err = UserError(f"--device {device!r} on host {host}: {why}{more}")
    if comm.Get_size() == 1:
        raise err
    if comm.Get_rank() == 0:
        from mpifc.runtime.failure import error_line

        abort_with_line(error_line(err, rank), 2)
    # Every other rank waits for rank 0's abort to end it, saying nothing (one line in all).
    import time

    time.sleep(60.0)
    os._exit(2)


def _job_clock(deadline: float | None, rank: int, transport: Any, live: Any) -> Any:
    """A timer that ends the job at its wall-clock ``deadline`` (None: no timer). Rank 0, which
    hears every rank's heartbeats, says what each does; the others end the job themselves only
    if rank 0 could not (two liveness limits later)."""
    if deadline is None or deadline == float("inf"):
        return None
    import threading

    def expired() -> None:
        from mpifc.runtime.liveness import describe_wait

        if live is not None:
            states = live.describe_ranks()
        else:
            states = f"rank {rank} {describe_wait(rank, transport.awaiting) or 'computes'}"
        abort_with_line(f"mpifc: the job ran past its --deadline of {deadline:g} s (wall clock): {states}; "
                        f"ending the job", 1)

    timer = threading.Timer(deadline if rank == 0 or live is None else deadline + 2 * live.limit + 1.0, expired)
    timer.daemon = True
    timer.start()
    return timer


MODULE_REPORT_ENV = "MPIFC_MODULE_REPORT"
"""Names a folder: every rank of a job writes ``rank-<R>.json`` there when its job function has
returned, with its role, the job function's notes (:attr:`JobContext.notes`), the sorted top-level names of the modules it has loaded, its peak
resident set size (MB) and where its CPU time went (``cpu_s``: process CPU seconds at the
job runner's start, once MPI and the heartbeats were up, and when the job function returned;
``thread_cpu_s``: per thread, by name). How the tests show that a rank did not import what it does
not need (torch, scikit-learn) and how the start-up and many-ranks benchmarks read each rank's
memory and CPU."""

_CPU_MARKS: dict[str, float] = {}


def _cpu_mark(name: str) -> None:
    """Note the process CPU time at a point of the job runner (for the module report)."""
    if os.environ.get(MODULE_REPORT_ENV):
        _CPU_MARKS[name] = round(time.process_time(), 4)


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread of this process, by thread name (from ``/proc``)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir() if Path("/proc/self/task").is_dir() else []:
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), f"native-{task.name}")
        out[name] = round(out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 3)
    return out


def write_module_report(rank: int, role: str, notes: dict[str, Any] | None = None) -> None:
    """Write this rank's module report if :data:`MODULE_REPORT_ENV` names a folder."""
    folder = os.environ.get(MODULE_REPORT_ENV)
    if not folder:
        return
    import json
    import resource

    _cpu_mark("job_done")
    top = sorted({name.split(".", 1)[0] for name in list(sys.modules)})
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder) / f"rank-{rank}.json"
    tmp = out.with_suffix(".json.part")
    tmp.write_text(json.dumps({"rank": rank, "role": role, "peak_rss_mb": round(peak_kb / 1024.0, 1),
                               "notes": dict(notes or {}), "modules": top, "cpu_s": dict(_CPU_MARKS),
                               "thread_cpu_s": _thread_cpu()}, default=str))
    os.replace(tmp, out)


def main_entry(main: Callable[[JobContext], int | None], **kwargs: Any) -> None:
    """``sys.exit(run_job(main, **kwargs))``, for ``if __name__ == "__main__"`` blocks."""
    sys.exit(run_job(main, **kwargs))
