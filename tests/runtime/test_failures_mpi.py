"""A failing rank, an expired deadline, a UserError: the whole job ends quickly, naming the rank."""
from __future__ import annotations

import time

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi
PROG = "tests/runtime/progs/failing.py"


def _run(args: list[str], n: int = 4) -> tuple[object, float]:
    t0 = time.monotonic()
    r = run_mpi(n, [PROG, *args], timeout=30)
    return r, time.monotonic() - t0


def test_rank_that_raises_aborts_whole_job_and_names_rank():
    r, elapsed = _run(["raise", "2"])
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert "mpifc: rank 2: ValueError: planted failure on purpose" in r.stderr
    assert "Traceback" in r.stderr  # a bug gets its traceback


def test_user_error_on_one_rank_is_one_line_and_exit_code_2():
    r, elapsed = _run(["usererror", "1"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert elapsed < 15, elapsed
    assert "mpifc: rank 1: UserError: planted failure on purpose" in r.stderr
    assert "Traceback" not in r.stderr


def test_expired_deadline_names_peer_and_kind():
    r, elapsed = _run(["deadline"])
    assert r.returncode != 0
    # rank 1 sleeps 30 s: finishing well before proves the abort ended it.
    assert elapsed < 15, elapsed
    assert ("mpifc: rank 0: DeadlineExceeded: deadline of 1 s passed waiting for a 'test.never' "
            "message from rank 1") in r.stderr


def test_console_entry_aborts_job_when_a_rank_raises():
    r, elapsed = _run(["cli", "3"])
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert "mpifc: rank 3: RuntimeError: planted failure on purpose" in r.stderr
    assert r.stderr.count("mpifc: rank 3:") == 1, r.stderr  # reported once, not once per handler


def test_send_nobody_receives_hits_the_deadline():
    # MPICH cannot cancel a send whose envelope has reached the peer, so this usually ends
    # through the watchdog's abort; either way the job ends and names peer and kind.
    r, elapsed = _run(["sendstuck"], n=2)
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert ("mpifc: rank 0: DeadlineExceeded: deadline of 1 s passed waiting for rank 1 to receive a "
            "'test.never' message (1048576 bytes) from rank 0") in r.stderr


def test_barrier_nobody_else_enters_hits_the_deadline():
    # A barrier cannot be cancelled, so the transport polls it (with sleeps) instead of waiting
    # inside MPI, and ends the wait itself at the deadline.
    r, elapsed = _run(["barrier"], n=2)
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert ("mpifc: rank 0: DeadlineExceeded: deadline of 1 s passed waiting for every rank to reach a barrier"
            in r.stderr)
