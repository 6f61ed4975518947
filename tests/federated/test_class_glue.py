"""The class glue in one process: a distribution in every setting, class weights from counts,
and (vertical) exact EM tying the other clients' clusters to the label owner's classes."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated.defaults import CLASS_GLUE_EM_ITERS, CLASS_GLUE_EM_ROWS, default_clusters, default_glue, default_refine
from mpifc.federated.em import em_step
from mpifc.federated.evaluate import log_likelihood, predict
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.sampled_em import STOP_TOL, should_stop
from mpifc.federated.serialize import load_fc
from mpifc.federated.structure import PRODUCT, SUM

from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


def _fc(setting, n=600, seed=0, **kw):
    x = binary_table(n, seed)
    shards = [(d, xi) for d, xi, _ in split(x, setting)]
    builder = OnePassBuilder(n_clusters=None, glue="class", seed=seed, **kw)
    return build_single_process(builder, shards, FEATURES, target="y", setting=setting), x


@pytest.mark.parametrize("setting", ["horizontal", "vertical", "hybrid"])
def test_class_glue_is_a_distribution(setting):
    fc, _ = _fc(setting)
    assert fc.meta["glue"] == "class"
    total = np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum()
    assert abs(total - 1) < 1e-9


@pytest.mark.parametrize("setting", ["horizontal", "hybrid"])
def test_one_product_per_class_weighted_by_its_rows(setting):
    fc, x = _fc(setting)
    root = fc.nodes[fc.root]
    assert root.op == SUM and len(root.children) == 2
    # one subspace (horizontal): the class's product collapses into its sum over the clients
    assert all(fc.nodes[c].op == (SUM if setting == "horizontal" else PRODUCT) for c in root.children)
    # each product's leaves are PCs of one class (cluster id = class code): weights are the
    # classes' training shares
    def leaves(nid):
        node = fc.nodes[nid]
        return [node] if node.op == "leaf" else [x for c in node.children for x in leaves(c)]

    by_class = {}
    for c, w in zip(root.children, root.weights):
        ks = {node.leaf.cluster for node in leaves(c)}
        assert len(ks) == 1
        by_class[ks.pop()] = w
    n_rows = len(x) if setting == "horizontal" else len(x[0::2]) + len(x[1::2])
    assert by_class[1] == pytest.approx(float(x[:, 4].sum()) / n_rows, abs=1e-12)


def test_vertical_em_ties_the_clusters_to_the_classes():
    # y = a XOR c (85 %), a on client 0, c on client 1, y alone on client 2: no client's own
    # columns predict y; the class glue's clusters of (a, b) and (c, d), tied to the classes by
    # exact EM, do
    fc, _ = _fc("vertical", n=2000)
    assert default_clusters(3, 3, False, "class", n_clustered=2, n_classes=2) == 4
    test = binary_table(2000, seed=7)
    cols = {f: test[:, j] for j, f in enumerate(FEATURES)}
    before = float(np.mean(predict(fc, cols) == test[:, 4]))
    train = binary_table(2000, 0)
    for _ in range(10):
        em_step(fc, {f: train[:, j] for j, f in enumerate(FEATURES)})
    after = float(np.mean(predict(fc, cols) == test[:, 4]))
    assert before < 0.6 < 0.8 < after, (before, after)
    assert abs(np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum() - 1) < 1e-9


def test_vertical_class_glue_makes_the_label_owner_and_the_others_independent_given_the_class():
    # the root is sum_y p(y) P_y(x0) S_y(x1) (x0: the label owner's columns, x1: the others'), so
    # p(y, x) p(y) = p(y, x0) p(y, x1) for every row and class, whatever weights EM sets: the
    # factorisation launch/bench/vertical_gap.py uses to price each client's part of p(y | x)
    from mpifc.federated.evaluate import _model_ll, class_log_joint
    from mpifc.federated.one_pass import ClientDeclaration, ids_digest

    x = binary_table(600, seed=3)
    ids = np.arange(len(x), dtype=np.int64)
    shards = []
    for i, feats in enumerate((("a", "b", "y"), ("c", "d"))):
        cols = [FEATURES.index(f) for f in feats]
        shards.append((ClientDeclaration(i, feats, ("discrete",) * len(feats), (2,) * len(feats), len(x),
                                         ids_digest(ids)), x[:, cols]))
    builder = OnePassBuilder(n_clusters=None, glue="class", seed=0)
    fc_plan = builder.plan([d for d, _ in shards], FEATURES, "y", "vertical")
    fc = build_single_process(builder, shards, FEATURES, target="y", setting="vertical")
    rng = np.random.default_rng(0)  # any weights of the sums (classes, clusters), as EM may set them
    for node in fc.nodes:
        if node.op == SUM:
            node.weights = rng.dirichlet(np.ones(len(node.children)))
    grid = all_binary(len(FEATURES))
    rows = {f: grid[:, j] for j, f in enumerate(FEATURES)}
    rows["y"] = np.full(len(grid), np.nan)

    def joint(keep):
        return class_log_joint(fc, {f: v if f in keep else np.full(len(grid), np.nan) for f, v in rows.items()})

    full, own, other, prior = joint("abcd"), joint("ab"), joint("cd"), joint("")
    assert np.all(np.isfinite(full))
    # the other client's columns are clustered in groups (one per column here), each group a sum
    # per class over its own clusters: the groups too are independent given the class
    assert sorted(t.features for t in fc_plan.tasks if t.client == 1) == [("c",), ("d",)]
    groups = joint("c") + joint("d") - 2 * prior
    # the slack: a class PC's pseudo-count for the other class (1/(its rows + 2)), times how unlike
    # the classes' weights are; differences of whole nats would mean products of mismatched classes
    leak = max(float(np.exp(_model_ll(n.leaf.model, np.array([[np.nan, np.nan, 1.0 - n.leaf.cluster]]))[0]))
               for n in fc.leaves if n.leaf.client == 0)
    assert 0 < leak < 0.02
    assert np.max(np.abs(full + prior - own - other)) < 0.05 < 1 < min(np.ptp(own - prior), np.ptp(other - prior))
    assert np.max(np.abs(other - prior - groups)) < 0.05
    # and the classes' prior is a distribution
    assert abs(np.exp(prior[0]).sum() - 1) < 1e-9


def test_defaults_choose_the_class_glue_for_classification():
    assert default_glue("vertical", 1, 3) == "class"
    assert default_glue("hybrid", 2, 2, 5000) == "class" and default_glue("horizontal", 3, 3, 999) == "class"
    # from 1,000 rows per client a client's own held-out choice of model decides
    assert default_glue("horizontal", 3, 3, 1000) == "random"
    # past 32 classes no client chooses its model on held-out rows: the class glue pools its
    # rare classes instead
    assert default_glue("horizontal", 3, 3, 1000, n_classes=32) == "random"
    assert default_glue("horizontal", 3, 3, 5000, n_classes=33) == "class"
    assert default_glue("hybrid", 1, 2) == "random"  # a label owner on hybrid data
    assert default_glue("central", 1, 1) == "random" and default_glue("horizontal", 0, 3) == "random"
    assert default_refine("vertical", "class", 1, 2, ["learnspn"] * 2, "flat") == ("em", CLASS_GLUE_EM_ITERS)
    assert default_refine("vertical", "class", 1, 2, ["learnspn", "ratspn"], "flat")[0] == "none"
    assert default_refine("vertical", "class", 1, 2, ["learnspn"] * 2, "tree")[0] == "none"
    assert default_refine("hybrid", "class", 2, 2, ["learnspn"] * 2, "flat")[0] == "none"
    # classes x K^m products stay at most 256
    assert [default_clusters(c, c, False, "class", c - 1, 2) for c in (2, 3, 4, 5, 8)] == [4, 4, 4, 3, 2]


def test_the_column_groups_hold_at_most_one_cluster_pc_per_ten_rows_of_their_client():
    # each cluster PC costs sampled EM four bytes per sampled row: a small client gets fewer
    # groups and clusters (wine's 124 training rows: 12 PCs in 3 groups), a large one 8 groups
    # and at most 64 PCs; every group keeps at least 2 clusters
    from mpifc.federated.defaults import (CLASS_GLUE_GROUP_PCS, class_glue_groups, default_group_clusters,
                                          group_count, group_pc_budget)

    columns = [f"c{i}" for i in range(13)]
    for rows, n_groups, pcs in ((124, 3, 12), (398, 8, 39), (13_333, 8, CLASS_GLUE_GROUP_PCS), (30, 1, 4)):
        groups = class_glue_groups(columns, group_count(rows))
        ks = default_group_clusters([rows] * len(groups), [0] * len(groups))
        assert len(groups) == n_groups and sorted(sum(groups, ())) == sorted(columns)
        assert sum(ks) == group_pc_budget(rows) == pcs and min(ks) >= 2


def test_class_glue_needs_a_classification_target():
    x = binary_table(100)
    shards = [(d, xi) for d, xi, _ in split(x, "hybrid")]
    with pytest.raises(UserError, match="glue 'class' needs a classification target"):
        build_single_process(OnePassBuilder(glue="class"), shards, FEATURES, target=None, setting="hybrid")
    no_y = [(d, xi) for d, xi, _ in split(x, "vertical")][:2]
    with pytest.raises(UserError, match="holds the target"):
        build_single_process(OnePassBuilder(glue="class"), no_y, ("a", "b", "c", "d"), target="y",
                             setting="vertical")


@pytest.mark.mpi
def test_default_vertical_job_equals_simulate_with_its_em(tmp_path):
    # mpifc train's defaults on vertical data with a label: the class glue, K = 4 clusters for the
    # other client and sampled EM on the server (every PC kept: each client's float32 values on
    # the sample, sent once, and no flow); mpifc.simulate runs the same EM in one process, so both
    # give the same model, and the EM phase sends exactly what its closed form says
    import mpifc
    from data_prep.shards import read_test
    from mpifc.cli.prep import run as prep_run
    from tests.mpi_util import run_mpi

    shards, model = tmp_path / "bc", tmp_path / "fc.h5"
    prep_run(["--dataset", "breast-cancer", "--setting", "vertical", "--clients", "2", "--seed", "1",
              "--out", str(shards)])
    audit = tmp_path / "audit"
    ledger = tmp_path / "ledger.csv"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--seed", "1", "--model", str(model), "--json",
                    "--audit", str(audit), "--ledger", str(ledger)], timeout=300)
    assert r.returncode == 0, r.stderr
    # the clients' per-sample messages are EM's values (and nothing else), allowed by the job;
    # no raw row or column is among anything they sent
    for rank in (1, 2):
        summary = json.loads((audit / f"audit-rank{rank}.json").read_text())["summary"]
        assert set(summary["per_sample"]) == {"fc.query.values"}, summary["per_sample"]
        assert all(v["allowed"] for v in summary["per_sample"].values())
        assert summary["raw_rows"] == summary["raw_columns"] == 0 and not summary["shape_violations"]
    summary = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
    trace = summary["em_train_ll"]
    assert summary["glue"] == "class" and 2 <= len(trace) <= CLASS_GLUE_EM_ITERS
    assert len(trace) == CLASS_GLUE_EM_ITERS or should_stop(trace, STOP_TOL)
    # the EM phase's per-sample payload: the closed form for this run's rows, PCs and iterations
    from mpifc.analysis.commcost import sampled_em_bytes

    n = json.loads((shards / "manifest.json").read_text())["clients"][0]["n_train"]
    with open(ledger, newline="") as f:
        rows = [x for x in csv.DictReader(f) if x["phase"] == "em" and x["kind"] in ("fc.query.values", "fc.em.flows")]
    fc = load_fc(model, load_models=False)
    assert not [x for x in rows if x["kind"] == "fc.em.flows"]
    assert sum(int(x["payload_bytes"]) for x in rows) == sampled_em_bytes(
        min(n, CLASS_GLUE_EM_ROWS), 0, len(fc.leaves), len(trace), should_stop(trace, STOP_TOL))
    mpi = mpifc.load(model)
    sim = mpifc.simulate(shards, seed=1)
    test = read_test(shards)
    x = test.x[:, [test.features.index(f) for f in mpi.features]]
    np.testing.assert_allclose(sim.log_likelihood(x), mpi.log_likelihood(x), rtol=1e-9, atol=1e-9)
    assert np.array_equal(sim.predict_proba(x).argmax(1), mpi.predict_proba(x).argmax(1))
    one_pass = mpifc.simulate(shards, seed=1, refine="none")
    assert not np.allclose(one_pass.log_likelihood(x), mpi.log_likelihood(x))


def _many_class_csv(path, n_classes=24, big=12, small=3, seed=0):
    """A CSV whose target has ``n_classes`` classes: half with ``big`` rows, half with ``small``
    (fewer than 5 training rows each: their client pools them into one class PC)."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.repeat(np.arange(n_classes // 2), big), np.repeat(np.arange(n_classes // 2, n_classes), small)])
    rng.shuffle(y)
    centre = rng.normal(size=(n_classes, 3)) * 3
    x = centre[y] + rng.normal(size=(len(y), 3))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "d", "kind"])
        for i in range(len(y)):
            w.writerow([f"{x[i, 0]:.3f}", f"{x[i, 1]:.3f}", f"{x[i, 2]:.3f}", int(y[i] % 5), f"k{y[i]}"])


@pytest.mark.mpi
def test_a_many_class_vertical_job_on_default_flags_answers_as_the_enumeration(tmp_path):
    # 24 classes, 12 of them with fewer than 5 training rows, on 2 vertical clients, every
    # command on its default flags (a liveness bound for a loaded machine aside): the rare
    # classes share one pooled class PC, and evaluate and query answer with the normalised joint
    # of the reference pass (every class evaluated node by node)
    import mpifc
    from data_prep.shards import read_test
    from mpifc.federated.evaluate import class_log_joint
    from tests.mpi_util import run_mpi

    data, shards, model = tmp_path / "t.csv", tmp_path / "shards", tmp_path / "fc.h5"
    _many_class_csv(data)
    from mpifc.cli.prep import main as prep

    assert prep(["--dataset", "csv", "--path", str(data), "--target", "kind", "--setting", "vertical",
                 "--clients", "2", "--out", str(shards)]) == 0
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--model", str(model), "--quiet",
                    "--liveness", "60"], timeout=300)
    assert r.returncode == 0, r.stderr
    fm = mpifc.load(model)
    assert len(fm.classes) == 24
    leaves = [n.leaf for n in fm.fc.leaves if "kind" in n.leaf.features]
    pool = [lf for lf in leaves if lf.cluster == 24]
    assert len(pool) == 1 and len(leaves) == 13  # 12 classes of their own, one pool of 12
    # 16 classes or more: the PCs holding the target size their RDC features per column
    recorded = fm.fc.meta["hyperparameters"]
    owner = str(pool[0].client)
    assert all(r["hyperparameters"]["rdc_widths"] == "own" for r in recorded[owner])
    assert all("rdc_widths" not in r["hyperparameters"] for c, rows in recorded.items() if c != owner for r in rows)
    n_train = json.loads((shards / "manifest.json").read_text())["clients"][0]["n_train"]
    assert sum(lf.n_rows for lf in leaves) == n_train and min(lf.n_rows for lf in leaves) >= 5

    test = read_test(shards)
    x = test.x.copy()
    t = test.features.index("kind")
    x[:, t] = np.nan
    want = class_log_joint(fm.fc, {f: x[:, j] for j, f in enumerate(test.features)}, "kind")
    order = [test.features.index(f) for f in fm.features]
    got = fm.class_log_joint(x[:, order])
    assert np.max(np.abs(got - want)) < 1e-9

    y = test.x[:, t].astype(int)
    accuracy = float((want.argmax(1) == y).mean())
    ev = subprocess.run([sys.executable, "-m", "mpifc", "evaluate", str(shards), "--model", str(model), "--json"],
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert accuracy > 0.5  # 24 classes: chance is 1/24

    # over the ranks: the label owner's class PCs travel as row terms (one value per path to a
    # target leaf), their class terms once; the class log-joints are the enumeration's, and the
    # ledger holds exactly those values
    npz, ledger = tmp_path / "joint.npz", tmp_path / "ledger.csv"
    r = run_mpi(3, ["-m", "mpifc", "evaluate", str(shards), "--model", str(model), "--distributed", "--quiet",
                    "--batch", "20", "--output-npz", str(npz), "--ledger", str(ledger), "--liveness", "60"], timeout=300)
    assert r.returncode == 0, r.stderr
    assert np.max(np.abs(np.load(npz)["joint"] - want)) < 1e-9
    owned = {n.id: _target_paths(n.leaf.model.root, n.leaf.model.scope[n.leaf.features.index("kind")])
             for n in fm.fc.leaves if "kind" in n.leaf.features}
    assert max(owned.values()) < 24  # fewer values than classes per PC
    with open(ledger, newline="") as f:
        rows = list(csv.DictReader(f))
    n_test, k = len(x), 24
    crossing = [nid for ids in fm.fc.rank_edges().values() for nid in ids]
    per_row = sum(owned.get(nid, 1) for nid in crossing)
    values = [row for row in rows if row["kind"] == "fc.query.values"]
    assert len(values) == 2 * -(-n_test // 20)
    assert sum(int(row["payload_bytes"]) for row in values) == 8 * n_test * per_row
    terms = [row for row in rows if row["kind"] == "fc.query.class_terms"]
    assert [(row["src"], row["dst"]) for row in terms] == [(str(fm.fc.nodes[next(iter(owned))].rank), "0")]
    assert int(terms[0]["payload_bytes"]) == 8 * (len(owned) + k * sum(owned.values()))

    ask, answers = tmp_path / "ask.csv", tmp_path / "answers.csv"
    with open(data, newline="") as f:
        rows = list(csv.reader(f))
    with open(ask, "w", newline="") as f:
        csv.writer(f).writerows([row[:4] for row in rows[:41]])
    q = subprocess.run([sys.executable, "-m", "mpifc", "query", str(model), "--data", str(ask), "--what", "predict",
                        "--out", str(answers), "--quiet"], capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr
    with open(answers, newline="") as f:
        got_rows = list(csv.DictReader(f))
    enc = fm.encode({c: [row[j] for row in rows[1:41]] for j, c in enumerate(rows[0][:4])})
    joint = class_log_joint(fm.fc, {f: enc[:, j] for j, f in enumerate(fm.features)}, "kind")
    p = np.exp(joint - joint.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert [r["kind"] for r in got_rows] == [str(fm.classes[k]) for k in p.argmax(1)]
    probs = np.array([[float(r[f"p_{c}"]) for c in fm.classes] for r in got_rows])
    assert np.allclose(probs.sum(1), 1.0, atol=1e-6) and np.allclose(probs, p, atol=1e-6)
    # the same rows over the ranks (row terms of the class PCs, then the querier's joint)
    mpi_answers = tmp_path / "answers-mpi.csv"
    r = run_mpi(3, ["-m", "mpifc", "query", str(model), "--data", str(ask), "--what", "predict", "--distributed",
                    "--out", str(mpi_answers), "--quiet", "--liveness", "60"], timeout=300)
    assert r.returncode == 0, r.stderr
    with open(mpi_answers, newline="") as f:
        mpi_rows = list(csv.DictReader(f))
    assert [r["kind"] for r in mpi_rows] == [r["kind"] for r in got_rows]
    mpi_probs = np.array([[float(r[f"p_{c}"]) for c in fm.classes] for r in mpi_rows])
    assert np.max(np.abs(mpi_probs - probs)) < 1e-9


def _target_paths(g, var):
    """Paths from a client PC's node ``g`` down to leaves of variable ``var`` (the terms of its
    class values: one child per product holds it, every child of a sum)."""
    from mpifc.circuit.graph import LeafNode, ProductNode

    if isinstance(g, LeafNode):
        return int(g.var == var)
    if isinstance(g, ProductNode):
        return sum(_target_paths(ch, var) for ch in g.children if var in ch.scope)
    return sum(_target_paths(ch, var) for ch in g.children)
