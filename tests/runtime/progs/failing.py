"""Jobs that fail on purpose. Usage: failing.py MODE [RANK]

Modes:
  raise     rank RANK raises ValueError while the others wait for it in a receive
  usererror rank RANK raises UserError (exit code 2)
  usererror-native  rank RANK raises UserError while rank 0 waits inside a blocking MPI receive
            and the other ranks compute in native code (matrix products)
  deadline  a job with a 4 s wall-clock limit: rank 0 waits for a 'test.never' message while
            rank 1 computes (sleeps) for 600 s; rank 3 holds the GIL for 2 s as the job ends
  deadlock  rank 0 waits for a message from rank 1, which waits for one from rank 0 (liveness 1 s)
  sendlock  rank 0 sends 1 MiB to rank 1, which waits in a barrier (liveness 1 s)
  busy      rank 0 waits 4 s for rank 1, which computes (sleeps) meanwhile (liveness 1 s)
  cli       the mpifc console entry with `train` plugged to a handler that raises on rank RANK
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from mpifc.errors import UserError
from mpifc.runtime.job import JobContext, run_job
from mpifc.runtime.kinds import register_kind

NEVER = register_kind("test.never", "control", "a message nobody sends")
GO = register_kind("test.go", "control", "a message sent after the failure point")


def make_raiser(bad_rank: int, exc: type[BaseException]):
    def main(ctx: JobContext) -> int:
        if ctx.rank == bad_rank:
            time.sleep(0.2)  # let the others block in their receive first
            raise exc(f"planted failure on purpose")
        # Everyone else waits for a message that would come only after the failure point.
        ctx.transport.recv(bad_rank, GO)
        return 0
    return main


def make_native_raiser(bad_rank: int):
    def main(ctx: JobContext) -> int:
        if ctx.rank == bad_rank:
            time.sleep(0.2)
            raise UserError("planted failure on purpose")
        if ctx.rank == 0:
            ctx.comm.recv(source=bad_rank, tag=77)  # inside MPI_Recv: no Python runs on this thread
            return 0
        a = np.random.default_rng(ctx.rank).random((300, 300))
        end = time.monotonic() + 60.0
        while time.monotonic() < end:
            a = a @ a
            a /= a.max()
        return 0
    return main


def deadline_main(ctx: JobContext) -> int:
    if ctx.rank == 0:
        ctx.transport.recv(1, NEVER)
    elif ctx.rank == 3:
        hold_gil_as_the_job_ends(2.0)
    time.sleep(600)  # never sends; the abort must end this sleep
    return 0


def hold_gil_as_the_job_ends(seconds: float) -> None:
    """Once the job's line is said, keep this rank's threads from running for ``seconds``: as a
    native call holding the GIL, or a starved process on a loaded node, does. Its signal thread
    then takes a peer's request to end the job that much later, and the job's exit code must not
    depend on it."""
    from mpifc.runtime import node

    view = node.current()
    while view is not None and not (view.folder / "said").exists():
        time.sleep(0.01)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 5.0)  # no other thread of this rank takes the GIL meanwhile
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    sys.setswitchinterval(interval)


def deadlock_main(ctx: JobContext) -> int:
    ctx.transport.recv(1 - ctx.rank, NEVER)
    return 0


def sendlock_main(ctx: JobContext) -> int:
    if ctx.rank == 0:
        ctx.transport.send(np.zeros(1 << 17), 1, NEVER)
    else:
        ctx.transport.barrier()
    return 0


def busy_main(ctx: JobContext) -> int:
    if ctx.rank == 1:
        time.sleep(4.0)
        ctx.transport.send(np.zeros(4), 0, GO)
    else:
        ctx.transport.recv(1, GO)
    return 0


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of a stand-in ``train`` subcommand (the job flags and a seed)."""
    from mpifc.cli.common import add_job_arguments

    add_job_arguments(p)
    p.add_argument("--seed", type=int, default=0)


def train_main(args: argparse.Namespace) -> int:
    """A stand-in for a real `train` handler, plugged in through `COMMANDS`."""
    return run_job(make_raiser(args.seed, RuntimeError), deadline=args.deadline)


if __name__ == "__main__":
    mode = sys.argv[1]
    bad = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    if mode == "raise":
        run_job(make_raiser(bad, ValueError))
    elif mode == "usererror":
        run_job(make_raiser(bad, UserError))
    elif mode == "usererror-native":
        run_job(make_native_raiser(bad))
    elif mode == "deadline":
        run_job(deadline_main, deadline=4.0)
    elif mode in ("deadlock", "sendlock", "busy"):
        sys.exit(run_job({"deadlock": deadlock_main, "sendlock": sendlock_main, "busy": busy_main}[mode],
                         liveness=1.0))
    elif mode == "cli":
        from mpifc import cli

        cli.COMMANDS["train"] = cli.Command("test", "tests.runtime.progs.failing:train_main",
                                            "tests.runtime.progs.failing:add_train_arguments")
        # Exactly what the generated `mpifc` console script runs.
        sys.argv = ["mpifc", "train", "--seed", str(bad)]
        sys.exit(cli.main())
    else:
        sys.exit(f"unknown mode {mode}")
