"""Table 7's FC[PC] label-owner k-means without the target (paper.T7_CLUSTER_WITHOUT_TARGET)."""
from __future__ import annotations

import argparse
import itertools

from mpifc.experiments import paper
from mpifc.experiments.store import OK, Cell
from mpifc.experiments.table7 import DATASETS, GRID, ConfigCheckedStore, cell_config, cluster_note
from mpifc.federated.one_pass import CLUSTER_WITHOUT_TARGET


def test_option_per_cell_and_only_fc_pc_records_it() -> None:
    assert set(paper.T7_CLUSTER_WITHOUT_TARGET) <= {"horizontal", "vertical", "hybrid"}
    for st, k in GRID:
        for ds in DATASETS:
            on = paper.classifier_cluster_without_target(st, ds)
            assert on == (ds in paper.T7_CLUSTER_WITHOUT_TARGET.get(st, ()))
            assert cell_config(Cell(ds, st, k, "fc-pc", 0))["cluster_without_target"] is on
            assert "cluster_without_target" not in cell_config(Cell(ds, st, k, "fc-dt", 0))
    # horizontal has no label owner (every client holds the target in one shared subspace)
    assert not any(paper.classifier_cluster_without_target("horizontal", ds) for ds in DATASETS)


def test_a_cell_run_with_the_other_setting_is_not_reused(tmp_path) -> None:
    store = ConfigCheckedStore(tmp_path)
    for ds, st in itertools.product(DATASETS, ("vertical", "hybrid")):
        cell = Cell(ds, st, 2, "fc-pc", 0)
        conf = cell_config(cell)
        # a record written before the option existed clustered with the target
        legacy = {k: v for k, v in conf.items() if k != "cluster_without_target"}
        store.save(cell, OK, {"accuracy": 0.9, "f1": 0.6, **legacy})
        assert store.done(cell) is (not conf["cluster_without_target"])
        store.save(cell, OK, {"accuracy": 0.9, "f1": 0.6, **conf})
        assert store.done(cell)
        store.save(cell, OK, {"accuracy": 0.9, "f1": 0.6, **conf,
                              "cluster_without_target": not conf["cluster_without_target"]})
        assert not store.done(cell)


def test_note_names_the_cells_and_the_flag_reaches_the_plan() -> None:
    note = cluster_note(list(DATASETS))
    for st, chosen in paper.T7_CLUSTER_WITHOUT_TARGET.items():
        for ds in chosen:
            assert f"{st} {paper.PAPER_NAMES[ds]}" in note
    assert "T7_CLUSTER_WITHOUT_TARGET" in note
    # table7 passes the fc_job flag (jobs.fc_train_args' extra); fc_job turns it into the plan key
    from mpifc.cli.train import add_fedpc_train_arguments as add_train_arguments, train_config

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    cfg = train_config(p.parse_args(["d", "--model", "m.h5", "--hp", "rdc_k=20", "--cluster-without-target"]))
    assert cfg["hyperparameters"] == {"rdc_k": 20, CLUSTER_WITHOUT_TARGET: True}
