"""A failing rank, an expired deadline, a UserError: the whole job ends quickly, naming the rank."""
from __future__ import annotations

import time

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi
PROG = "tests/runtime/progs/failing.py"


def _run(args: list[str], n: int = 4, timeout: float = 30) -> tuple[object, float]:
    t0 = time.monotonic()
    r = run_mpi(n, [PROG, *args], timeout=timeout)
    return r, time.monotonic() - t0


def test_rank_that_raises_aborts_whole_job_and_names_rank():
    r, elapsed = _run(["raise", "2"])
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert "mpifc: rank 2: ValueError: planted failure on purpose" in r.stderr
    assert "Traceback" in r.stderr  # a bug gets its traceback


@pytest.mark.parametrize("mode", ["usererror", "usererror-native"])
def test_user_error_on_one_rank_is_one_line_and_exit_code_2(mode):
    # usererror-native: the peers are inside a blocking MPI receive or a native computation. A
    # rank inside MPI that exits on its own makes the launcher kill the others and report their
    # signal (9); the job must end through one MPI_Abort with the line's code, and MPICH's own
    # abort line must not reach the user.
    r, elapsed = _run([mode, "1"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert elapsed < 15, elapsed
    assert "mpifc: rank 1: UserError: planted failure on purpose" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["mpifc: rank 1: UserError: planted failure on purpose"], r.stderr


def test_deadline_is_the_jobs_wall_clock_limit_and_says_what_each_rank_does():
    r, elapsed = _run(["deadline"], timeout=300)
    # Rank 3 holds its GIL for 2 s as the job ends, so it is ready to exit 2 s after its peers:
    # the code is still the line's, not the signal of a rank the launcher killed (9).
    assert r.returncode == 1, r.stderr
    # rank 1 sleeps 600 s: ending in a fraction of that proves the limit ended it, at any load.
    assert elapsed < 200, elapsed
    assert ("mpifc: the job ran past its --deadline of 4 s (wall clock): rank 0 in phase 'startup' waits on rank 1 "
            "(a 'test.never' message); rank 1 in phase 'startup' computes;") in r.stderr
    assert r.stderr.count("mpifc:") == 1, r.stderr


def test_console_entry_aborts_job_when_a_rank_raises():
    r, elapsed = _run(["cli", "3"])
    assert r.returncode != 0
    assert elapsed < 15, elapsed
    assert "mpifc: rank 3: RuntimeError: planted failure on purpose" in r.stderr
    assert r.stderr.count("mpifc: rank 3:") == 1, r.stderr  # reported once, not once per handler


@pytest.mark.parametrize("mode, waits", [
    ("deadlock", "rank 0 waits on rank 1 (a 'test.never' message); rank 1 waits on rank 0 (a 'test.never' message)"),
    ("sendlock", "rank 0 waits on rank 1 (a 'test.never' message); rank 1 waits on every rank"),
])
def test_ranks_that_all_wait_on_one_another_end_the_job_within_liveness(mode, waits):
    # No wait has a time limit: the heartbeats show every rank blocked, with no message moving.
    r, elapsed = _run([mode], n=2)
    assert r.returncode == 1, r.stderr
    assert elapsed < 15, elapsed
    assert f"mpifc: every rank waits and none sends ({waits}" in r.stderr
    assert r.stderr.count("mpifc:") == 1, r.stderr


def test_a_wait_on_a_peer_that_computes_has_no_limit():
    # Rank 0 waits 4 s, four times --liveness, for rank 1, which is alive and busy.
    r, elapsed = _run(["busy"], n=2)
    assert r.returncode == 0, r.stderr
    assert "mpifc:" not in r.stderr
