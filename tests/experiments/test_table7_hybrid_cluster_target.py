"""Hybrid FC[PC] and the label owner's k-means without the target (paper.T7_CLUSTER_WITHOUT_TARGET):
the option acts only where one client's clustered private subspace holds the label."""
from __future__ import annotations

import numpy as np

from mpifc.experiments import paper
from mpifc.experiments.store import Cell
from mpifc.experiments.table7 import DATASETS, cell_config, label_owner
from mpifc.federated.one_pass import CLUSTER_WITHOUT_TARGET, ClientDeclaration, OnePassBuilder, cluster_columns, \
    ids_digest, run_client_tasks

SHARED = ("s1", "s2")
PRIVATE = (("a1", "a2"), ("b1", "b2"))
FEATS = SHARED + PRIVATE[0] + PRIVATE[1] + ("y",)


def hybrid_clients(label_everywhere: bool, n: int = 150):
    """Two hybrid clients with disjoint rows: shared s1, s2; private a*/b*; y with the shared block
    on every client (label_everywhere) or in client 0's private block only. y follows a1 weakly."""
    out = []
    for i, priv in enumerate(PRIVATE):
        rng = np.random.default_rng(10 + i)
        y = (rng.random(n) < 0.3).astype(np.float64)
        x = rng.normal(size=(n, 4)) + np.array([0.0, 0.0, 0.4, 0.0]) * y[:, None]
        feats = SHARED + priv
        if label_everywhere or i == 0:
            feats, x = feats + ("y",), np.column_stack([x, y])
        meta = tuple("discrete" if f == "y" else "real" for f in feats)
        cats = tuple(2 if f == "y" else 0 for f in feats)
        ids = np.arange(n, dtype=np.int64) + i * n
        out.append((ClientDeclaration(i, feats, meta, cats, n, ids_digest(ids)), x))
    return out


def fit(clients, on: bool):
    hp = {CLUSTER_WITHOUT_TARGET: True} if on else {}
    b = OnePassBuilder(n_clusters=2, glue="combinatorial", seed=3, learner="factorized", hyperparameters=hp)
    plan = b.plan([d for d, _ in clients], FEATS, "y", "hybrid")
    reps = [run_client_tasks(plan, d.index, x, d.features) for d, x in clients]
    return plan, reps


def test_label_everywhere_sits_in_the_unclustered_shared_block_so_the_option_is_a_no_op() -> None:
    clients = hybrid_clients(label_everywhere=True)
    (p_off, off), (p_on, on) = fit(clients, False), fit(clients, True)
    ytasks = [t for t in p_on.tasks if "y" in t.features]
    assert len(ytasks) == 2 and all(t.n_clusters == 0 for t in ytasks)  # one PC per client, never clustered
    for t in p_on.tasks:
        if t.n_clusters:  # the clustered (private) tasks do not hold y: same k-means input
            assert "y" not in t.features and cluster_columns(p_on, t) == cluster_columns(p_off, t)
    for a, b in zip(off, on):
        np.testing.assert_array_equal(a.cluster_ids, b.cluster_ids)
        assert [(lf.subspace, lf.cluster, lf.n_rows) for lf in a.leaves] == \
               [(lf.subspace, lf.cluster, lf.n_rows) for lf in b.leaves]


def test_single_label_owner_clusters_its_private_block_and_the_option_drops_y_there() -> None:
    clients = hybrid_clients(label_everywhere=False)
    p_on, on = fit(clients, True)
    (t,) = [t for t in p_on.tasks if "y" in t.features]
    assert t.client == 0 and t.n_clusters == 2 and set(t.features) == set(PRIVATE[0]) | {"y"}
    assert [t.features[j] for j in cluster_columns(p_on, t)] == [f for f in t.features if f != "y"]
    p_off, _ = fit(clients, False)  # Algorithm 1 as written: k-means sees the label too
    assert [t.features[j] for t in p_off.tasks if "y" in t.features for j in cluster_columns(p_off, t)] == \
           list(t.features)
    # the owner's cluster ids do not depend on y at all with the option on
    d0, x0 = clients[0]
    flipped = x0.copy()
    flipped[:, d0.features.index("y")] = 1 - flipped[:, d0.features.index("y")]
    again = run_client_tasks(p_on, 0, flipped, d0.features)
    np.testing.assert_array_equal(again.cluster_ids, on[0].cluster_ids)


def test_hybrid_option_only_where_one_client_holds_the_label() -> None:
    for ds in paper.T7_CLUSTER_WITHOUT_TARGET.get("hybrid", ()):
        owner = paper.T7_HYBRID_LABEL_OWNER.get(ds)
        assert isinstance(owner, int), f"{ds}: hybrid option on, but the label is on every client (a no-op)"
    for ds in DATASETS:
        for k in (2, 3):
            cell = Cell(ds, "hybrid", k, "fc-pc", 0)
            conf = cell_config(cell)
            assert conf["cluster_without_target"] is paper.classifier_cluster_without_target("hybrid", ds)
            assert conf["label_owner"] == ("default" if label_owner(cell) is None else label_owner(cell))
            # FC[DT] keeps the label everywhere and never records the option
            assert "cluster_without_target" not in cell_config(Cell(ds, "hybrid", k, "fc-dt", 0))
