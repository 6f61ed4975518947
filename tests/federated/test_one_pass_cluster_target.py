"""The label owner's k-means without the target (one_pass.CLUSTER_WITHOUT_TARGET), in one process."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated.assign import assign, client_rank_map
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import (
    CLUSTER_WITHOUT_TARGET,
    ClientDeclaration,
    OnePassBuilder,
    cluster_rows,
    ids_digest,
)
from mpifc.federated.one_pass import run_client_tasks as run_tasks

FEATS = ("a", "b", "y", "c", "d")
# client 0 (the label owner) holds a, b and the target y; client 1 holds c, d; client 2 holds y only
# in the target-only layout.
OWNER = ("a", "b", "y")


def table(n=240, seed=0):
    """Real a,b,c,d, binary y. a,b are three weakly separated blobs that y does not follow, so
    with y in the k-means input (scaled like the others, but two points apart) k-means splits by y."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.5).astype(np.float64)
    blob = rng.integers(0, 3, n)
    a = blob * 0.6 + rng.normal(size=n)
    b = -blob * 0.6 + rng.normal(size=n)
    c = a + rng.normal(size=n) + y
    d = rng.normal(size=n)
    return np.stack([a, b, y, c, d], axis=1)


def shards(x, layout):
    ids = np.arange(len(x), dtype=np.int64)
    out = []
    for i, feats in enumerate(layout):
        cols = [FEATS.index(f) for f in feats]
        meta = tuple("discrete" if f == "y" else "real" for f in feats)
        cats = tuple(2 if f == "y" else 0 for f in feats)
        out.append((ClientDeclaration(i, tuple(feats), meta, cats, len(x), ids_digest(ids)), x[:, cols]))
    return out


def plan_for(sh, on, k=2, seed=4, learner="factorized", glue="cooccurrence", **hp):
    if on is not None:
        hp[CLUSTER_WITHOUT_TARGET] = on
    b = OnePassBuilder(n_clusters=k, glue=glue, seed=seed, learner=learner, hyperparameters=hp)
    return b, b.plan([d for d, _ in sh], FEATS, "y", "vertical")


def owner_ids(x, on, k=2, seed=4):
    sh = shards(x, [OWNER, ("c", "d")])
    _, plan = plan_for(sh, on, k, seed)
    return run_tasks(plan, 0, sh[0][1], sh[0][0].features).cluster_ids


def test_cluster_ids_ignore_the_target_only_with_the_option():
    x = table()
    rng = np.random.default_rng(1)
    flipped, permuted = x.copy(), x.copy()
    flipped[:, 2] = 1 - x[:, 2]
    permuted[:, 2] = rng.permutation(x[:, 2])
    for k in (2, 3):
        on = owner_ids(x, True, k)
        assert len(np.unique(on)) == k
        np.testing.assert_array_equal(owner_ids(flipped, True, k), on)
        np.testing.assert_array_equal(owner_ids(permuted, True, k), on)
        # exactly k-means on the subspace without y, with the task's seed
        sh = shards(x, [OWNER, ("c", "d")])
        _, plan = plan_for(sh, True, k)
        t = plan.tasks_for(0)[0]
        np.testing.assert_array_equal(on, cluster_rows(x[:, [0, 1]], k, t.seed))
        # off (absent or false): unchanged, k-means over every subspace column, y included
        off = owner_ids(x, None, k)
        np.testing.assert_array_equal(off, cluster_rows(x[:, [0, 1, 2]], k, t.seed))
        np.testing.assert_array_equal(owner_ids(x, False, k), off)
    # with y in the input the K=2 split follows the label (a "label cluster"), so permuting y moves it
    off = owner_ids(x, None, 2)
    assert {tuple(np.unique(x[off == j, 2])) for j in (0, 1)} == {(0.0,), (1.0,)}
    assert not np.array_equal(owner_ids(permuted, None, 2), off)


def test_cluster_pcs_still_model_the_target_and_learners_never_see_the_option():
    x = table()
    sh = shards(x, [OWNER, ("c", "d")])
    _, plan = plan_for(sh, True, 3, threshold=0.3)
    calls = []

    def fit(learner, xs, meta, seed, n_categories=None, **hp):
        floors = hp.pop("var_min_var")  # the client's tie floors: data, one per column
        assert len(floors) == xs.shape[1]
        calls.append((xs.shape[1], list(meta), dict(hp)))
        return None

    rep = run_tasks(plan, 0, sh[0][1], sh[0][0].features, fit=fit)
    assert len(rep.leaves) == 3 and sum(r.n_rows for r in rep.leaves) == len(x)
    assert all(r.features == OWNER for r in rep.leaves)
    assert calls == [(3, ["real", "real", "discrete"], {"threshold": 0.3})] * 3


def test_target_only_subspace_is_one_cluster_and_model_sums_to_one():
    x = table(160)
    x[:, :2] = np.round(x[:, :2] > 0)  # binary a, b so the joint can be enumerated
    x[:, 3:] = np.round(x[:, 3:] > 0)
    sh = [(ClientDeclaration(d.index, d.features, ("discrete",) * len(d.features), (2,) * len(d.features),
                             d.n_rows, d.ids_digest), xi)
          for d, xi in shards(x, [("a", "b"), ("c", "d"), ("y",)])]
    for glue in ("combinatorial", "cooccurrence"):
        b, plan = plan_for(sh, True, 2, glue=glue)
        reps = [run_tasks(plan, d.index, xi, d.features) for d, xi in sh]
        assert reps[2].cluster_ids.tolist() == [0] * len(x) and len(reps[2].leaves) == 1
        fc = b.assemble(plan, reps)
        assign(fc, "flat")
        fc.validate(require_models=True)
        grid = np.array(np.meshgrid(*[[0.0, 1.0]] * 5, indexing="ij")).reshape(5, -1).T
        assert abs(np.exp(log_likelihood(fc, grid)).sum() - 1.0) < 1e-9


def test_same_seed_same_model_whatever_the_rank_placement_with_the_option():
    x = table()
    sh = shards(x, [OWNER, ("c", "d")])
    lls = []
    for order, ranks in (([0, 1], client_rank_map([0, 1], 0)), ([1, 0], {0: 2, 1: 1})):
        b, plan = plan_for([sh[i] for i in order], True, 3, seed=9)
        reps = [run_tasks(plan, sh[i][0].index, sh[i][1], sh[i][0].features) for i in order]
        fc = b.assemble(plan, reps, ranks)
        assign(fc, "flat")
        lls.append(log_likelihood(fc, x))
    np.testing.assert_array_equal(lls[0], lls[1])
    assert np.isfinite(lls[0]).all()


def test_bad_values_and_no_target_are_user_errors():
    x = table(60)
    sh = shards(x, [OWNER, ("c", "d")])
    _, plan = plan_for(sh, "maybe")
    with pytest.raises(UserError, match="cluster_without_target"):
        run_tasks(plan, 0, sh[0][1], sh[0][0].features)
    for v, want in (("1", True), ("true", True), (1, True), ("0", False), (0, False)):
        _, plan = plan_for(sh, v)
        ids = run_tasks(plan, 0, sh[0][1], sh[0][0].features).cluster_ids
        np.testing.assert_array_equal(ids, owner_ids(x, want))
    b = OnePassBuilder(n_clusters=2, glue="combinatorial", learner="factorized",
                       hyperparameters={CLUSTER_WITHOUT_TARGET: True})
    plan = b.plan([d for d, _ in sh], FEATS, None, "vertical")
    with pytest.raises(UserError, match="no target"):
        run_tasks(plan, 0, sh[0][1], sh[0][0].features)


def test_fc_job_flag_sets_the_plan_option():
    from mpifc.cli.train import add_fedpc_train_arguments as add_train_arguments, train_config

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    on = train_config(p.parse_args(["d", "--model", "m.h5", "--cluster-without-target"]))
    off = train_config(p.parse_args(["d", "--model", "m.h5"]))
    assert on["hyperparameters"] == {CLUSTER_WITHOUT_TARGET: True}
    assert off["hyperparameters"] == {}  # default: nothing added, so existing runs keep their config
