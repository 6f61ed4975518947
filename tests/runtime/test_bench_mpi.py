"""The transport benchmark runs end to end (tiny sizes) through `mpifc bench` and writes its CSV."""
from __future__ import annotations

import csv

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def test_bench_transport_smoke(tmp_path):
    out = tmp_path / "bench.csv"
    r = run_mpi(2, ["-m", "mpifc", "bench", "transport", "--reps", "1", "--max-bytes", "2048", "--out", str(out)],
                timeout=60)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [int(x["bytes"]) for x in rows] == [8, 32, 128, 512, 2048]
    for x in rows:
        assert float(x["raw_latency_us"]) > 0 and float(x["mpifc_latency_us"]) > 0
    assert "added latency" in r.stdout
