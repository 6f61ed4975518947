"""`run_part1` quick mode writes readable redraws and curves (part 1: Examples V-A and V-B)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mpifc.analysis import decentralization as dz
from mpifc.errors import UserError
from mpifc.experiments import decentralization as exp


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_part1_quick_writes_figures_and_curves(tmp_path: Path) -> None:
    out = tmp_path / "results" / "decentralization"
    summary = exp.run(out, quick=True)["exact"]

    for name in (exp.FIG2_PNG, exp.FIG3_PNG):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not list(out.glob(".*.tmp"))

    fig2 = _read_csv(out / exp.FIG2_CSV)
    fig3 = _read_csv(out / exp.FIG3_CSV)
    assert len(fig2) == len(fig3) == 5
    assert float(fig2[0]["mi_nats"]) == 0.0 and float(fig2[-1]["mi_nats"]) == pytest.approx(dz.LOG2)
    # The CSV carries the same numbers the summary reports.
    for s in dz.SETTINGS:
        assert float(fig2[0][s]) == summary["fig2_independent"][s]
        assert float(fig3[-1][s]) == summary["fig3_eps_max"][s]
    for row in fig3:
        assert float(row["max_leak_nats"]) <= float(row["eps_nats"]) + 1e-12

    table = _read_csv(out / exp.TABLE1_CSV)
    assert len(table) == len(dz.TABLE_I)
    for row in table:
        assert abs(float(row["cost_nats"]) - float(row["cmi_nats"])) < 1e-9
    assert all(Path(p).exists() for p in summary["files"])


def test_run_rejects_unknown_parts_before_writing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nope"):
        exp.run(str(tmp_path), parts=("nope",))
    assert not any(tmp_path.iterdir())
