"""Real mpiexec jobs: ping-pong of many dtypes/shapes, a chunked 50 MB array, ledger == MPI counts."""
from __future__ import annotations

import re

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def test_pingpong_all_dtypes_shapes_tensors_and_50mb_chunked_match_mpi_counts():
    # 4 MiB chunks: the 50 MB array travels as 13 MPI payload messages, exercising chunking
    # (the path messages over 2 GiB take) without moving gigabytes.
    r = run_mpi(2, ["tests/runtime/progs/pingpong.py", "--big-mb", "50", "--chunk-bytes", str(4 << 20)],
                timeout=90)
    assert r.returncode == 0, r.stderr
    # mpiexec may merge the two ranks' lines into one, so the reports are found by pattern.
    reports = sorted(re.findall(r"rank (\d): ok (\d+) arrays (\d+) objects (\d+) tensors; (\d+) ledger rows "
                                r"match MPI counts; most MPI messages in one row (\d+)", r.stdout))
    assert [rep[0] for rep in reports] == ["0", "1"], r.stdout
    for rep in reports:
        # 14 dtypes x 9 shapes + 3 layouts + the big one; 50 MiB in 4 MiB chunks: 13 chunks + header
        assert rep[1:4] == ("130", "4", "7"), rep
        assert rep[5] == "14", rep


def test_recv_into_out_posts_payload_early_and_stays_safe_on_mismatch_and_deadline():
    # tests/runtime/progs/prepost.py: out= round trips up to 2 MiB with ledger == MPI counts, an
    # inline message where out= expects a payload, wrong-size out=, deadlines with both posted.
    r = run_mpi(2, ["tests/runtime/progs/prepost.py"], timeout=90)
    assert r.returncode == 0, r.stderr
    reports = sorted(re.findall(r"rank (\d): prepost ok (\d+) ledger rows match MPI counts", r.stdout))
    assert reports == [("0", "6"), ("1", "6")], r.stdout + r.stderr


def test_bench_two_message_peer_columns_are_consistent(tmp_path):
    # launch/bench/transport.py --two-message-peer: the raw header+payload peer's columns, and the
    # ratios as medians of per-repetition ratios (tiny sizes, two repetitions: a smoke test, not a timing).
    import csv
    import math

    out = tmp_path / "bench.csv"
    r = run_mpi(2, ["launch/bench/transport.py", "--reps", "2", "--max-iters", "5", "--max-bytes", "32768",
                    "--two-message-peer", "--out", str(out)], timeout=90)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [int(x["bytes"]) for x in rows] == [8, 32, 128, 512, 2048, 8192, 32768]
    for x in rows:
        two = float(x["raw_2msg_latency_us"])
        assert two > 0 and float(x["ratio_2msg_vs_raw"]) > 0 and float(x["ratio_out_vs_2msg"]) > 0
        for pair in ("out", "fresh"):
            # the median of the per-repetition ratios lies between their quartiles
            lo, mid, hi = (float(x[c]) for c in (f"ratio_{pair}_p25", f"ratio_{pair}", f"ratio_{pair}_p75"))
            assert 0 < lo <= mid * (1 + 1e-4) and mid <= hi * (1 + 1e-4), (pair, x)
        assert math.isfinite(float(x["added_out_us"])) and math.isfinite(float(x["added_fresh_us"]))
    assert "two-message raw peer" in r.stdout and "     32768 |" in r.stdout
