"""Exact EM on the FC structure: monotone, stays normalised, and distributed == centralized."""
from __future__ import annotations

import json

import numpy as np

from mpifc.federated.assign import assign
from mpifc.federated.em import em_step
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.serialize import load_fc
from tests.federated.fixtures import FEATURES, all_binary, binary_table, real_table, split, write_shards
from tests.mpi_util import run_mpi


def test_em_is_monotone_and_normalised():
    x = binary_table(400, seed=21)
    shards = split(x, "vertical")
    b = OnePassBuilder(n_clusters=3, n_products=5, seed=1, learner="factorized")
    fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "vertical"), "flat")
    cols = {f: x[:, j] for j, f in enumerate(FEATURES)}
    trace = [em_step(fc, cols) for _ in range(6)]
    assert all(b >= a - 1e-10 for a, b in zip(trace, trace[1:])), trace
    assert trace[-1] > trace[0] + 1e-3  # the one-pass weights are not an EM fixed point
    assert abs(np.exp(log_likelihood(fc, all_binary(5))).sum() - 1) < 1e-9


def test_distributed_em_equals_centralized(tmp_path):
    shards = write_shards(tmp_path / "v", "vertical", real_table(200, 3), real_table(30, 4), "real")
    model, initial = tmp_path / "em.h5", tmp_path / "init.h5"
    r = run_mpi(4, ["-m", "mpifc.runtime.fc_job", "train", str(shards), "--learner", "factorized",
                    "--clusters", "2", "--products", "3", "--refine", "em", "--em-iters", "3",
                    "--em-initial-model", str(initial), "--model", str(model), "--ledger",
                    str(tmp_path / "l.csv"), "--json"], timeout=180)
    assert r.returncode == 0, r.stderr
    trace = json.loads(r.stdout.strip().splitlines()[-1])["em_train_ll"]
    # Centralized EM on the same initial structure, on the clients' rows joined by (aligned) id.
    fc = load_fc(initial)
    x = real_table(200, 3)
    cols = {f: x[:, j] for j, f in enumerate(FEATURES)}
    ref = [em_step(fc, cols) for _ in range(3)]
    np.testing.assert_allclose(trace, ref, atol=1e-9, rtol=0)
    got = load_fc(model)
    test = real_table(30, 4)
    assert np.abs(log_likelihood(got, test) - log_likelihood(fc, test)).max() < 1e-9
    for a, b in zip(got.nodes, fc.nodes):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-12)
    rows = (tmp_path / "l.csv").read_text().splitlines()
    flows = [ln for ln in rows if ",fc.em.flows," in ln]
    assert len(flows) == 3 * 3 and all(",flow," in ln for ln in flows)  # 3 iterations x 3 client links
