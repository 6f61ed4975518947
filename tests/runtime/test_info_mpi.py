"""`mpifc info` under mpiexec, and the launcher-mismatch check."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.mpi_util import REPO, run_mpi

pytestmark = pytest.mark.mpi


def test_info_lists_every_rank():
    r = run_mpi(2, ["-m", "mpifc", "info"], timeout=60)
    assert r.returncode == 0, r.stderr
    ranks = [line for line in r.stdout.splitlines() if line.startswith("rank ")]
    assert [line.split()[1] for line in ranks] == ["0/2", "1/2"]
    assert "role server" in ranks[0] and "role client" in ranks[1]
    assert "MPI library:" in r.stdout and "mpi4py:" in r.stdout and "torch" in r.stdout


def test_mismatched_launcher_is_a_clear_error():
    # What a foreign mpiexec leaves behind: its job size in the environment, while our MPI
    # starts as a singleton of size 1.
    env = dict(os.environ, OMPI_COMM_WORLD_SIZE="3", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "mpifc", "info"], capture_output=True, text=True,
                       timeout=60, env=env, cwd=REPO)
    assert r.returncode == 2, r.stderr
    # mpi4py may warn first; our report is one line, the last.
    ours = [line for line in r.stderr.splitlines() if line.startswith("mpifc:")]
    assert len(ours) == 1, r.stderr
    assert "UserError" in ours[0] and "OMPI_COMM_WORLD_SIZE=3" in ours[0] and "MPI sees 1" in ours[0]
    assert "MPICH" in ours[0]  # names the MPI that mpi4py loaded
