"""``mpifc train/evaluate --model-family ngm`` on data_prep shards, the model file and the
client-send audit (the MPI tests run real ``mpiexec`` jobs: master + 2 clients)."""
from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.ngm.job import CLIENT_ALLOWED, PrivacyViolation, audit_client_sends
from mpifc.ngm.store import is_ngm_file, load_ngm, save_ngm
from mpifc.runtime.kinds import kind_by_name, register_kind
from mpifc.runtime.ledger import ROW_DTYPE, LedgerTable
from mpifc.cli.evaluate import add_evaluate_arguments, evaluate_main
from tests.mpi_util import run_mpi

from .conftest import chain_data

TINY = ["--epochs", "3", "--hidden", "8,8", "--samples", "200", "--batch-size", "64", "--calib-rows", "200"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Chain rows a-b-c-d plus a binary target y (from c), as 2 horizontal data_prep shards."""
    from data_prep import prepare, write_shards

    root = tmp_path_factory.mktemp("ngm_cli")
    x = chain_data(900, seed=3)
    y = (x[:, 2] + 0.5 * np.random.default_rng(0).standard_normal(len(x)) > 0).astype(int)
    with open(root / "chain.csv", "w") as fh:
        fh.write("a,b,c,d,y\n")
        for row, t in zip(x, y):
            fh.write(f"{row[0]:.5f},{row[1]:.5f},{row[2]:.5f},d{int(row[3])},y{t}\n")
    cols = [{"name": n, "type": "real"} for n in "abc"] + [{"name": "d", "type": "categorical"},
                                                           {"name": "y", "type": "categorical"}]
    (root / "chain.schema.json").write_text(json.dumps({"columns": cols, "target": "y", "header": True}))
    out = root / "shards"
    write_shards(prepare(dataset="csv", path=str(root / "chain.csv"), setting="horizontal", clients=2, seed=0,
                         encode="none", standardize=False, test_fraction=0.3), out)
    return out


@pytest.mark.mpi
def test_train_writes_model_and_clients_send_only_allowed_classes(shards, tmp_path, capsys):
    model = tmp_path / "ngm.h5"
    proc = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--model-family", "ngm", "--model", str(model),
                       "--min-clients", "2", *TINY, "--ledger", str(tmp_path / "ledger.csv"),
                       "--save-local", str(tmp_path / "local"), "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    glob, extra = load_ngm(model)
    assert glob.schema.names == ("a", "b", "c", "d", "y")
    assert glob.schema["d"].n_categories == 3 and glob.schema["y"].n_categories == 2
    # The graph travels in the file and is the consensus graph the job reported.
    assert sorted(sorted(e) for e in glob.graph.edges()) == summary["edges"]
    assert extra["clients"] == 2 and extra["min_clients"] == 2
    for i in range(2):  # each client saved its own local model
        local, _ = load_ngm(tmp_path / "local" / f"client-{i}.h5")
        assert local.n_parameters() == glob.n_parameters()
    # Privacy: every message a client rank sent is a declaration, a graph or model weights.
    with open(tmp_path / "ledger.csv") as fh:
        rows = list(csv.DictReader(fh))
    client_rows = [r for r in rows if r["src"] != "0"]
    assert client_rows and {r["payload_class"] for r in client_rows} <= CLIENT_ALLOWED
    assert {r["kind"] for r in client_rows} == {"ngm.declare", "ngm.graph", "ngm.model.meta", "ngm.model.array"}
    assert set(summary["client_payload_classes"]) <= CLIENT_ALLOWED
    assert summary["bytes_total"] == sum(int(r["total_bytes"]) for r in rows)

    # Evaluate client 0's own model on its own test rows (3 epochs are too few for the global
    # model's samples to carry y's dependence on c; the client model sees real rows).
    # In this process (evaluation needs no MPI), through mpifc evaluate's own parser and dispatch.
    parser = argparse.ArgumentParser()
    add_evaluate_arguments(parser)
    args = parser.parse_args([str(shards), "--model-family", "ngm", "--model", str(tmp_path / "local" / "client-0.h5"),
                              "--client", "0", "--target", "b", "--target", "y", "--target", "d", "--json"])
    assert evaluate_main(args) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["on"] == "client 0 test rows"
    by = {m["target"]: m for m in res["metrics"]}
    assert {"mae", "rmse"} <= set(by["b"]) and by["b"]["kind"] == "real"
    assert by["b"]["rmse"] < 0.8  # b has unit variance; given a and c the optimum is ~0.47
    assert {"auc", "aupr"} <= set(by["y"]) and by["y"]["auc"] > 0.75  # y follows c: ~0.88 here
    assert {"micro_precision", "micro_recall", "macro_precision", "macro_recall"} <= set(by["d"])


@pytest.mark.mpi
def test_train_refuses_below_min_clients_with_exit_code_2(shards, tmp_path):
    model = tmp_path / "ngm.h5"
    proc = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--model-family", "ngm", "--model", str(model),
                       "--min-clients", "3", *TINY], timeout=300)
    assert proc.returncode == 2
    assert "refusing to release the global dependency graph" in proc.stderr
    assert "at least 3" in proc.stderr
    assert not model.exists()


def _table(sends: list[tuple[str, int]]) -> LedgerTable:
    rows = np.zeros(len(sends), dtype=ROW_DTYPE)
    for i, (kind, src) in enumerate(sends):
        rows[i]["kind"] = kind_by_name(kind).kind_id
        rows[i]["src"], rows[i]["dst"] = src, 0 if src else 1
        rows[i]["payload_bytes"], rows[i]["header_bytes"] = 100, 10
    return LedgerTable(rows=rows, phases=["p"], sent=np.zeros((3, 3, 3), dtype=np.int64))


def test_audit_rejects_a_client_sending_anything_else():
    import mpifc.ngm.job  # noqa: F401  (registers the ngm kinds)

    ok = _table([("ngm.declare", 1), ("ngm.graph", 2), ("ngm.model.array", 1), ("ngm.release", 0)])
    assert audit_client_sends(ok) == {"feature_declaration": 110, "model_parameters": 220}
    register_kind("test.ngm.rows", "likelihood_vector", "a per-sample payload no FedNGM client may send")
    bad = _table([("ngm.graph", 1), ("test.ngm.rows", 2)])
    with pytest.raises(PrivacyViolation, match="client rank 2 sent 'test.ngm.rows' \\(likelihood_vector\\)"):
        audit_client_sends(bad)
    with pytest.raises(PrivacyViolation, match="ngm.release"):  # control from a client is not allowed either
        audit_client_sends(_table([("ngm.release", 1)]))


def test_model_file_round_trip_and_errors(chain_model, chain_test, tmp_path):
    import torch

    path = save_ngm(chain_model, tmp_path / "m.h5", {"note": "x"})
    assert is_ngm_file(path) and not list(tmp_path.glob(".*.tmp"))
    copy, extra = load_ngm(path)
    assert extra == {"note": "x"} and copy.graph == chain_model.graph
    u = chain_model.encode(chain_test)
    with torch.no_grad():
        assert torch.equal(copy.forward(u), chain_model.forward(u))
    with pytest.raises(UserError, match="not found"):
        load_ngm(tmp_path / "missing.h5")
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(UserError, match="junk.h5"):
        load_ngm(tmp_path / "junk.h5")
    assert not is_ngm_file(tmp_path / "junk.h5")
