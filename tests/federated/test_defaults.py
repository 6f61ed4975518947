"""The adaptive defaults (mpifc.federated.defaults): the rule per PC, explicit keys winning, K per
subspace, and the model's meta recording exactly what every client's learner was called with."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated import defaults as D
from mpifc.federated.one_pass import (
    ClientDeclaration,
    OnePassBuilder,
    build_single_process,
    leaf_hyperparameters,
    record_hyperparameters,
    run_client_tasks,
)


def test_binary_pcs_get_the_gtest_at_a_family_wise_level():
    # many rows: 5 % over each column's d - 1 tests
    hp = D.adaptive_hyperparameters("learnspn", 16181, ["discrete"] * 16, False)
    assert hp == {"col_split": "gtest", "gtest_pvalue": 0.05 / 15, "min_instances_slice": 50, "n_init": 2}
    # fewer rows: 5 % over all pairs
    assert D.adaptive_hyperparameters("learnspn", 1600, ["discrete"] * 180, False)["gtest_pvalue"] == 0.05 / 16110
    # categorical columns count as discrete; few rows: a quarter of them per slice
    small = D.adaptive_hyperparameters("learnspn", 60, ["categorical", "discrete", "discrete"], False)
    assert small["col_split"] == "gtest" and small["gtest_pvalue"] == 0.05 / 3 and small["min_instances_slice"] == 15
    assert D.gtest_pvalue(1) == 0.05 and D.gtest_pvalue(180) == 0.05 / (180 * 179 // 2)
    assert D.gtest_pvalue(180, 1999) == 0.05 / (180 * 179 // 2) and D.gtest_pvalue(180, 2000) == 0.05 / 179
    assert D.gtest_pvalue(1, 10**6) == 0.05


@pytest.mark.parametrize("n,mis", [(40, 10), (91, 10), (455, 46), (999, 100), (16000, 100)])
def test_pcs_with_a_real_column_get_the_rdc_and_a_tenth_of_their_rows(n, mis):
    hp = D.adaptive_hyperparameters("learnspn", n, ["real", "discrete"], False)
    assert hp == {"col_split": "rdc", "threshold": 0.3, "min_instances_slice": mis, "leaf": "mixed", "alpha": 0.01}


def test_the_target_holder_chooses_between_the_class_split_and_the_joint_model():
    hp = D.adaptive_hyperparameters("learnspn", 91, ["real", "discrete"], True)
    assert hp["target_first"] == "auto"
    assert "target_first" not in D.adaptive_hyperparameters("learnspn", 91, ["real", "discrete"], False)
    split, joint = D.target_candidates(hp)
    assert split == {**hp, "target_first": True}
    assert joint == {**hp, "target_first": False, "leaf": "auto"}
    # a user-set leaf stays in both; a user-set target_first leaves nothing to choose
    assert [c["leaf"] for c in D.target_candidates({**hp, "leaf": "histogram"}, {"leaf": "histogram"})] == \
        ["histogram", "histogram"]
    fixed = D.adaptive_hyperparameters("learnspn", 91, ["real"], True, {"target_first": 1})
    assert D.target_candidates(fixed, {"target_first": 1}) == [fixed]


def test_explicit_keys_win_and_steer_the_column_split():
    # a threshold is an RDC setting: binary columns keep the RDC, the rest adapts around it
    hp = D.adaptive_hyperparameters("learnspn", 1000, ["discrete"] * 4, False, {"threshold": 0.4})
    assert hp["col_split"] == "rdc" and hp["threshold"] == 0.4 and hp["min_instances_slice"] == 100
    hp = D.adaptive_hyperparameters("learnspn", 1000, ["real"] * 4, False, {"gtest_pvalue": 0.01})
    assert hp["col_split"] == "gtest" and hp["gtest_pvalue"] == 0.01
    every = {"threshold": 0.4, "min_instances_slice": 30, "leaf": "auto", "alpha": 1.0, "target_first": 0,
             "col_split": "rdc"}
    assert D.adaptive_hyperparameters("learnspn", 91, ["real"] * 3, True, every) == every


def test_other_learners_keep_their_own_defaults():
    for learner in ("factorized", "ratspn", "einet", "dt"):
        assert D.adaptive_hyperparameters(learner, 50, ["real"], True, {"em_iters": 3}) == {"em_iters": 3}


def test_default_clusters():
    assert D.default_clusters(1, 1, False) == 1  # central: one LearnSPN
    assert D.default_clusters(2, 2, True) == 1  # the label owner's subspace
    assert D.default_clusters(2, 2, False) == 2
    assert D.default_clusters(3, 4, False) == 2


def _vertical(n: int = 120, seed: int = 0) -> list[tuple[ClientDeclaration, np.ndarray]]:
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    a = np.column_stack([z + rng.normal(0, 0.3, n), rng.normal(size=n), z]).astype(float)  # owner: y last
    b = np.column_stack([z + rng.normal(0, 0.3, n), rng.normal(size=n)])
    return [(ClientDeclaration(0, ("a0", "a1", "y"), ("real", "real", "discrete"), (0, 0, 2), n, "i"), a),
            (ClientDeclaration(1, ("b0", "b1"), ("real", "real"), (0, 0), n, "i"), b)]


def _plan(builder: OnePassBuilder, shards, setting="vertical"):
    return builder.plan([d for d, _ in shards], ["a0", "a1", "y", "b0", "b1"], "y", setting)


def test_plan_k_per_subspace_and_explicit_k_wins():
    shards = _vertical()
    plan = _plan(OnePassBuilder(n_clusters=None), shards)
    assert {t.client: t.n_clusters for t in plan.tasks} == {0: 1, 1: 2} and plan.n_clusters == 2
    plan = _plan(OnePassBuilder(n_clusters=3, n_products=4), shards)
    assert {t.n_clusters for t in plan.tasks} == {3}
    plan = _plan(OnePassBuilder(n_clusters=None, defaults="learner"), shards)
    assert {t.n_clusters for t in plan.tasks} == {2}
    with pytest.raises(UserError, match="unknown defaults"):
        OnePassBuilder(defaults="fast")


def test_leaf_hyperparameters_turn_target_first_into_the_class_column():
    shards = _vertical()
    plan = _plan(OnePassBuilder(n_clusters=None, hyperparameters={"alpha": 0.5}), shards)
    owner = plan.tasks_for(0)[0]
    hp = leaf_hyperparameters(plan, owner, 120)
    assert hp["class_column"] == 2 and "target_first" not in hp and hp["alpha"] == 0.5
    assert "class_column" not in leaf_hyperparameters(plan, plan.tasks_for(1)[0], 60)
    off = _plan(OnePassBuilder(n_clusters=None, hyperparameters={"target_first": "0"}), shards)
    assert "class_column" not in leaf_hyperparameters(off, off.tasks_for(0)[0], 120)
    learner = _plan(OnePassBuilder(n_clusters=None, defaults="learner", hyperparameters={"alpha": 0.5}), shards)
    assert leaf_hyperparameters(learner, learner.tasks_for(0)[0], 120) == {"alpha": 0.5}


def test_the_meta_records_what_each_client_fitted_with():
    """Every PC's final fit is recorded with the model (``fit_record``), travels through the wire
    format and the model file, and ends up in ``meta["hyperparameters"]`` exactly as the
    learner was called; the label owner's PC records its choice between two candidates."""
    from mpifc.federated.learners import fit_leaf
    from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

    shards = _vertical(200)
    builder = OnePassBuilder(n_clusters=None, hyperparameters={"threshold": 0.35})
    plan = _plan(builder, shards)
    calls: dict[int, dict] = {}

    def fit(learner, x, meta, seed, n_categories=None, **hp):
        model = fit_leaf(learner, x, meta, seed, n_categories=n_categories, **hp)
        # var_min_var is data (the client's tie floors), not a setting: the record leaves it out
        calls[id(model)] = (len(x), {k: v for k, v in hp.items() if k != "var_min_var"})
        return model

    reports = [run_client_tasks(plan, d.index, x, d.features, fit=fit) for d, x in shards]
    final = {(r.client, leaf.subspace, leaf.cluster): calls[id(leaf.model)] for r in reports for leaf in r.leaves}
    for r in reports:  # as the server holds them: decoded wire blobs
        for leaf in r.leaves:
            leaf.model = model_from_bytes(model_to_bytes(leaf.model), lazy=True)
    fc = record_hyperparameters(builder.assemble(plan, reports), plan)
    rows = {(int(c), r["subspace"], r["cluster"]): r for c, pcs in fc.meta["hyperparameters"].items() for r in pcs}
    assert set(rows) == set(final) and len(rows) == 3  # the owner's one PC, client 1's two clusters
    for key, (n, hp) in final.items():
        assert rows[key]["hyperparameters"] == hp and rows[key]["n_rows"] == n
        assert hp["threshold"] == 0.35 and hp["col_split"] == "rdc"
    choice = rows[(0, 0, 0)]["choice"]
    assert choice["on"] == "held-out training rows" and choice["rows"] == 40
    assert choice["candidates"] == ["class_split", "joint"]
    assert choice["chosen"] == choice["candidates"][int(np.argmax(choice["macro_f1"]))]
    assert ("class_column" in rows[(0, 0, 0)]["hyperparameters"]) == (choice["chosen"] == "class_split")
    assert all("choice" not in rows[(1, 1, k)] for k in (0, 1))
    again = build_single_process(builder, shards, ["a0", "a1", "y", "b0", "b1"], "y", "vertical")
    assert again.meta["hyperparameters"] == fc.meta["hyperparameters"]


def test_fit_records_survive_the_model_file(tmp_path):
    from mpifc.federated.assign import assign_flat
    from mpifc.federated.serialize import load_fc, save_fc

    builder = OnePassBuilder(n_clusters=None)
    fc = build_single_process(builder, _vertical(120), ["a0", "a1", "y", "b0", "b1"], "y", "vertical")
    assign_flat(fc)  # ψ as a job sets it: inner nodes on the server
    save_fc(fc, tmp_path / "m.h5")
    back = load_fc(tmp_path / "m.h5")
    assert back.meta["hyperparameters"] == fc.meta["hyperparameters"]
    assert any("choice" in pc for pcs in fc.meta["hyperparameters"].values() for pc in pcs)
    back.meta.pop("hyperparameters")
    plan = _plan(builder, _vertical(120))
    assert record_hyperparameters(back, plan).meta["hyperparameters"] == fc.meta["hyperparameters"]


def test_central_learns_one_pc_and_says_so():
    """Unlabelled data (no target to keep together): K = 1 because there is one client."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2, (150, 3)).astype(float)
    decl = ClientDeclaration(0, ("a", "b", "c"), ("discrete",) * 3, (2, 2, 2), 150, "i")
    fc = build_single_process(OnePassBuilder(n_clusters=None), [(decl, x)], ["a", "b", "c"], None, "central")
    assert len(fc.leaves) == 1 and "K = 1" in fc.meta["central"]
    fc2 = build_single_process(OnePassBuilder(n_clusters=2), [(decl, x)], ["a", "b", "c"], None, "central")
    assert len(fc2.leaves) == 2 and "K = 2" in fc2.meta["central"]


def test_the_pool_of_rare_classes_is_cut_into_clusters_of_ten_rows():
    # 60 classes of 4 rows each on one client (every one below the k-rows rule's five: all
    # pooled), around a centre per class: the pool's row clusters go down to POOL_MIN_SLICE rows
    # (where a tenth of 240 rows would stop at 24), it records so, and its class probabilities
    # are sharper for it than with the RDC's own slice
    from mpifc.circuit.graph import LeafNode, SumNode
    from mpifc.federated.evaluate import predict

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(60), 4)
    x = np.column_stack([rng.normal(size=(60, 2))[y] * 4 + rng.normal(0, 0.3, (240, 2)), y]).astype(float)
    shards = [(ClientDeclaration(0, ("a0", "a1", "y"), ("real", "real", "discrete"), (0, 0, 60), 240, "i"), x)]

    def built(hp):
        fc = build_single_process(OnePassBuilder(n_clusters=None, glue="class", hyperparameters=hp), shards,
                                  ["a0", "a1", "y"], target="y", setting="horizontal")
        (pool,) = [n.leaf for n in fc.leaves if n.leaf.cluster == 60]
        assert pool.n_rows == 240
        return fc, pool

    fc, pool = built({})
    (rec,) = [r for r in fc.meta["hyperparameters"]["0"] if r["cluster"] == 60]
    assert rec["hyperparameters"]["min_instances_slice"] == D.POOL_MIN_SLICE == 10

    def clusters(g):  # the pool's leaves' slices: products under the sums
        return 0 if isinstance(g, LeafNode) else (sum(clusters(c) for c in g.children)
                                                  + (len(g.children) if isinstance(g, SumNode) else 0))

    coarse_fc, coarse = built({"min_instances_slice": 24})
    assert clusters(pool.model.root) > clusters(coarse.model.root)
    cols = {"a0": x[:, 0], "a1": x[:, 1], "y": np.full(240, np.nan)}
    assert np.mean(predict(fc, cols) == y) > np.mean(predict(coarse_fc, cols) == y)
