"""Table 1's horizontal split (appendix E) and its timing rounds (each side's fastest of R)."""
from __future__ import annotations

import pytest

from mpifc.errors import UserError
from mpifc.experiments import registry
from mpifc.cli.experiment import main
from mpifc.experiments.store import OK, Cell
from mpifc.experiments.table1 import SplitCheckedStore, fit_critical_path, horizontal_split


def test_paper_split_is_random_for_binary_tabular_sets_and_by_label_for_mnist():
    for ds in ("breast-cancer", "adult", "credit"):
        assert horizontal_split(ds) == "iid"
        assert horizontal_split(ds, "label") == "label"
    assert horizontal_split("mnist") == "label"
    assert horizontal_split("mnist", "iid") == "iid"
    with pytest.raises(UserError, match="--horizontal-split"):
        horizontal_split("adult", "dirichlet")


def test_table1_only_options_are_refused_elsewhere_and_checked(capsys):
    assert main(["table7", "--quick", "--timing-repeats", "2"]) == 2
    assert "--timing-repeats" in capsys.readouterr().err
    assert main(["commcost", "--quick", "--horizontal-split", "label"]) == 2
    assert "--horizontal-split" in capsys.readouterr().err
    assert main(["table1", "--quick", "--timing-repeats", "0"]) == 2
    assert "--timing-repeats" in capsys.readouterr().err


def test_timing_rounds_keep_each_sides_fastest_and_stale_cells_rerun(tmp_path, shard_cache):
    summary = registry.get("table1").run(tmp_path, [0], True, shards=shard_cache, progress=False,
                                         settings=["horizontal"], timing_repeats=2)
    rec = next(r for r in summary["records"] if r["setting"] == "horizontal")
    assert rec["status"] == OK, rec.get("error")
    assert rec["horizontal_split"] == "iid" and rec["split"] == "iid" and "-iid-" in rec["shards"]
    cps, cents = rec["train_seconds_critical_path_runs"], rec["central_seconds_runs"]
    assert len(cps) == 2 and len(cents) == 2 and rec["timing_repeats"] == 2
    assert rec["train_seconds_critical_path"] == min(cps) > 0
    assert rec["central_seconds"] == min(cents) > 0
    assert rec["relative_runtime"] == pytest.approx(min(cps) / min(cents))
    # reading the shards is left out (the centralized timing does not read either)
    assert rec["critical_path"] == "learn+serialize+server"
    assert 0 < rec["train_seconds_critical_path"] < rec["train_seconds_critical_path_job"]
    central = next(r for r in summary["records"] if r["setting"] == "central")
    assert central["status"] == OK and central["horizontal_split"] == "iid"
    assert "--horizontal-split paper" in (tmp_path / "table1.md").read_text()
    # A finished cell is reused only with the same split and number of rounds.
    cell = Cell("breast-cancer", "horizontal", rec["clients"], "fedpc", 0)
    assert SplitCheckedStore(tmp_path, "paper", 2).done(cell)
    assert SplitCheckedStore(tmp_path, "iid", 2).done(cell)
    assert not SplitCheckedStore(tmp_path, "paper", 1).done(cell)
    assert not SplitCheckedStore(tmp_path, "label", 2).done(cell)
    ccell = Cell("breast-cancer", "central", 1, "learnspn", 0)
    assert SplitCheckedStore(tmp_path, "paper", 5).done(ccell)
    assert not SplitCheckedStore(tmp_path, "label", 2).done(ccell)


def test_the_split_does_not_make_vertical_cells_stale(tmp_path):
    store = SplitCheckedStore(tmp_path, "label", 3)
    cell = Cell("adult", "vertical", 2, "fedpc", 0)
    store.save(cell, OK, {"horizontal_split": "iid", "timing_repeats": 3, "critical_path": "learn+serialize+server"})
    assert store.done(cell)
    assert not SplitCheckedStore(tmp_path, "label", 1).done(cell)


def test_fit_critical_path_is_the_slowest_clients_fit_plus_the_server():
    job = {"train_seconds_critical_path": 9.0,
           "client_seconds": {"0": {"read": 5.0, "learn": 1.0, "serialize": 0.25, "em": 0.0},
                              "1": {"read": 0.0, "learn": 2.0, "serialize": 0.5, "em": 0.5}},
           "server_seconds": {"plan": 0.125, "assemble": 0.25, "deserialize": 0.125}}
    assert fit_critical_path(job) == 2.0 + 0.5 + 0.5 + 0.5
    assert fit_critical_path({"train_seconds_critical_path": 1.5}) == 1.5


def test_cells_timed_with_the_jobs_own_critical_path_are_stale(tmp_path):
    cell = Cell("credit", "horizontal", 5, "fedpc", 1)
    store = SplitCheckedStore(tmp_path, "paper", 3)
    store.save(cell, OK, {"horizontal_split": "iid", "timing_repeats": 3})
    assert not store.done(cell)
