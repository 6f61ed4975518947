"""The closed forms against the ledgers of real (small) FedAvg and SplitNN MPI runs: within 5%."""
from __future__ import annotations

import pytest

from mpifc.analysis import commcost as cc
from tests.baselines.fixtures import json_line, make_shards
from tests.mpi_util import run_mpi


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("commcost-shards")
    return {"h2": make_shards(root / "h2", dataset="breast-cancer", setting="horizontal", clients=2, seed=1),
            "v2": make_shards(root / "v2", dataset="breast-cancer", setting="vertical", clients=2, seed=1)}


def within(measured: int, formula: int, tol: float = 0.05) -> bool:
    return abs(measured - formula) <= tol * formula


def test_fedavg_ledger_matches_closed_form(shards):
    """Half the clients per round: the formula follows client sampling too."""
    rounds = 6
    r = run_mpi(3, ["-m", "mpifc", "baseline", "fedavg", str(shards["h2"]), "--rounds", str(rounds), "--fraction", "0.5",
                    "--hidden", "16", "--json"], timeout=240)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    assert res["clients_per_round"] == 1
    formula = cc.fedavg_bytes(2, res["n_parameters"], rounds, fraction=0.5)
    assert res["payload_bytes_train"] == formula
    assert within(res["bytes_train"], formula) and res["bytes_train"] > formula  # headers are real bytes
    assert res["messages_train"] == cc.fedavg_messages(2, rounds, fraction=0.5)


def test_splitnn_ledger_matches_closed_form_and_the_papers_form(shards):
    """Full batches, F = 32: the label-owner term (2 k per row) is 3% of 2 |C| F, so even the
    paper's bare E |C| F S form (both directions) lands within 5%."""
    epochs, cut = 3, 32
    r = run_mpi(3, ["-m", "mpifc", "baseline", "splitnn", str(shards["v2"]), "--epochs", str(epochs), "--cut", str(cut),
                    "--batch-size", "0", "--json"], timeout=240)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    s, k = res["n_train"], res["n_classes"]
    exact = cc.splitnn_bytes(2, cut, s, epochs, n_classes=k)
    paper = cc.splitnn_bytes(2, cut, s, epochs, n_classes=0)
    assert res["payload_bytes_train"] == exact
    assert within(res["bytes_train"], exact) and within(res["bytes_train"], paper)
    assert not within(res["bytes_train"], paper, tol=0.01)  # the label term is there, and visible


@pytest.mark.parametrize("setting,glue", [("h2", "random"), ("v2", "cooccurrence")])
def test_fedpc_ledger_matches_closed_form_with_m_as_sent(shards, setting, glue, tmp_path):
    """Model + count (+ cluster id) payload from the ledger = sum of the PCs' array bytes + 24 B
    per PC (+ 1 B per row: uint8 cluster ids for K = 2) within 5%; headers and control messages
    are counted apart. The wire format adds a short binary header per PC
    (mpifc.federated.serialize), small beside the arrays."""
    from mpifc.experiments.communication import fedpc_bytes

    model, ledger = tmp_path / "m.h5", tmp_path / "ledger.csv"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards[setting]), "--learner", "learnspn",
                    "--glue", glue, "--clusters", "2", "--min-instances-slice", "30", "--seed", "0",
                    "--model", str(model), "--ledger", str(ledger), "--json"], timeout=300)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    b = fedpc_bytes(shards[setting], model, ledger, glue, "horizontal" if setting == "h2" else "vertical", 2,
                    int(res["n_parameters"]))
    assert b["n_pcs"] == (2 if setting == "h2" else 4)
    assert b["measured_total_bytes"] == b["measured_bytes"] + b["header_bytes"] + b["control_bytes"]
    assert b["measured_bytes"] >= b["formula_bytes"]  # the arrays are all there; a format adds, never saves
    # nothing travels but the arrays, the counts and the wire format's per-PC header
    assert b["format_bytes"] == b["wire_header_bytes"] > 0
    assert within(b["measured_bytes"], b["formula_bytes"]), b
