"""Exact EM on the FC structure, one process: monotone and normalised.

Distributed EM == centralized EM is asserted in ``test_fc_mpi.py`` (vertical end-to-end job)."""
from __future__ import annotations

import numpy as np

from mpifc.federated.assign import assign
from mpifc.federated.em import em_step
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


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
