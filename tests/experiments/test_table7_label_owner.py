"""Where Table 7 puts the label per method and setting, and what its FC[PC] cells run (no MPI, no
data)."""
from __future__ import annotations

from pathlib import Path

from mpifc.experiments import jobs
from mpifc.experiments.jobs import fc_train_args
from mpifc.experiments.store import OK, Cell
from mpifc.experiments.table7 import FC_PC_NOTE, ConfigCheckedStore, cell_config, label_owner


def test_label_owner_per_method_and_setting() -> None:
    for ds in ("breast-cancer", "credit", "adult"):
        # FC[DT] needs the label on every client
        assert label_owner(Cell(ds, "vertical", 2, "fc-dt", 0)) == "all"
        assert label_owner(Cell(ds, "hybrid", 2, "fc-dt", 0)) is None
        # FC[PC] takes the shards data_prep writes by default
        for st, k in (("vertical", 3), ("hybrid", 2), ("hybrid", 3), ("horizontal", 5)):
            assert label_owner(Cell(ds, st, k, "fc-pc", 1)) is None
        for m in ("fc-pc", "fc-dt", "fedavg"):
            assert label_owner(Cell(ds, "horizontal", 5, m, 0)) is None


def test_fc_pc_cells_run_the_adaptive_defaults_and_older_records_are_not_reused(tmp_path, monkeypatch) -> None:
    cell = Cell("credit", "vertical", 2, "fc-pc", 0)
    assert cell_config(cell) == {"preset": "adaptive", "label_owner": "default"}
    assert "class glue" in FC_PC_NOTE and "exact distributed EM" in FC_PC_NOTE
    store = ConfigCheckedStore(tmp_path)
    # a record of a run with Table 4's fixed settings (no preset recorded) is run again
    store.save(cell, OK, {"accuracy": 0.9, "f1": 0.5, "glue": "cooccurrence", "clusters": 4,
                          "label_owner": "default", "cluster_without_target": True})
    assert not store.done(cell)
    store.save(cell, OK, {"accuracy": 0.9, "f1": 0.6, **cell_config(cell)})
    assert store.done(cell)
    # the training command is the user's: the seed and the learner, no other setting
    monkeypatch.setattr(jobs, "n_clients", lambda shards: 2)
    args, ranks = fc_train_args(Path(tmp_path), preset="adaptive", seed=3)
    flags = [a for a in args if a.startswith("--")]
    assert flags == ["--learner", "--seed", "--json", "--assign"] and ranks == 3
