"""``--quick`` table2 (client EiNets on MNIST shards, real MPI jobs) and the MNIST row of table1.

Both need MNIST under the data root and skip cleanly without it.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from data_prep.files import default_data_root
from mpifc.experiments import registry, table2
from mpifc.experiments.store import NOT_RUN, OK

from .test_quick_experiments import assert_written, by_cell, finite

needs_mnist = pytest.mark.skipif(not (default_data_root() / "mnist").exists(),
                                 reason="MNIST not found under the data root (../shared/data or $MPIFC_DATA)")


@pytest.fixture(scope="module")
def quick_table2(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick-table2")
    shards = tmp_path_factory.mktemp("table2-shards")
    summary = registry.get("table2").run(out, [0], True, shards=shards, progress=False)
    return out, shards, summary


@needs_mnist
def test_table2_quick(quick_table2):
    out, shards, summary = quick_table2
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "table2.md", "table2.png")
    cells = {k[1]: r for k, r in by_cell(summary).items()}
    assert sorted(cells) == list(table2.QUICK_CLIENTS)
    for k, rec in cells.items():
        assert rec["status"] == OK, rec.get("error")
        # 8-bit pixels: a fitted model must beat the uniform 8 bits per dimension
        assert finite(rec["bpd"]) and 0 < rec["bpd"] < 8
        assert math.isclose(rec["bpd"], -rec["test_ll_pixels"] / (rec["pixels"] * math.log(2)), rel_tol=1e-12)
        assert rec["pixels"] == 28 * 28 and rec["ranks"] == k + 1 and rec["bytes_train"] > 0
        # the fixed total data are shared out: each client sees about 1/k of the rows
        assert abs(rec["rows_per_client"] - rec["rows_train"] / k) < 1e-9
    rows = {cells[k]["rows_train"] for k in cells}
    assert len(rows) == 1  # same train rows whatever the number of clients
    # the mixture grows with the clients: k client EiNets of one size (plus k mixture weights)
    p1 = cells[1]["n_parameters"]
    for k, rec in cells.items():
        assert k * p1 <= rec["n_parameters"] <= k * p1 + 2 * k
    md = (out / "table2.md").read_text()
    assert "4.50 ± 0.03" in md and "trend here: mnist" in md and "machine:" in md
    # resumable: a rerun on the same folders runs nothing
    again = registry.get("table2").run(out, [0], True, shards=shards, progress=False)
    assert again["counts"] == {"ran": 0, "skipped": len(cells), "failed": 0}


@needs_mnist
def test_table2_pixel_marginal_is_at_least_the_joint(quick_table2):
    """log p(x) >= log p(x, y): the label marginalised can only add mass."""
    from mpifc.experiments.jobs import evaluate_fc

    _, _, summary = quick_table2
    rec = next(r for r in summary["records"] if r["clients"] == 2)
    joint = evaluate_fc(Path(rec["shards"]), Path(rec["model"]))["test_ll"]
    assert rec["test_ll_pixels"] >= joint - 1e-9


def test_table2_sixteen_clients_need_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(table2, "available_memory", lambda: 2 * 2**30)
    assert table2.memory_reason(8) is None
    assert "17 ranks" in table2.memory_reason(16)
    summary = table2.run(tmp_path, [0], True, clients=[16], progress=False)
    rec = summary["records"][0]
    assert rec["status"] == NOT_RUN and "memory" in rec["reason"]
    assert "not-run: memory" in (tmp_path / "table2.md").read_text()


def test_table2_trend_line():
    agg = [{"dataset": "mnist", "clients": k, "status": OK, "bpd_mean": b} for k, b in ((1, 2.0), (2, 1.9), (4, 1.8))]
    assert "improves (falls) at every step" in table2.bpd_trend(agg)
    agg[2]["bpd_mean"] = 2.5
    assert "not monotone" in table2.bpd_trend(agg)
    assert "table2" in registry.names()


@needs_mnist
def test_table1_mnist_row_quick(tmp_path):
    summary = registry.get("table1").run(tmp_path, [0], True, datasets=["mnist"], settings=["horizontal"],
                                         progress=False)
    cells = by_cell(summary)
    assert set(cells) == {("central", 1, "einet"), ("horizontal", 3, "fedpc")}
    central, fed = cells[("central", 1, "einet")], cells[("horizontal", 3, "fedpc")]
    for rec in (central, fed):
        assert rec["status"] == OK, rec.get("error")
        assert finite(rec["test_ll"]) and rec["hp"]["leaf"] == "gaussian"
    assert fed["learner"] == "einet" and fed["ranks"] == 4 and fed["split"] == "label"
    assert finite(fed["relative_runtime"]) and fed["relative_runtime"] > 0
    # three clients of one EiNet size each hold more parameters than the one central EiNet
    assert fed["n_parameters"] > central["n_parameters"] > 0
    md = (tmp_path / "table1.md").read_text()
    assert "| MNIST | ours |" in md and "3352.0 ± 3.5" in md
