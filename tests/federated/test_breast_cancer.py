"""FedPC (one-pass, LearnSPN leaves) classifies breast cancer with accuracy >= 0.93 in every setting.

The data set ships with scikit-learn, so this needs no download; it is skipped only when the
LearnSPN module is missing.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpifc.circuit.learnspn")

from data_prep.prepare import prepare  # noqa: E402
from data_prep.shards import load_manifest, write_shards  # noqa: E402
from mpifc.federated.assign import assign  # noqa: E402
from mpifc.federated.one_pass import OnePassBuilder, build_single_process  # noqa: E402
from mpifc.fedpc.data import read_client_data  # noqa: E402
from mpifc.fedpc.evaluate import evaluate_gathered  # noqa: E402
from mpifc.federated.serialize import save_fc  # noqa: E402

# (setting, clients, K, min_instances_slice): hybrid shares the label between clients, where
# K = 1 keeps the label's dependence on the single-owner features inside each client's PC.
CASES = [("horizontal", 5, 2, 30), ("vertical", 2, 2, 30), ("hybrid", 2, 1, 20)]


@pytest.mark.parametrize("setting,clients,k,mis", CASES)
def test_breast_cancer_accuracy(tmp_path, setting, clients, k, mis):
    shards = tmp_path / "bc"
    write_shards(prepare(dataset="breast-cancer", setting=setting, clients=clients, seed=0), shards)
    m = load_manifest(shards)
    data = [read_client_data(shards, i) for i in range(m.n_clients)]
    b = OnePassBuilder(n_clusters=k, n_products=4, seed=0, learner="learnspn",
                       hyperparameters={"threshold": 0.4, "min_instances_slice": mis})
    fc = build_single_process(b, [(d.declaration, d.shard.x_train) for d in data], m.feature_order,
                              m.target, m.setting)
    save_fc(assign(fc, "flat"), tmp_path / "bc.h5")
    out = evaluate_gathered({"dir": str(shards), "model": str(tmp_path / "bc.h5"), "batch": 1000})
    assert out["accuracy"] >= 0.93, out
    assert np.isfinite(out["test_ll"])
