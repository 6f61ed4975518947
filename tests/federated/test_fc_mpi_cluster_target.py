"""``fc_job train --cluster-without-target`` over MPI == Algorithm 1 in one process with the option."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import CLUSTER_WITHOUT_TARGET, ClientDeclaration, OnePassBuilder, \
    build_single_process, ids_digest
from mpifc.federated.serialize import load_fc
from tests.federated.fixtures import FEATURES, real_table, write_shards
from tests.mpi_util import run_mpi

# the label owner (client 0) holds a, b and the target y; client 1 holds c, d
pytestmark = pytest.mark.mpi  # one 3-rank job, ~5-10 s on a quiet machine (mpiexec start-up)

LAYOUT = [(("a", "b", "y"), slice(None)), (("c", "d"), slice(None))]


def test_distributed_training_with_the_option_equals_single_process(tmp_path):
    x, x_test = real_table(200, 7), real_table(40, 8)
    shards = write_shards(tmp_path / "v", "vertical", x, x_test, "real", layouts=LAYOUT)
    model = tmp_path / "m.h5"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--learner", "factorized", "--glue",
                    "cooccurrence", "--clusters", "3", "--seed", "5", "--cluster-without-target", "--model",
                    str(model), "--json"], timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["cluster_without_target"] is True
    ids = np.arange(len(x), dtype=np.int64)
    pairs = []
    for i, (feats, _) in enumerate(LAYOUT):
        cols = [FEATURES.index(f) for f in feats]
        meta = tuple("discrete" if f == "y" else "real" for f in feats)
        cats = tuple(2 if f == "y" else 0 for f in feats)
        pairs.append((ClientDeclaration(i, feats, meta, cats, len(x), ids_digest(ids)), x[:, cols]))
    ref = {}
    for on in (True, False):
        b = OnePassBuilder(n_clusters=3, glue="cooccurrence", seed=5, learner="factorized",
                           hyperparameters={CLUSTER_WITHOUT_TARGET: True} if on else {})
        ref[on] = log_likelihood(build_single_process(b, pairs, FEATURES, "y", "vertical"), x_test)
    got = log_likelihood(load_fc(model), x_test)
    assert np.abs(got - ref[True]).max() < 1e-9
    assert np.abs(ref[True] - ref[False]).max() > 1e-6  # the option changed the clusters here
