"""``--quick`` table1, table7, commcost and scaling: real MPI jobs on tiny breast-cancer shards."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import h5py
import pytest

from mpifc.experiments import registry
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.store import OK

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def assert_written(out: Path, *names: str) -> None:
    for name in names:
        p = out / name
        assert p.exists() and p.stat().st_size > 0, name
        if name.endswith(".png"):
            assert p.read_bytes()[:8] == PNG, name
        if name.endswith(".h5"):
            with h5py.File(p) as f:
                assert "status" in f
    assert not list(out.rglob("*.tmp")), "a temp file was left behind"


def by_cell(summary: dict) -> dict:
    return {(r["setting"], r["clients"], r["method"]): r for r in summary["records"]}


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def rerun_skips_everything(name: str, out: Path, shards: Path, n_cells: int) -> None:
    cells = sorted((out / "cells").rglob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    summary = registry.get(name).run(out, [0], True, shards=shards, progress=False)
    assert summary["counts"] == {"ran": 0, "skipped": n_cells, "failed": 0}
    assert [p.stat().st_mtime_ns for p in cells] == stamps


def test_table1_quick(quick_table1, shard_cache):
    out, summary = quick_table1
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "table1.md", "table1.png")
    cells = by_cell(summary)
    assert set(cells) == {("central", 1, "learnspn"), ("horizontal", 3, "fedpc"), ("vertical", 2, "fedpc"),
                          ("hybrid", 2, "fedpc")}
    for rec in cells.values():
        assert rec["status"] == OK, rec.get("error")
        assert finite(rec["test_ll"]) and -200 < rec["test_ll"] < 0  # 31 standardized reals + label, nats
        assert finite(rec["relative_runtime"]) and rec["relative_runtime"] > 0
    for st in ("horizontal", "vertical", "hybrid"):
        rec = next(r for k, r in cells.items() if k[0] == st)
        assert rec["bytes_train"] > 0 and rec["train_seconds_critical_path"] > 0
        assert rec["ranks"] == rec["clients"] + 1
    md = (out / "table1.md").read_text()
    assert "| Cancer | ours |" in md and "-38.9 ± 0.3" in md and "machine:" in md
    rerun_skips_everything("table1", out, shard_cache, 4)


def test_table7_quick(quick_table7, shard_cache):
    out, summary = quick_table7
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "table7.md", "table7.png")
    cells = by_cell(summary)
    assert set(cells) == {("central", 1, "hgb"), ("horizontal", 2, "fc-pc"), ("horizontal", 2, "fc-dt"),
                          ("horizontal", 2, "fedavg"), ("vertical", 2, "fc-pc"), ("vertical", 2, "fc-dt"),
                          ("vertical", 2, "splitnn")}
    for key, rec in cells.items():
        assert rec["status"] == OK, (key, rec.get("error"))
        assert 0 <= rec["accuracy"] <= 1 and 0 <= rec["f1"] <= 1
    for st in ("horizontal", "vertical"):
        assert cells[(st, 2, "fc-pc")]["accuracy"] >= 0.9
        assert cells[(st, 2, "fc-dt")]["accuracy"] >= 0.85
        assert cells[(st, 2, "fc-pc")]["bytes_train"] > 0
    assert cells[("central", 1, "hgb")]["accuracy"] >= 0.9
    md = (out / "table7.md").read_text()
    assert "not reproduced" in md and "FC[PC] (2 cl.)" in md
    # TabNet does not install cleanly: the table says so and the baselines are the MLPs
    assert "pytorch-tabnet 4.1.0 needs pandas" in md and "FedAvg-MLP (2 cl.)" in md and "SplitNN-MLP (2 cl.)" in md
    assert cells[("horizontal", 2, "fedavg")]["n_parameters"] > 0
    rerun_skips_everything("table7", out, shard_cache, 7)


def test_a_failing_method_is_recorded_not_raised(tmp_path):
    broken = Launcher(slurm=False, mpiexec="/bin/false")
    # a shard cache of its own: the shared one holds table7's finished runs, which would be reused
    summary = registry.get("table7").run(tmp_path, [0], True, shards=tmp_path / "shards", progress=False,
                                         launcher=broken, methods=["fc-pc", "hgb"], grid=[("horizontal", 2)])
    cells = by_cell(summary)
    assert cells[("horizontal", 2, "fc-pc")]["status"] == "failed"
    assert "exit code" in cells[("horizontal", 2, "fc-pc")]["error"]
    assert cells[("central", 1, "hgb")]["status"] == OK
    assert "failed: JobFailed" in (tmp_path / "table7.md").read_text()


def test_commcost_quick_reuses_table7_runs(quick_table7, quick_commcost):
    out, summary = quick_commcost
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "commcost.md", "commcost.png")
    cells = by_cell(summary)
    assert all(r["status"] == OK for r in cells.values()), [r.get("error") for r in cells.values()]
    # the baselines' payload is exactly their closed form
    assert cells[("horizontal", 2, "fedavg")]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert cells[("vertical", 2, "splitnn")]["ratio"] == pytest.approx(1.0, abs=0.05)
    for st in ("horizontal", "vertical"):
        rec = cells[(st, 2, "fedpc")]
        # M = the PCs' array bytes: the ledger holds those, the counts and the wire format's
        # per-PC header, nothing else; headers and control messages are columns of their own
        assert rec["measured_bytes"] - rec["formula_bytes"] == rec["wire_header_bytes"] > 0
        assert rec["measured_total_bytes"] == rec["measured_bytes"] + rec["header_bytes"] + rec["control_bytes"]
    # the wire format's binary header (~0.1 kB per PC) keeps measured within 5% of the formula,
    # also for the small vertical PCs (one per client and cluster, a few kB on breast cancer)
    for st in ("horizontal", "vertical"):
        c = cells[(st, 2, "fedpc")]
        assert c["formula_bytes"] < c["measured_bytes"] <= 1.05 * c["formula_bytes"], st
    md = (out / "commcost.md").read_text()
    assert "measured / formula" in md and "S where 1000x starts" in md
    # identical jobs (same shards and budgets) ran once, for table7: the baselines; table7's FC[PC]
    # runs mpifc train's adaptive defaults, commcost's FedPC Table 4's fixed settings
    assert all(r["cached_run"] for k, r in cells.items() if k[2] != "fedpc")
    assert not any(r["cached_run"] for k, r in cells.items() if k[2] == "fedpc")
    # default flags: every byte of the job (the summary's count), beside the baselines'
    for st in ("horizontal", "vertical"):
        rec = cells[(st, 2, "fedpc-defaults")]
        assert rec["measured_total_bytes"] > 0 and 0 < rec["accuracy"] <= 1
        assert f"| {rec['measured_total_bytes']} |" in md
    assert cells[("vertical", 2, "fedpc-defaults")]["em_bytes"] > 0
    assert "Default flags" in md
    t7 = by_cell(quick_table7[1])
    assert cells[("horizontal", 2, "fedavg")]["ledger"] == t7[("horizontal", 2, "fedavg")]["ledger"]


def test_scaling_quick_and_sweep_resume(quick_table7, quick_scaling, shard_cache, capsys):
    out, summary = quick_scaling
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "scaling.md", "scaling.png", "projection.csv",
                   "transport.csv")
    cells = by_cell(summary)
    assert set(cells) == {("strong", 1, "fedpc-flat"), ("strong", 2, "fedpc-flat"), ("weak", 1, "fedpc-flat"),
                          ("weak", 2, "fedpc-flat")}
    for rec in cells.values():
        assert rec["status"] == OK, rec.get("error")
        assert rec["wall_seconds"] >= rec["train_seconds_critical_path"] > 0
        assert finite(rec["test_ll"]) and rec["messages_train"] > 0
    assert cells[("weak", 2, "fedpc-flat")]["rows"] > cells[("weak", 1, "fedpc-flat")]["rows"]
    assert cells[("strong", 2, "fedpc-flat")]["rows"] == cells[("strong", 1, "fedpc-flat")]["rows"]
    assert cells[("strong", 2, "fedpc-flat")]["cached_run"]  # table7's horizontal 2-client FC[PC] run
    assert summary["alpha"] > 0 and summary["beta"] > 0
    proj = {p["clients"]: p for p in summary["projection"]}
    assert set(proj) == {1024, 10_000}
    assert all(finite(v) and v > 0 for p in proj.values() for k, v in p.items() if k.endswith("_s"))
    assert proj[10_000]["query_flat_s"] > proj[1024]["query_flat_s"]
    # launch/sweep.py over the same folder: every cell is done, so it only re-aggregates
    sys.path.insert(0, str(REPO / "launch"))
    try:
        import sweep
    finally:
        sys.path.remove(str(REPO / "launch"))
    assert sweep.main(["--ranks", "2,3", "--out", str(out), "--shards", str(shard_cache), "--quick",
                       "--no-progress"]) == 0
    assert "Projected communication time" in capsys.readouterr().out
    assert sweep.main(["--ranks", "0,3", "--out", str(out), "--quick"]) == 2


def test_table3_quick(quick_table3):
    out, summary = quick_table3
    assert_written(out, "cells.csv", "cells.h5", "summary.csv", "table3.md", "table3.png")
    (rec,) = summary["records"]
    assert rec["status"] == OK, rec.get("error")
    assert finite(rec["ll_one_pass"]) and finite(rec["ll_em"]) and -200 < rec["ll_one_pass"] < 0
    # EM starts from the one-pass model; its training log-likelihood must not fall
    trace = rec["em_train_ll"]
    assert len(trace) == rec["em_iters"] and all(b >= a - 1e-6 for a, b in zip(trace, trace[1:]))
    assert "-55.70 ± 0.20" in (out / "table3.md").read_text()
