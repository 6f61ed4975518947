"""FedAvg over real MPI jobs: equality with centralized SGD, exact ledger bytes, accuracy, bad input."""
from __future__ import annotations

import numpy as np

from data_prep.shards import load_manifest
from mpifc.analysis.commcost import fedavg_bytes, fedavg_messages, with_headers
from mpifc.baselines.central import train_mlp
from mpifc.baselines.data import client_xy
from tests.baselines.fixtures import json_line, phase_bytes, read_ledger
from tests.mpi_util import run_mpi

JOB = ["-m", "mpifc", "baseline", "fedavg"]
MODEL_KINDS = {"fedavg.global", "fedavg.local"}


def test_one_client_fedavg_equals_centralized_sgd(bc_dirs, tmp_path):
    """K rounds of E local epochs on one client are K*E epochs of the same SGD: same init seed,
    same shuffling generator kept across rounds, averaging over one client is the identity."""
    rounds, epochs, batch, lr = 4, 2, 64, 0.2
    params, ledger = tmp_path / "theta.npy", tmp_path / "ledger.csv"
    r = run_mpi(2, JOB + [str(bc_dirs["h1"]), "--rounds", str(rounds), "--local-epochs", str(epochs),
                          "--batch-size", str(batch), "--lr", str(lr), "--save-params", str(params),
                          "--ledger", str(ledger), "--json"], timeout=240)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    theta = np.load(params)
    m = load_manifest(bc_dirs["h1"])
    data = client_xy(m, 0)
    central = train_mlp(data.x, data.y, 2, (64, 32), rounds * epochs, batch, lr, seed=0)
    ref = np.concatenate([p.detach().numpy().ravel() for p in central.parameters()])
    assert theta.dtype == np.float32 and theta.shape == ref.shape == (res["n_parameters"],)
    assert np.max(np.abs(theta - ref)) < 1e-5
    # ...and the run really trained: the parameters moved away from the initialisation
    from mpifc.baselines.mlp import get_flat, make_mlp
    assert np.max(np.abs(theta - get_flat(make_mlp(data.x.shape[1], (64, 32), 2, 0)))) > 1e-2
    rows = read_ledger(ledger)
    assert phase_bytes(rows, "train", kinds=MODEL_KINDS) == fedavg_bytes(1, res["n_parameters"], rounds) \
        == 2 * rounds * 1 * res["n_parameters"] * 4


def test_fedavg_three_clients_accuracy_and_exact_bytes(bc_dirs, tmp_path):
    rounds = 5
    ledger = tmp_path / "ledger.csv"
    r = run_mpi(4, JOB + [str(bc_dirs["h3"]), "--rounds", str(rounds), "--ledger", str(ledger), "--json"], timeout=240)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    assert res["accuracy"] >= 0.9 and res["f1"] >= 0.9
    m_params = res["n_parameters"]
    rows = read_ledger(ledger)
    model = [x for x in rows if x["kind"] in MODEL_KINDS]
    assert {x["phase"] for x in model} == {"train"}
    payload = sum(int(x["payload_bytes"]) for x in model)
    assert payload == fedavg_bytes(3, m_params, rounds) == 2 * rounds * 3 * m_params * 4
    assert len(model) == fedavg_messages(3, rounds)
    # the whole training phase is model traffic: payload plus one 1-D header per message
    assert res["bytes_train"] == phase_bytes(rows, "train", "total_bytes") == with_headers(payload, len(model), ndim=1)
    # a star around the server; clients send only their declaration and their parameters
    assert all("0" in (x["src"], x["dst"]) for x in rows)
    assert {x["payload_class"] for x in rows if x["src"] != "0"} <= {"feature_declaration", "model_parameters"}
    # each client uploads exactly M scalars per round: the rows themselves never travel
    up = [x for x in model if x["kind"] == "fedavg.local"]
    assert len(up) == 3 * rounds and all(int(x["payload_bytes"]) == 4 * m_params for x in up)


def test_fedavg_on_vertical_shards_fails_naming_the_client(bc_dirs):
    r = run_mpi(3, JOB + [str(bc_dirs["v2"]), "--rounds", "2"], timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "client 1 (rank 2)" in r.stderr and "no target" in r.stderr
