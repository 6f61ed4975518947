"""No leaf is learned from fewer than k = 5 rows (MIN_LEAF_ROWS): the model a client sends never
holds one of its rows (the audit's ``contains_raw_row``), where k-means isolates an outlier or a
class has a handful of rows.
"""
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


def test_absorb_merges_clusters_of_fewer_than_k_rows_into_the_nearest_one():
    feats = np.array([[0.0], [0.1], [0.2], [0.3], [0.4], [5.0], [5.1], [5.2], [5.3], [5.4], [9.0], [0.5], [6.0]])
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 0, 3])
    out = absorb_small_clusters(feats, labels)
    assert out.tolist() == [0] * 5 + [1] * 5 + [1, 0, 1]
    assert np.bincount(out).min() >= MIN_LEAF_ROWS == 5
    assert absorb_small_clusters(feats[:10], labels[:10]).tolist() == labels[:10].tolist()
    assert absorb_small_clusters(feats[:7], np.array([0, 0, 0, 1, 1, 1, 1])).tolist() == [0] * 7  # none has k


@pytest.mark.parametrize("k", [2, 4])
def test_a_clients_sent_pcs_hold_no_raw_row(k):
    # a vertical client whose k-means puts the outlier in a cluster of its own: that cluster's PC
    # (one row, every leaf's mean one of its values) would carry the row to the server
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


def test_one_pass_clusters_have_k_rows_or_more():
    labels = cluster_rows(_table(0), 4, seed=0)
    assert np.bincount(labels).min() >= MIN_LEAF_ROWS
