"""The transport benchmark runs end to end (tiny sizes) through `mpifc bench` and writes its CSV."""
from __future__ import annotations

import csv
import math

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def test_bench_transport_smoke(tmp_path):
    out = tmp_path / "bench.csv"
    r = run_mpi(2, ["-m", "mpifc", "bench", "transport", "--reps", "1", "--max-iters", "20", "--max-bytes", "2048",
                "--out", str(out)],
                timeout=60)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [int(x["bytes"]) for x in rows] == [8, 32, 128, 512, 2048]
    for x in rows:
        for col in ("raw_latency_us", "raw_fresh_latency_us", "mpifc_latency_us", "mpifc_out_latency_us"):
            assert float(x[col]) > 0, (col, x)
        # The derived columns are consistent with the latencies they come from.
        raw, out_, rawf, fresh = (float(x[c]) for c in ("raw_latency_us", "mpifc_out_latency_us",
                                                         "raw_fresh_latency_us", "mpifc_latency_us"))
        assert math.isclose(float(x["added_out_us"]), out_ - raw, rel_tol=1e-4, abs_tol=0.05)
        assert math.isclose(float(x["added_fresh_us"]), fresh - rawf, rel_tol=1e-4, abs_tol=0.05)
        assert math.isclose(float(x["ratio_out"]), raw / out_, rel_tol=1e-3)
        assert math.isclose(float(x["ratio_fresh"]), rawf / fresh, rel_tol=1e-3)
        # One repetition: the per-repetition ratios' quartiles are that repetition's ratio.
        for q in ("p25", "p75"):
            assert math.isclose(float(x[f"ratio_out_{q}"]), float(x["ratio_out"]), rel_tol=1e-4)
            assert math.isclose(float(x[f"ratio_fresh_{q}"]), float(x["ratio_fresh"]), rel_tol=1e-4)
    assert "added latency" in r.stdout
