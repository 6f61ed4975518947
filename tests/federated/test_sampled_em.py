"""Sampled EM (the class glue's default refinement on vertical data) in one process: the row
sample, what stays fixed, what it sends, and that the result is still a distribution."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from mpifc.federated.evaluate import log_likelihood, predict, upward
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.sampled_em import (
    STOP_TOL,
    WIRE_DTYPE,
    fixed_clients,
    leaf_bundle,
    run_single_process,
    sample_rows,
    should_stop,
    split_bundle,
)
from mpifc.federated.wire_format import model_to_bytes

from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


def _vertical(n=1500, seed=0):
    x = binary_table(n, seed)
    shards = [(d, xi) for d, xi, _ in split(x, "vertical")]
    fc = build_single_process(OnePassBuilder(n_clusters=None, glue="class", seed=seed), shards, FEATURES,
                              target="y", setting="vertical")
    return fc, {f: x[:, j] for j, f in enumerate(FEATURES)}


def test_the_sample_is_seeded_sorted_and_never_larger_than_the_rows():
    a = sample_rows(10_000, 2048, seed=3)
    assert len(a) == 2048 and np.all(np.diff(a) > 0) and a[-1] < 10_000
    assert np.array_equal(a, sample_rows(10_000, 2048, seed=3))
    assert not np.array_equal(a, sample_rows(10_000, 2048, seed=4))
    # as many rows as there are, or more, or none asked for: every row
    assert sample_rows(2048, 2048, 0) is None and sample_rows(100, 2048, 0) is None
    assert sample_rows(100, 0, 0) is None and sample_rows(100, None, 0) is None


@pytest.mark.parametrize("leaves", [False, True])
def test_sampled_em_ties_clusters_to_classes_and_keeps_the_holders_pcs(leaves):
    # y = a XOR c (85 %): a and c live on different clients, y on a third; only EM's tie of
    # the clusters of (a, b) and (c, d) to the classes lets the model predict y. By default
    # (leaves=False) only the sum weights move and every PC stays as learned; with leaves=True
    # the PCs of the clients without the target move too
    fc, cols = _vertical()
    holders = fixed_clients(fc)
    assert holders == {2} and fixed_clients(fc, leaves=False) == {0, 1, 2}
    before = {n.id: model_to_bytes(n.leaf.model).tobytes() for n in fc.leaves}
    test = binary_table(2000, seed=7)
    tcols = {f: test[:, j] for j, f in enumerate(FEATURES)}
    acc0 = float(np.mean(predict(fc, tcols) == test[:, 4]))
    trace = run_single_process(fc, cols, iters=15, rows=600, seed=0, leaves=leaves)
    acc1 = float(np.mean(predict(fc, tcols) == test[:, 4]))
    assert acc0 < 0.6 < 0.8 < acc1, (acc0, acc1)
    # it rose, and stopped once it no longer did (the leaves' M-step keeps variance floors and
    # smoothing, so a step may lose a little)
    assert trace[-1] > trace[0] + 0.1 and np.all(np.diff(trace)[:-1] >= STOP_TOL), trace
    # the target holder's PCs are as learned; the others moved only with leaves=True
    after = {n.id: model_to_bytes(n.leaf.model).tobytes() for n in fc.leaves}
    moved = {nid for nid in before if before[nid] != after[nid]}
    owner = {n.id: n.leaf.client for n in fc.leaves}
    assert {owner[nid] for nid in moved} == ({0, 1} if leaves else set())
    # still a distribution
    assert abs(np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum() - 1) < 1e-9


def test_sampled_em_stops_once_the_likelihood_settles():
    fc, cols = _vertical(seed=1)
    full = run_single_process(copy.deepcopy(fc), cols, iters=40, rows=500, seed=0, tol=None)
    assert len(full) == 40
    early = run_single_process(fc, cols, iters=40, rows=500, seed=0)
    assert len(early) < 40 and should_stop(early, STOP_TOL)
    # the same path up to the stop: the stop rule changes nothing before it
    np.testing.assert_allclose(early, full[:len(early)], rtol=0, atol=1e-12)
    assert early[-1] - early[-2] < STOP_TOL <= early[-2] - early[-3]


def test_a_bundle_is_each_pcs_values_in_float32_in_the_reported_order():
    fc, cols = _vertical(n=300)
    leaves = [n for n in fc.leaves if n.leaf.client == 1]
    pcs = [(n.leaf.model, n.leaf.features) for n in leaves]
    bundle = leaf_bundle(pcs, cols)
    assert bundle.dtype == WIRE_DTYPE and np.dtype(WIRE_DTYPE).itemsize == 4 and bundle.shape == (300 * len(pcs),)
    got = split_bundle(bundle, list(range(len(pcs))), 300)
    full = upward(fc, cols)
    for i, n in enumerate(leaves):
        np.testing.assert_allclose(got[i], full[n.id][:, 0], rtol=1e-6)
        assert np.array_equal(got[i], full[n.id][:, 0].astype(np.float32).astype(np.float64))
