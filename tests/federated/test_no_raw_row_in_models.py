"""No leaf is learned from a single row: the model a client sends never holds one of its rows
(the audit's ``contains_raw_row``), where k-means isolates an outlier or a class has one row."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit.learnspn import learn_spn
from mpifc.circuit.splitting import MIN_LEAF_ROWS, absorb_small_clusters
from mpifc.federated.one_pass import ClientDeclaration, OnePassBuilder, cluster_rows, run_client_tasks
from mpifc.federated.wire_format import model_to_bytes


def _table(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(size=(40, 4)), rng.normal(size=(40, 4)) + 4.0])
    return np.concatenate([x, [[40.0, -35.0, 60.0, 25.0]]])  # one far outlier row


def _holds_a_row(blob: bytes, x: np.ndarray) -> bool:
    return any(row.tobytes() in blob for row in x)


def test_absorb_merges_singletons_into_the_nearest_cluster():
    feats = np.array([[0.0], [0.1], [5.0], [5.1], [9.0], [0.2]])
    labels = np.array([0, 0, 1, 1, 2, 0])
    out = absorb_small_clusters(feats, labels)
    assert out.tolist() == [0, 0, 1, 1, 1, 0]
    assert np.bincount(out).min() >= MIN_LEAF_ROWS
    assert absorb_small_clusters(feats, np.array([0, 0, 1, 1, 1, 0])).tolist() == [0, 0, 1, 1, 1, 0]
    assert absorb_small_clusters(feats[:1], np.array([0])).tolist() == [0]


@pytest.mark.parametrize("k", [2, 4])
def test_a_clients_sent_pcs_hold_no_raw_row(k):
    # a vertical client whose k-means puts the outlier in a cluster of its own: before, that
    # cluster's PC (one row, every leaf's mean one of its values) carried the row to the server
    x = _table(0)
    decls = [ClientDeclaration(c, (f"x{2 * c}", f"x{2 * c + 1}"), ("real", "real"), (0, 0), len(x), "ids")
             for c in range(2)]
    plan = OnePassBuilder(n_clusters=k, n_products=4, glue="random", seed=0).plan(decls, setting="vertical")
    for c in range(2):
        cols = x[:, 2 * c:2 * c + 2]
        report = run_client_tasks(plan, c, cols, decls[c].features)
        assert all(leaf.n_rows >= MIN_LEAF_ROWS for leaf in report.leaves)
        assert not any(_holds_a_row(model_to_bytes(leaf.model), cols) for leaf in report.leaves)


def test_a_class_of_one_row_learns_no_pc_of_its_own():
    x = _table(0)
    y = np.zeros(len(x))
    y[-1] = 1.0  # the outlier is its class's only row
    xy = np.column_stack([x, y])
    spn = learn_spn(xy, ["real"] * 4 + ["discrete"], threshold=0.3, min_instances_slice=5, seed=0,
                    class_column=4)
    assert not _holds_a_row(model_to_bytes(spn), x)
    assert not _holds_a_row(model_to_bytes(spn), xy)


def test_one_pass_clusters_have_two_rows_or_more():
    labels = cluster_rows(_table(0), 4, seed=0)
    assert np.bincount(labels).min() >= MIN_LEAF_ROWS
