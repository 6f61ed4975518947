"""Real mpiexec jobs: ping-pong of many dtypes/shapes, a chunked 50 MB array, ledger == MPI counts."""
from __future__ import annotations

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def test_pingpong_all_dtypes_shapes_tensors_and_50mb_chunked_match_mpi_counts():
    # 4 MiB chunks: the 50 MB array travels as 13 MPI payload messages, exercising chunking
    # (the path messages over 2 GiB take) without moving gigabytes.
    r = run_mpi(2, ["tests/runtime/progs/pingpong.py", "--big-mb", "50", "--chunk-bytes", str(4 << 20)],
                timeout=90)
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if "ledger rows match MPI counts" in line)
    assert len(lines) == 2, r.stdout
    # 14 dtypes x 9 shapes + 3 layouts + the big one
    assert lines[0].startswith("rank 0: ok 130 arrays 4 objects 7 tensors")
    assert lines[1].startswith("rank 1: ok 130 arrays 4 objects 7 tensors")
    # 50 MiB in 4 MiB chunks: 13 chunks after the header
    assert all(line.endswith("most MPI messages in one row 14") for line in lines), lines
