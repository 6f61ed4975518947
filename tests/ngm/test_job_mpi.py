"""FedNGM as a real MPI job (master + 2 clients)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.mpi_util import run_mpi

PROG = str(Path(__file__).parent / "progs" / "fedngm_job.py")

pytestmark = pytest.mark.mpi


def test_fedngm_job_trains_global_and_stitches(tmp_path):
    proc = run_mpi(3, [PROG, str(tmp_path), "2"], timeout=240)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["features"] == ["a", "b", "c", "d"]  # e is only at client 1
    assert summary["sample_counts"] == [200, 200]
    assert json.loads((tmp_path / "stitched_1.json").read_text()) == ["a", "b", "c", "d", "e"]
    assert not (tmp_path / "stitched_2.json").exists()
    with open(tmp_path / "ledger.csv") as fh:
        rows = list(csv.DictReader(fh))
    kinds = {r.get("kind") for r in rows}
    assert {"ngm.declare", "ngm.graph", "ngm.model.meta", "ngm.model.array", "ngm.release"} <= kinds


# The refusal below --min-clients is tested through the real command in test_cli.py
# (test_train_refuses_below_min_clients_with_exit_code_2): same job, same message, exit code 2.
