"""Algorithm 1 in one process: plan, glue modes, weights, collapse, validation, ψ."""
from __future__ import annotations


import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated.assign import assign, client_rank_map
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import (
    ClientDeclaration,
    ClientReport,
    LeafReport,
    OnePassBuilder,
    build_single_process,
    ids_digest,
    run_client_tasks,
)
from mpifc.federated.structure import LEAF, PRODUCT, SUM

from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


def decl(i, feats, n=10, digest="x", meta="discrete"):
    return ClientDeclaration(i, tuple(feats), (meta,) * len(feats), (2,) * len(feats), n, digest)


def fake_reports(plan, rows_per_cluster):
    """Model-less reports: every single-owner task gets ``rows_per_cluster[client]`` clusters."""
    reps = []
    for c in sorted(plan.declarations):
        leaves = []
        for t in plan.tasks_for(c):
            if t.n_clusters == 0:
                leaves.append(LeafReport(c, t.subspace, -1, plan.declarations[c].n_rows, "f", t.features))
            else:
                for k, n in enumerate(rows_per_cluster[c]):
                    leaves.append(LeafReport(c, t.subspace, k, n, "f", t.features))
        reps.append(ClientReport(c, leaves))
    return reps


def test_fig2_subspaces_and_structure():
    # Fig. 2 layout: X1,X2 on clients 0 and 1; X3 only on 0; X4 only on 1; X5 only on 2.
    decls = [decl(0, ["X1", "X2", "X3"], 30), decl(1, ["X1", "X2", "X4"], 50), decl(2, ["X5"], 40)]
    b = OnePassBuilder(n_clusters=2, n_products=4, glue="random", seed=3)
    plan = b.plan(decls)
    m = plan.indicator_matrix
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 1]]
    subs = {s.features: s.owners for s in plan.subspaces}
    assert subs == {("X1", "X2"): (0, 1), ("X3",): (0,), ("X4",): (1,), ("X5",): (2,)}
    shared_tasks = [t for t in plan.tasks if t.n_clusters == 0]
    assert {(t.client, t.features) for t in shared_tasks} == {(0, ("X1", "X2")), (1, ("X1", "X2"))}
    fc = b.assemble(plan, fake_reports(plan, {0: [20, 10], 1: [35, 15], 2: [25, 15]}))
    assign(fc, "flat")
    root = fc.nodes[fc.root]
    assert root.op == SUM and abs(root.weights.sum() - 1) < 1e-12
    prods = [fc.nodes[c] for c in root.children]
    assert all(p.op == PRODUCT and p.scope == frozenset(plan.features) for p in prods)
    sums = [n for n in fc.nodes if n.op == SUM and n.id != fc.root]
    assert len(sums) == 1 and all(sums[0].id in p.children for p in prods)
    np.testing.assert_allclose(sums[0].weights, [30 / 80, 50 / 80])
    cluster_leaves = {n.id for n in fc.leaves if n.leaf.cluster >= 0}
    used = {c for p in prods for c in p.children}
    assert cluster_leaves <= used  # every cluster-PC is a child of at least one product
    # ρ rule: ρ(product) = ρ(sum) + Σ ρ(cluster leaves); weights ∝ ρ.
    rho = np.array([sum(fc.nodes[c].leaf.n_rows if fc.nodes[c].op == LEAF else 80 for c in p.children)
                    for p in prods], dtype=float)
    mult = np.array([1.0] * len(prods))
    np.testing.assert_allclose(root.weights / root.weights.sum(), rho * mult / (rho * mult).sum())


def test_horizontal_collapses_to_one_sum():
    decls = [decl(0, FEATURES, 10), decl(1, FEATURES, 30), decl(2, FEATURES, 60)]
    b = OnePassBuilder(n_clusters=3, n_products=5)
    plan = b.plan(decls)
    assert len(plan.subspaces) == 1 and plan.subspaces[0].owners == (0, 1, 2)
    fc = b.assemble(plan, fake_reports(plan, {}))
    assert len(fc.nodes) == 4
    root = fc.nodes[fc.root]
    assert root.op == SUM and all(fc.nodes[c].op == LEAF for c in root.children)
    np.testing.assert_allclose(root.weights, [0.1, 0.3, 0.6])


def test_single_client_single_cluster_is_just_the_leaf():
    b = OnePassBuilder(n_clusters=1, n_products=1)
    plan = b.plan([decl(0, FEATURES, 10)])
    fc = b.assemble(plan, fake_reports(plan, {0: [10]}))
    assert len(fc.nodes) == 1 and fc.nodes[fc.root].op == LEAF


def test_combinatorial_weights_are_products_of_fractions():
    decls = [decl(0, ["a"], 100, "s"), decl(1, ["b"], 100, "s")]
    b = OnePassBuilder(n_clusters=2, glue="combinatorial")
    plan = b.plan(decls, setting="vertical")
    fc = b.assemble(plan, fake_reports(plan, {0: [25, 75], 1: [40, 60]}))
    root = fc.nodes[fc.root]
    assert len(root.children) == 4
    got = {}
    for p, w in zip(root.children, root.weights):
        ks = tuple(fc.nodes[c].leaf.cluster for c in sorted(fc.nodes[p].children,
                                                           key=lambda c: fc.nodes[c].leaf.client))
        got[ks] = w
    expect = {(i, j): [0.25, 0.75][i] * [0.4, 0.6][j] for i in range(2) for j in range(2)}
    for k in expect:
        assert abs(got[k] - expect[k]) < 1e-12


def test_cooccurrence_weights_are_joint_frequencies():
    decls = [decl(0, ["a"], 6, "s"), decl(1, ["b"], 6, "s")]
    b = OnePassBuilder(n_clusters=2, glue="cooccurrence")
    plan = b.plan(decls, setting="vertical")
    reps = fake_reports(plan, {0: [3, 3], 1: [4, 2]})
    reps[0].cluster_ids = np.array([0, 0, 0, 1, 1, 1])
    reps[1].cluster_ids = np.array([0, 0, 1, 0, 0, 1])
    fc = b.assemble(plan, reps)
    root = fc.nodes[fc.root]
    combos = {}
    for p, w in zip(root.children, root.weights):
        ch = sorted(fc.nodes[p].children, key=lambda c: fc.nodes[c].leaf.client)
        combos[tuple(fc.nodes[c].leaf.cluster for c in ch)] = w
    assert combos == pytest.approx({(0, 0): 2 / 6, (0, 1): 1 / 6, (1, 0): 2 / 6, (1, 1): 1 / 6})


# cooccurrence needs aligned single-owner clients: only the vertical layout has them.
@pytest.mark.parametrize("setting,glue", [(s, g) for s in ("horizontal", "vertical", "hybrid")
                                          for g in ("random", "combinatorial")] + [("vertical", "cooccurrence")])
def test_fedpc_sums_to_one_by_enumeration(setting, glue):
    x = binary_table(300, seed=1)
    shards = split(x, setting)
    b = OnePassBuilder(n_clusters=2, n_products=3, glue=glue, seed=5, learner="factorized")
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", setting)
    assign(fc, "flat")
    fc.validate(require_models=True)
    total = np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum()
    assert abs(total - 1.0) < 1e-9


def test_fedpc_with_learnspn_sums_to_one():
    pytest.importorskip("mpifc.circuit.learnspn")
    x = binary_table(300, seed=2)
    shards = split(x, "hybrid")
    b = OnePassBuilder(n_clusters=2, n_products=3, seed=1, learner="learnspn",
                       hyperparameters={"min_instances_slice": 50, "threshold": 0.3})
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "hybrid")
    assign(fc, "flat")
    total = np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum()
    assert abs(total - 1.0) < 1e-9


def test_same_seed_same_model_whatever_the_rank_placement():
    x = binary_table(200, seed=3)
    shards = split(x, "vertical")
    lls = []
    for order in ([0, 1, 2], [2, 0, 1]):
        b = OnePassBuilder(n_clusters=2, n_products=3, seed=9, learner="factorized")
        plan = b.plan([shards[i][0] for i in order], FEATURES, "y", "vertical")
        reps = [run_client_tasks(plan, shards[i][0].index, shards[i][1], shards[i][0].features) for i in order]
        ranks = client_rank_map([0, 1, 2], 0) if order[0] == 0 else {0: 3, 1: 1, 2: 2}
        fc = b.assemble(plan, reps, ranks)
        assign(fc, "flat")
        lls.append(log_likelihood(fc, x))
    np.testing.assert_array_equal(lls[0], lls[1])
    b2 = OnePassBuilder(n_clusters=2, n_products=3, seed=10, learner="factorized")
    fc2 = build_single_process(b2, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "vertical")
    assert not np.array_equal(log_likelihood(fc2, x), lls[0])


def test_tree_assignment_same_distribution_small_root_fan_in():
    x = binary_table(300, seed=4)
    ids = np.arange(300)
    shards = [(decl(i, FEATURES, 30, ids_digest(ids)), x[i::10]) for i in range(10)]
    shards = [(ClientDeclaration(d.index, d.features, d.meta_types, d.n_categories, len(xi)), xi)
              for d, xi in shards]
    b = OnePassBuilder(learner="factorized")
    flat = assign(build_single_process(b, shards, FEATURES), "flat")
    tree = assign(build_single_process(b, shards, FEATURES, client_ranks=client_rank_map(range(10), 3)),
                  "tree", n_servers=3)
    assert abs(np.exp(log_likelihood(tree, all_binary(5))).sum() - 1) < 1e-9
    np.testing.assert_allclose(log_likelihood(tree, x), log_likelihood(flat, x), atol=1e-12)
    root = tree.nodes[tree.root]
    assert tree.nodes[tree.root].rank == 0 and len(root.children) == 3
    assert sorted(tree.nodes[c].rank for c in root.children) == [1, 2, 3]
    assert {r for (r, d) in tree.rank_edges() if d == 0} == {1, 2, 3}


def test_tree_assignment_hybrid_rank_graph_acyclic():
    x = binary_table(300, seed=6)
    shards = split(x, "hybrid")
    b = OnePassBuilder(n_clusters=3, n_products=6, learner="factorized")
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES,
                              client_ranks=client_rank_map([0, 1], 2))
    ll_flat = log_likelihood(fc, x)
    assign(fc, "tree", n_servers=2)  # validate() inside checks the rank graph is acyclic
    order = fc.rank_order()
    assert order[-1] == 0 and set(order) == set(fc.ranks())
    np.testing.assert_allclose(log_likelihood(fc, x), ll_flat, atol=1e-12)


def test_conflicting_meta_types_name_both_clients():
    decls = [decl(0, ["a", "b"]), decl(1, ["b"], meta="real")]
    with pytest.raises(UserError, match=r"'b'.*client 0.*'discrete'.*client 1.*'real'"):
        OnePassBuilder().plan(decls)


def test_zero_rows_names_client():
    with pytest.raises(UserError, match="client 1 has zero training rows"):
        OnePassBuilder().plan([decl(0, ["a"], 5), decl(1, ["b"], 0)])


def test_unaligned_vertical_ids():
    d0 = decl(0, ["a"], 5, ids_digest(np.arange(5)))
    d1 = decl(1, ["b"], 5, ids_digest(np.arange(5)[::-1]))
    with pytest.raises(UserError, match="aligned sample ids.*client 1.*client 0"):
        OnePassBuilder().plan([d0, d1], setting="vertical")


def test_cooccurrence_rejects_horizontal_and_random_needs_enough_products():
    with pytest.raises(UserError, match="cooccurrence"):
        OnePassBuilder(glue="cooccurrence").plan([decl(0, ["a"]), decl(1, ["a"])], setting="horizontal")
    with pytest.raises(UserError, match="--products 2 < --clusters 3"):
        OnePassBuilder(n_clusters=3, n_products=2).plan([decl(0, ["a"]), decl(1, ["b"])])


def test_leaf_away_from_its_data_is_rejected():
    x = binary_table(100)
    shards = split(x, "vertical")
    fc = build_single_process(OnePassBuilder(n_clusters=1, n_products=1, learner="factorized"),
                              [(d, xi) for d, xi, _ in shards], FEATURES)
    assign(fc, "flat")
    leaf = fc.leaves[0]
    leaf.rank = 0
    with pytest.raises(UserError, match=rf"leaf node {leaf.id} \(client {leaf.leaf.client}\) is placed on rank 0"):
        fc.validate()


def test_validation_names_non_decomposable_product():
    x = binary_table(100)
    shards = split(x, "vertical")
    fc = build_single_process(OnePassBuilder(n_clusters=1, n_products=1, learner="factorized"),
                              [(d, xi) for d, xi, _ in shards], FEATURES)
    assign(fc, "flat")
    root = fc.nodes[fc.root]
    root.children.append(root.children[0])
    with pytest.raises(UserError, match=rf"product node {root.id} on rank 0 is not decomposable"):
        fc.validate()


def test_per_client_learner_override_and_seeds_from_client_index():
    decls = [decl(0, ["a"], 10, "s"), decl(1, ["b"], 10, "s"), decl(2, ["a"], 10, "s")]
    plan = OnePassBuilder(learner="learnspn", learners={1: "factorized"}, seed=4).plan(decls)
    by = {(t.client, t.subspace): t for t in plan.tasks}
    assert {t.learner for t in plan.tasks if t.client == 1} == {"factorized"}
    assert {t.learner for t in plan.tasks if t.client != 1} == {"learnspn"}
    again = OnePassBuilder(learner="learnspn", learners={1: "factorized"}, seed=4).plan(decls[::-1])
    assert {(t.client, t.subspace): t.seed for t in again.tasks} == {k: t.seed for k, t in by.items()}
    assert len({t.seed for t in plan.tasks}) == len(plan.tasks)


def test_unknown_learner_is_a_user_error():
    from mpifc.federated.learners import fit_leaf

    with pytest.raises(UserError, match="unknown learner 'nope'"):
        fit_leaf("nope", np.zeros((3, 1)), ["real"], 0)


def test_fedpc_with_ratspn_leaves_sums_to_one():
    pytest.importorskip("mpifc.circuit.ratspn")
    x = binary_table(300, seed=7)
    shards = split(x, "horizontal")  # RAT-SPN needs >= 2 features per leaf PC
    b = OnePassBuilder(n_clusters=2, n_products=3, seed=1, learner="ratspn",
                       hyperparameters={"em_iters": 5})
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "horizontal")
    assign(fc, "flat")
    assert {n.leaf.learner for n in fc.leaves} == {"ratspn"}
    total = np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum()
    assert abs(total - 1.0) < 1e-9


def test_ratspn_learner_variance_floor():
    # --hp min_var=V reaches the RAT-SPN's Gaussian leaves: no fitted variance below V, and a
    # column that is one value in training gets exactly V (the floor binds).
    pytest.importorskip("mpifc.circuit.ratspn")
    from mpifc.federated.learners import fit_leaf

    rng = np.random.default_rng(3)
    x = np.column_stack([rng.normal(size=200), rng.normal(size=200), np.zeros(200), rng.normal(size=200)])
    for floor in (1e-6, 1e-2):
        m = fit_leaf("ratspn", x, ["real"] * 4, 0, em_iters=5, min_var=floor)
        var = m.P["var"].numpy()
        assert var.min() >= floor * (1 - 1e-12) and np.isclose(var.min(), floor)
    default = fit_leaf("ratspn", x, ["real"] * 4, 0, em_iters=5)
    assert np.isclose(default.P["min_var"].numpy().min(), 1e-6)


def test_tree_assignment_with_one_server_keeps_the_root_on_rank_0():
    # One intermediate server: one block. The root must stay on rank 0 (the querier) with the
    # server's sum as its only child; before, the block's sum became the root on rank 1 and the
    # distributed passes left rank 0 out.
    x = binary_table(300, seed=4)
    shards = [(decl(i, FEATURES, len(x[i::3])), x[i::3]) for i in range(3)]
    b = OnePassBuilder(learner="factorized")
    flat = assign(build_single_process(b, shards, FEATURES), "flat")
    tree = assign(build_single_process(b, shards, FEATURES, client_ranks=client_rank_map(range(3), 1)),
                  "tree", n_servers=1)
    root = tree.nodes[tree.root]
    assert root.rank == 0 and root.op == SUM and len(root.children) == 1
    np.testing.assert_allclose(root.weights, [1.0])
    group = tree.nodes[root.children[0]]
    assert group.rank == 1 and group.op == SUM and len(group.children) == 3
    assert {r for (r, d) in tree.rank_edges() if d == 0} == {1}
    np.testing.assert_allclose(log_likelihood(tree, x), log_likelihood(flat, x), atol=1e-12)
    assert abs(np.exp(log_likelihood(tree, all_binary(5))).sum() - 1) < 1e-9


@pytest.mark.parametrize("learner", ["factorized", "dt"])
def test_a_root_on_a_client_gets_a_pass_through_root_on_rank_0(learner):
    # One client with one PC (no clustering): Algorithm 1's collapsed circuit is that client's
    # leaf, on the client's rank. assign() puts a one-child sum (an average for FC[DT]) on rank 0.
    x = binary_table(200, seed=8)
    shards = [(decl(0, FEATURES, len(x)), x)]
    b = OnePassBuilder(n_clusters=1, learner=learner, **({"hyperparameters": {"max_depth": 3}} if learner == "dt" else {}))
    fc = build_single_process(b, shards, FEATURES, "y" if learner == "dt" else None,
                              client_ranks=client_rank_map([0], 0))
    leaf = fc.root
    assert fc.nodes[leaf].op == LEAF and fc.nodes[leaf].rank == 1
    before = log_likelihood(fc, x)
    for strategy, servers in (("flat", 0), ("tree", 2)):
        fc.root = leaf
        assign(fc, strategy, n_servers=servers)
        root = fc.nodes[fc.root]
        assert root.rank == 0 and root.children == [leaf]
        assert root.op == ("average" if learner == "dt" else SUM)
        np.testing.assert_allclose(log_likelihood(fc, x), before, atol=1e-12)
