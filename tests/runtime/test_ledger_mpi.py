"""Ledger gathered from 4 ranks: the CSVs hold every message with the sizes that were sent."""
from __future__ import annotations

import csv
from collections import defaultdict

import pytest

from tests.mpi_util import run_mpi
from tests.runtime.progs.ledger_job import expected_bytes

pytestmark = pytest.mark.mpi
N = 4


def test_ledger_csv_and_summary_from_all_ranks(tmp_path):
    ledger_csv, summary_csv = tmp_path / "ledger.csv", tmp_path / "summary.csv"
    r = run_mpi(N, ["tests/runtime/progs/ledger_job.py", str(ledger_csv), str(summary_csv)], timeout=60)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(ledger_csv.open()))
    by_phase = defaultdict(list)
    for row in rows:
        by_phase[row["phase"]].append(row)
        assert int(row["total_bytes"]) == int(row["payload_bytes"]) + int(row["header_bytes"])
        assert float(row["t_recv"]) >= float(row["t_send"])
    assert sorted(by_phase) == ["actor", "alpha", "beta"]
    # alpha: every ordered pair once, with the exact payload size sent
    alpha = {(int(x["src"]), int(x["dst"])): int(x["payload_bytes"]) for x in by_phase["alpha"]}
    assert alpha == {(s, d): expected_bytes(s, d) for s in range(N) for d in range(N) if s != d}
    assert all(x["kind"] == "test.ledger.data" and x["payload_class"] == "likelihood_vector" for x in by_phase["alpha"])
    assert len(by_phase["beta"]) == N * (N - 1)
    # actor: each client sent one report and one shutdown to rank 0
    actor = sorted((int(x["src"]), x["kind"]) for x in by_phase["actor"])
    assert actor == sorted([(c, k) for c in range(1, N) for k in ("test.ledger.report", "runtime.shutdown")])
    assert all(int(x["dst"]) == 0 for x in by_phase["actor"])

    # The summary's per-link and per-phase totals are the sums of the per-message rows.
    link_tot, phase_tot = defaultdict(int), defaultdict(int)
    for row in rows:
        link_tot[f"{row['src']}->{row['dst']}"] += int(row["total_bytes"])
        phase_tot[row["phase"]] += int(row["total_bytes"])
    summary = list(csv.DictReader(summary_csv.open()))
    got_link = {x["key"]: int(x["total_bytes"]) for x in summary if x["group"] == "link"}
    got_phase = {x["key"]: int(x["total_bytes"]) for x in summary if x["group"] == "phase"}
    assert got_link == dict(link_tot)
    assert got_phase == dict(phase_tot)
    assert "warning" not in r.stdout  # every message sent was received
    assert " 0->1 " in r.stdout or "0->1" in r.stdout
