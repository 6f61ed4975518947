"""FedPCs whose client PCs are EiNets (``--learner einet``)."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.federated.assign import assign
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import OnePassBuilder, build_single_process

from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


@pytest.mark.parametrize("setting", ["horizontal", "vertical"])
def test_fedpc_with_einet_leaves_sums_to_one(setting):
    pytest.importorskip("mpifc.circuit.einet")
    x = binary_table(200, seed=3)
    shards = split(x, setting)
    b = OnePassBuilder(n_clusters=2, n_products=3, seed=2, learner="einet",
                       hyperparameters={"epochs": 2, "num_sums": 2, "repetitions": 2, "batch_size": None})
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", setting)
    assign(fc, "flat")
    assert {n.leaf.learner for n in fc.leaves} == {"einet"}
    total = np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum()
    assert abs(total - 1.0) < 1e-9
