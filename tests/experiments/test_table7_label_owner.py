"""Where Table 7 puts the label per method and setting (no MPI, no data)."""
from __future__ import annotations

import numpy as np

from data_prep.partition import PartitionSpec, make_partition
from mpifc.experiments import paper
from mpifc.experiments.store import Cell
from mpifc.experiments.table7 import hybrid_label_note, label_owner


def test_label_owner_per_method_and_setting() -> None:
    for ds in ("breast-cancer", "credit", "adult"):
        # FC[DT] needs the label on every client
        assert label_owner(Cell(ds, "vertical", 2, "fc-dt", 0)) == "all"
        assert label_owner(Cell(ds, "hybrid", 2, "fc-dt", 0)) is None
        # FC[PC]: vertical keeps the partition's default (client 0), hybrid follows paper.py
        assert label_owner(Cell(ds, "vertical", 3, "fc-pc", 1)) is None
        for k in (2, 3):
            assert label_owner(Cell(ds, "hybrid", k, "fc-pc", 4)) == paper.T7_HYBRID_LABEL_OWNER.get(ds)
        for m in ("fc-pc", "fc-dt", "fedavg"):
            assert label_owner(Cell(ds, "horizontal", 5, m, 0)) is None


def test_hybrid_label_owners_are_valid_partitions_with_the_label_on_that_client_only() -> None:
    feats = [f"f{j}" for j in range(14)]
    train, test = np.arange(0, 300), np.arange(300, 400)
    for ds, owner in paper.T7_HYBRID_LABEL_OWNER.items():
        for k in (2, 3):
            part = make_partition(PartitionSpec("hybrid", k, seed=3, label_owner=owner), train, test,
                                  feats, "y")
            holders = [i for i, c in enumerate(part.clients) if "y" in c.features]
            assert holders == (list(range(k)) if owner == "all" else [owner]), ds
            # the label client keeps its private block next to the shared one
            shared = set(part.info["shared_features"])
            assert set(part.clients[holders[0]].features) - shared - {"y"}


def test_hybrid_label_note_names_every_dataset() -> None:
    note = hybrid_label_note(["breast-cancer", "credit", "adult"])
    assert "Cancer: every client" in note and "Credit: every client" in note
    assert "Income: client 0 only" in note
    assert "T7_HYBRID_LABEL_OWNER" in note
