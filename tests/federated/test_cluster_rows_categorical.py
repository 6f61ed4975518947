"""Algorithm 1's k-means (one_pass.cluster_rows) sees a categorical column one-hot: its clusters
do not depend on how the categories are numbered."""
from __future__ import annotations

import numpy as np

from mpifc.federated.one_pass import ClientDeclaration, OnePassBuilder, cluster_rows, ids_digest, run_client_tasks

CATS = 6


def table(n: int = 300, seed: int = 0) -> np.ndarray:
    """A categorical column of :data:`CATS` categories and a real column that depends on it."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, CATS, n)
    return np.column_stack([c, rng.normal(size=n) + (c % 2)]).astype(np.float64)


def renumbered(x: np.ndarray) -> np.ndarray:
    """``x`` with the categories of its first column numbered in another order."""
    out = x.copy()
    out[:, 0] = np.array([3, 0, 5, 1, 4, 2])[x[:, 0].astype(np.int64)]
    return out


def test_clusters_ignore_the_numbering_of_categories():
    x = table()
    for k in (2, 4):
        on = cluster_rows(x, k, 7, cards=[CATS, 0])
        assert len(np.unique(on)) == k
        np.testing.assert_array_equal(cluster_rows(renumbered(x), k, 7, cards=[CATS, 0]), on)
    # the codes as numbers (no cards) give other clusters once renumbered: the property is the encoding's
    assert any(not np.array_equal(cluster_rows(renumbered(x), k, 7), cluster_rows(x, k, 7)) for k in (2, 4))


def test_the_clustered_client_encodes_its_categorical_columns_one_hot():
    x = table()
    n = len(x)
    rng = np.random.default_rng(1)
    owner = np.column_stack([rng.normal(size=n), rng.integers(0, 2, n)]).astype(np.float64)
    ids = ids_digest(np.arange(n, dtype=np.int64))

    def ids_of(other: np.ndarray) -> tuple[np.ndarray, int]:
        decls = [ClientDeclaration(0, ("a", "y"), ("real", "discrete"), (0, 2), n, ids),
                 ClientDeclaration(1, ("c", "d"), ("categorical", "real"), (CATS, 0), n, ids)]
        # the learner's defaults: one clustering of both columns (the adaptive defaults cluster
        # each column on its own, one_pass.OnePassBuilder.group_subspaces)
        plan = OnePassBuilder(n_clusters=3, glue="class", seed=4, learner="factorized", defaults="learner").plan(
            decls, ["a", "y", "c", "d"], "y", "vertical")
        task = [t for t in plan.tasks_for(1) if t.n_clusters > 0][0]
        return run_client_tasks(plan, 1, other, ("c", "d")).cluster_ids, task.seed

    got, seed = ids_of(x)
    np.testing.assert_array_equal(got, cluster_rows(x, 3, seed, cards=[CATS, 0]))
    np.testing.assert_array_equal(ids_of(renumbered(x))[0], got)
