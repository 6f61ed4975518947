"""Exact EM for horizontal and hybrid FCs (pooled E-step statistics): equals centralized EM on the
pooled rows, in one process and as a real MPI job, with closed-form statistics bytes."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from data_prep.shards import load_manifest, read_client
from mpifc.errors import UserError
from mpifc.federated.assign import assign
from mpifc.federated.em import (
    check_em_supported,
    em_step,
    local_statistics,
    pooled_em_step,
    stats_from_vector,
    stats_to_vector,
    sum_ids,
)
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.serialize import load_fc
from tests.federated.fixtures import FEATURES, all_binary, binary_table, real_table, split, write_shards
from tests.federated.test_fc_mpi import assert_ledger_declared, assert_private, read_ledger, train


def pooled_columns(shards: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The clients' rows stacked in client order; features a client does not hold are NaN."""
    n = [len(next(iter(c.values()))) for c in shards]
    return {f: np.concatenate([c.get(f, np.full(k, np.nan)) for c, k in zip(shards, n)]) for f in FEATURES}


@pytest.mark.parametrize("setting", ["horizontal", "hybrid"])
def test_pooled_statistics_equal_centralized_em(setting):
    x = binary_table(300, seed=3)
    parts = split(x, setting)
    b = OnePassBuilder(n_clusters=2, n_products=3, seed=1, learner="factorized")
    fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in parts], FEATURES, "y", setting), "flat")
    ref = copy.deepcopy(fc)
    cols = [{f: xi[:, j] for j, f in enumerate(d.features)} for d, xi, _ in parts]
    got = [pooled_em_step(fc, cols) for _ in range(4)]
    want = [em_step(ref, pooled_columns(cols)) for _ in range(4)]
    np.testing.assert_allclose(got, want, atol=1e-9, rtol=0)
    assert got[-1] > got[0] + 1e-3
    allx = all_binary(len(FEATURES))
    assert np.abs(log_likelihood(fc, allx) - log_likelihood(ref, allx)).max() < 1e-9
    assert abs(np.exp(log_likelihood(fc, allx)).sum() - 1) < 1e-9
    # The leaf statistics survive the flat-vector round trip used on the wire.
    st = local_statistics(fc, cols[0])
    for s in st.leaves.values():
        back = stats_from_vector(s, stats_to_vector(s))
        assert np.array_equal(stats_to_vector(back), stats_to_vector(s))


def test_learner_without_em_statistics_is_a_clear_error():
    x = binary_table(60, seed=1)
    parts = split(x, "horizontal")
    b = OnePassBuilder(n_clusters=1, n_products=1, seed=0, learner="factorized")
    fc = build_single_process(b, [(d, xi) for d, xi, _ in parts], FEATURES, "y", "horizontal")
    fc.leaves[0].leaf.model = object()
    with pytest.raises(UserError, match=r"leaf node \d+ \(client 0.*no addable EM statistics"):
        check_em_supported(fc)


def test_em_support_of_a_received_model_is_asked_of_its_class_without_rebuilding_it():
    from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

    x = binary_table(60, seed=1)
    parts = split(x, "horizontal")
    b = OnePassBuilder(n_clusters=1, n_products=1, seed=0)
    fc = build_single_process(b, [(d, xi) for d, xi, _ in parts], FEATURES, "y", "horizontal")
    received = [model_from_bytes(model_to_bytes(n.leaf.model), lazy=True) for n in fc.leaves]
    for node, model in zip(fc.leaves, received):
        node.leaf.model = model
    check_em_supported(fc)
    assert all(m._model is None for m in received)  # answered from the class: nothing rebuilt
    fc.leaves[0].leaf.model = model_from_bytes(model_to_bytes(_a_tree_classifier()), lazy=True)
    with pytest.raises(UserError, match=r"leaf node \d+ \(client 0.*no addable EM statistics"):
        check_em_supported(fc)


def _a_tree_classifier():
    from mpifc.federated.fcdt import TreeClassifier

    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=(40, 3)), rng.integers(0, 2, 40)])
    return TreeClassifier.fit(x, target_index=3, n_classes=2, seed=0)


def _client_columns(shards_dir) -> list[dict[str, np.ndarray]]:
    m = load_manifest(shards_dir)
    out = []
    for i in range(m.n_clients):
        s = read_client(shards_dir, i)
        out.append({f: s.x_train[:, j] for j, f in enumerate(s.features)})
    return out


@pytest.mark.parametrize("setting,table,meta", [("horizontal", binary_table, "discrete"),
                                                 ("hybrid", real_table, "real")])
def test_distributed_pooled_em_equals_centralized(setting, table, meta, tmp_path):
    shards = write_shards(tmp_path / setting, setting, table(240, 7), table(30, 8), meta)
    n_clients = load_manifest(shards).n_clients
    initial = tmp_path / "initial.h5"
    iters = 3
    r, model, ledger, audit = train(n_clients + 1, shards, tmp_path, "--clusters", "2", "--refine", "em",
                                    "--em-iters", str(iters), "--em-initial-model", str(initial))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    fc0 = load_fc(initial)
    cols = pooled_columns(_client_columns(shards))
    ref = [em_step(fc0, cols) for _ in range(iters)]
    np.testing.assert_allclose(summary["em_train_ll"], ref, atol=1e-9, rtol=0)
    got = load_fc(model)
    probe = {f: v[:50] for f, v in cols.items()}
    assert np.abs(log_likelihood(got, probe) - log_likelihood(fc0, probe)).max() < 1e-9
    rows = read_ledger(ledger)
    # Closed form: one sum-statistics vector per client and iteration, 8 * (sum edges + 2) bytes.
    n_edges = sum(len(got.nodes[s].children) for s in sum_ids(got))
    sums = [x for x in rows if x["kind"] == "fc.em.sum_stats"]
    assert len(sums) == iters * n_clients
    assert sum(int(x["payload_bytes"]) for x in sums) == iters * n_clients * 8 * (n_edges + 2)
    # Leaf statistics: each client sends each other client owning leaves one bundle per iteration,
    # 8 bytes per statistic of each of that owner's leaves.
    st = local_statistics(fc0, {f: v[:2] for f, v in cols.items()})
    size = {nid: len(stats_to_vector(s)) for nid, s in st.leaves.items()}
    owners = {}
    for nid in size:
        owners.setdefault(fc0.nodes[nid].rank, []).append(nid)
    leaf_rows = [x for x in rows if x["kind"] == "fc.em.leaf_stats"]
    assert len(leaf_rows) == iters * len(owners) * (n_clients - 1)
    assert sum(int(x["payload_bytes"]) for x in leaf_rows) == \
        iters * (n_clients - 1) * 8 * sum(size.values())
    client_ranks = set(range(1, n_clients + 1))
    assert_ledger_declared(rows, client_ranks)
    assert_private(audit, client_ranks, cooccurrence=False, content=(meta == "real"))
