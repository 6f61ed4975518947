"""``mpifc train DIR --seed 0 --model M`` with no other flag classifies breast cancer in every
setting (real mpiexec jobs, distributed evaluation): LearnSPN's own min_instances_slice of 200
would fully factorise these clients' PCs (91-152 rows) into the majority-class model. With
``--audit``, no message a client sends and nothing in the model file holds a value that fewer
than 5 rows hold (the k-rows rule, ``mpifc.circuit.privacy``)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_prep.prepare import prepare
from mpifc.circuit.privacy import rare_values
from mpifc.cli.prep import run as prep_run
from mpifc.federated.serialize import load_fc
from mpifc.fedpc.audit import model_findings
from tests.mpi_util import run_mpi

JOB = ["-m", "mpifc"]


def raw_rare_values(setting: str, clients: int) -> np.ndarray:
    """The values, in the user's units, that fewer than 5 rows of the prepared table hold."""
    table = prepare(dataset="breast-cancer", setting=setting, clients=clients, seed=0).table
    return rare_values(table.x, [j for j, m in enumerate(table.meta_types) if m != "categorical"])


def _json(out: str) -> dict:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


@pytest.mark.parametrize("setting,clients", [("horizontal", 5), ("vertical", 3), ("hybrid", 3)])
def test_default_flags_classify_breast_cancer(tmp_path, setting, clients):
    shards, model = tmp_path / "bc", tmp_path / "fc.h5"
    prep_run(["--dataset", "breast-cancer", "--setting", setting, "--clients", str(clients), "--seed", "0",
              "--out", str(shards)])
    audit = tmp_path / "audit"
    r = run_mpi(clients + 1, JOB + ["train", str(shards), "--seed", "0", "--model", str(model), "--audit", str(audit)],
                timeout=300)
    assert r.returncode == 0, r.stderr
    # no client message and nothing in the model file holds a value that fewer than 5 rows hold
    found = json.loads((audit / "audit-summary.json").read_text())
    assert found["findings"] == 0 and found["kinds"]["fc.train.model"]["messages"] >= clients, found
    assert model_findings(model, shards, raw_rare_values(setting, clients)) == dict.fromkeys(
        ("file", "file_float32", "codec_model_units", "codec_user_units"), 0)
    r = run_mpi(clients + 1, JOB + ["evaluate", str(shards), "--model", str(model), "--distributed", "--json"],
                timeout=300)
    assert r.returncode == 0, r.stderr
    metrics = _json(r.stdout)
    assert metrics["accuracy"] >= 0.93 and metrics["f1_macro"] >= 0.92, metrics
    # the model says what every client's PCs were learned with: the rule's values, per PC
    fc = load_fc(model)
    used = fc.meta["hyperparameters"]
    assert sorted(map(int, used)) == list(range(clients)) and fc.meta["defaults"] == "adaptive"
    # the class glue: the label's holders split their rows by class (a PC per class, cluster id
    # = class code, nothing to split inside); on vertical data the others' rows are in K = 4
    # k-means clusters (455 rows: the fewest), tied to the classes by sampled EM on the server
    assert fc.meta["glue"] == "class"
    assert fc.meta["privacy"] == {"k": 5, "audit": "every message", "findings": "fail"}
    for client, rows in used.items():
        clusters: dict[int, set] = {}
        for pc in rows:
            hp = pc["hyperparameters"]
            assert hp["col_split"] == "rdc" and hp["min_instances_slice"] < pc["n_rows"]
            assert "class_column" not in hp
            clusters.setdefault(pc["subspace"], set()).add(pc["cluster"])
        holds = "diagnosis" in fc.clients[int(client)].features
        for subspace, ks in clusters.items():
            assert ks == ({0, 1} if holds else set(range(4))), (client, subspace, ks)
    # every class has a product under the root, weighted by the class's training rows
    root = fc.nodes[fc.root]
    assert root.op == "sum" and len(root.children) == (2 * 4 ** (clients - 1) if setting == "vertical" else 2)
