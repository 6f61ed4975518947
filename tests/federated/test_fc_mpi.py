"""FedPC training and queries over real MPI jobs: equality with the gathered model, closed-form
bytes, the privacy audit, and bad input (exit code 2, no model file)."""
from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifc.federated.em import em_step
from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.one_pass import build_single_process, cluster_id_dtype
from mpifc.federated.serialize import load_fc, seal
from mpifc.fedpc.evaluate import batches, evaluate_gathered, make_query
from mpifc.fedpc.protocol import CLIENT_ALLOWED
from mpifc.fedpc.query import query_payload_bytes
from tests.federated.fixtures import FEATURES, all_binary, binary_table, real_table, write_shards
from tests.mpi_util import run_mpi

JOB = ["-m", "mpifc"]


def read_ledger(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def train(n, shards, tmp, *extra, name="m"):
    model, ledger, audit = tmp / f"{name}.h5", tmp / f"{name}-train.csv", tmp / f"{name}-audit-train"
    r = run_mpi(n, JOB + ["train", str(shards), "--learner", "factorized", "--model", str(model),
                          "--ledger", str(ledger), "--audit", str(audit), "--json", *extra], timeout=180)
    return r, model, ledger, audit


def evaluate(n, shards, model, tmp, batch, name="m", extra=()):
    ledger, npz, audit = tmp / f"{name}-query.csv", tmp / f"{name}.npz", tmp / f"{name}-audit-query"
    r = run_mpi(n, JOB + ["evaluate", str(shards), "--model", str(model), "--distributed", "--batch", str(batch),
                          "--ledger", str(ledger), "--output-npz", str(npz), "--audit", str(audit), "--json",
                          *extra], timeout=180)
    return r, ledger, npz, audit


def audit_records(directory: Path) -> tuple[list[dict], dict[int, list]]:
    recs, raw = [], {}
    for p in sorted(directory.glob("audit-rank*.json")):
        d = json.loads(p.read_text())
        recs += d["sent"]
        raw[d["rank"]] = d["raw_shapes"]
    return recs, raw


def assert_private(directory: Path, client_ranks: set[int], cooccurrence: bool, content: bool = True) -> None:
    """Client ranks send only allowed payload classes, no array shaped like their rows and, on
    real-valued data (``content``), no message containing the bytes of any of their rows. On
    binary data rows like (0., 1.) occur by chance inside model parameters, so only shapes count."""
    recs, raw = audit_records(directory)
    assert recs, "the audit hook recorded nothing"
    for r in recs:
        if r["src"] in client_ranks:
            assert r["payload"] in CLIENT_ALLOWED, r
            assert cooccurrence or r["payload"] != "cluster_ids", r
            assert not (content and r["contains_raw_row"]), r
            assert r["shape"] not in raw[r["src"]], r


def assert_ledger_declared(rows: list[dict], client_ranks: set[int]) -> None:
    for row in rows:
        assert row["payload_class"] != "unknown", row
        if int(row["src"]) in client_ranks and not row["kind"].startswith("runtime."):
            assert row["payload_class"] in CLIENT_ALLOWED, row


def assert_same_as_in_process(fc, shards: Path, opts: dict) -> None:
    """``fc`` (one-pass model of an MPI job, flat ψ, factorized leaves) equals Algorithm 1 run in
    one process on the same shards (:func:`build_single_process`): nodes, children, weights."""
    from data_prep.shards import load_manifest
    from mpifc.federated.assign import assign, client_rank_map
    from mpifc.fedpc.data import read_client_data
    from mpifc.fedpc.train import builder_from_config

    m = load_manifest(shards)
    data = [read_client_data(shards, c) for c in range(m.n_clients)]
    cfg = {"products": 4, "seed": 0, "learner": "factorized", **opts}
    ref = assign(build_single_process(builder_from_config(cfg), [(d.declaration, d.shard.x_train) for d in data],
                                      m.feature_order, m.target, m.setting, client_rank_map(range(m.n_clients), 0)),
                 "flat")
    assert len(fc.nodes) == len(ref.nodes) and fc.root == ref.root
    for a, b in zip(fc.nodes, ref.nodes):
        assert (a.op, list(a.children), a.rank) == (b.op, list(b.children), b.rank)
        assert np.array_equal(a.weights, b.weights), (a.id, a.weights, b.weights)
        if a.leaf is not None:
            assert (a.leaf.client, a.leaf.subspace, a.leaf.cluster) == (b.leaf.client, b.leaf.subspace, b.leaf.cluster)


def check_equal_and_bytes(shards, model, ledger, npz, batch, n_test, query_rows=None):
    got = np.load(npz)["joint"]
    ref_npz = npz.with_suffix(".gathered.npz")
    evaluate_gathered({"dir": str(shards), "model": str(model), "batch": batch, "output_npz": str(ref_npz),
                       "query_rows": query_rows})
    ref = np.load(ref_npz)["joint"]
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-9
    fc = load_fc(model, load_models=False)
    q = make_query(fc)
    rows = read_ledger(ledger)
    values = [r for r in rows if r["kind"] == "fc.query.values"]
    expect = sum(query_payload_bytes(fc, hi - lo, q) for lo, hi in batches(n_test, batch))
    assert sum(int(r["payload_bytes"]) for r in values) == expect
    assert len(values) == len(batches(n_test, batch)) * len(fc.rank_edges())
    return fc, rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fcmpi")
    return {
        "vertical": write_shards(root / "vertical", "vertical", real_table(240, 1), real_table(40, 2), "real"),
        "horizontal": write_shards(root / "horizontal", "horizontal", binary_table(300, 3), binary_table(60, 4)),
        "hybrid": write_shards(root / "hybrid", "hybrid", binary_table(300, 5), binary_table(50, 6)),
        "root": root,
    }


def test_vertical_cooccurrence_em_end_to_end(data, tmp_path):
    shards = data["vertical"]
    initial = tmp_path / "initial.h5"
    r, model, tledger, taudit = train(4, shards, tmp_path, "--glue", "cooccurrence", "--clusters", "3",
                                      "--refine", "em", "--em-iters", "3", "--em-initial-model", str(initial))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    # Exact distributed EM == centralized EM (same initial structure, rows joined by aligned id).
    fc0 = load_fc(initial)
    x = real_table(240, 1)
    ref = [em_step(fc0, {f: x[:, j] for j, f in enumerate(FEATURES)}) for _ in range(3)]
    np.testing.assert_allclose(summary["em_train_ll"], ref, atol=1e-9, rtol=0)
    got = load_fc(model)
    assert np.abs(log_likelihood(got, real_table(40, 2)) - log_likelihood(fc0, real_table(40, 2))).max() < 1e-9
    trows = read_ledger(tledger)
    flows = [x for x in trows if x["kind"] == "fc.em.flows"]
    assert len(flows) == 3 * 3 and {x["payload_class"] for x in flows} == {"flow"}
    assert sum(int(x["payload_bytes"]) for x in flows) == 3 * 8 * 240 * len(got.leaves)
    # Every training message goes to or from rank 0, which counts them: the summary is exact
    # (it is taken before the final "done" notices).
    assert summary["bytes_train"] == sum(int(x["total_bytes"]) for x in trows
                                         if x["phase"] != "teardown" and x["kind"] != "fc.train.done")
    assert {x["kind"] for x in trows} >= {"fc.train.declare", "fc.train.counts", "fc.train.cluster_ids",
                                          "fc.train.model"}
    # one cluster id per training row in the smallest unsigned dtype holding K - 1: uint8 for K = 3
    ids_rows = [x for x in trows if x["kind"] == "fc.train.cluster_ids"]
    assert cluster_id_dtype(3) == np.uint8
    assert len(ids_rows) == 3 and all(int(x["payload_bytes"]) == 240 * 1 for x in ids_rows)
    assert_ledger_declared(trows, {1, 2, 3})
    assert_private(taudit, {1, 2, 3}, cooccurrence=True)
    ids_sent = [x for x in audit_records(taudit)[0] if x["kind"] == "fc.train.cluster_ids"]
    assert [(x["src"], x["dst"], x["dtype"], x["shape"]) for x in ids_sent] == [(c, 0, "uint8", [240])
                                                                                 for c in (1, 2, 3)]
    # The server got exactly the joint cluster counts of the in-process Algorithm 1 (which never
    # sends, int64 ids throughout): same structure, same weights, bit for bit.
    assert_same_as_in_process(load_fc(initial), shards, {"glue": "cooccurrence", "clusters": 3})  # fc0 ran EM
    assert summary["train_seconds_critical_path"] <= summary["train_seconds_total"]
    r, qledger, npz, qaudit = evaluate(4, shards, model, tmp_path, batch=16)
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout.strip().splitlines()[-1])
    fc, qrows = check_equal_and_bytes(shards, model, qledger, npz, 16, 40)
    assert metrics["bytes_query"] == sum(int(x["total_bytes"]) for x in qrows if x["phase"].startswith("query"))
    assert metrics["accuracy"] > 0.75  # y depends on the shared latent z of a..d
    assert not [x for x in qrows if x["kind"] == "fc.query.evidence"]
    assert_private(qaudit, {1, 2, 3}, cooccurrence=False)


def test_einet_clients_on_mixed_real_and_discrete_features(data, tmp_path):
    # Horizontal clients over four real columns and the binary target y: each client's EiNet has
    # mixed leaves (a Gaussian per real column, a two-level categorical for y). Distributed queries
    # equal the gathered model's, and no client message carries a row's bytes.
    halves = [(FEATURES, slice(0, None, 2)), (FEATURES, slice(1, None, 2))]  # two clients: 3 ranks
    shards = write_shards(data["root"] / "horizontal-real", "horizontal", real_table(300, 7), real_table(60, 8),
                          "real", layouts=halves)
    r, model, _, taudit = train(3, shards, tmp_path, "--glue", "random", "--learner", "einet", "--hp", "epochs=2",
                                "--hp", "num_sums=2",
                                "--hp", "repetitions=2")
    assert r.returncode == 0, r.stderr
    fc = load_fc(model)
    assert {n.leaf.learner for n in fc.leaves} == {"einet"} and len(fc.leaves) == 2
    assert {(n.leaf.model.config.leaf, n.leaf.model.config.var_levels) for n in fc.leaves} == {("mixed", (0,) * 4 + (2,))}
    assert_private(taudit, {1, 2}, cooccurrence=False)
    r, qledger, npz, _ = evaluate(3, shards, model, tmp_path, batch=25)
    assert r.returncode == 0, r.stderr
    check_equal_and_bytes(shards, model, qledger, npz, 25, 60)
    assert json.loads(r.stdout.strip().splitlines()[-1])["accuracy"] > 0.75


def test_horizontal_tree_end_to_end(data, tmp_path):
    shards = data["horizontal"]
    r, model, _, taudit = train(6, shards, tmp_path, "--glue", "random", "--assign", "tree", "--servers", "2")
    assert r.returncode == 0, r.stderr
    fc = load_fc(model)
    assert abs(np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum() - 1) < 1e-9
    # 3 clients over 2 servers: blocks {0, 1} -> server 1, {2} (one leaf, no group node needed).
    assert fc.nodes[fc.root].rank == 0 and {fc.nodes[c].rank for c in fc.nodes[fc.root].children} == {1, 5}
    assert_private(taudit, {3, 4, 5}, cooccurrence=False, content=False)
    r, qledger, npz, qaudit = evaluate(6, shards, model, tmp_path, batch=25)
    assert r.returncode == 0, r.stderr
    _, rows = check_equal_and_bytes(shards, model, qledger, npz, 25, 60)
    ev = [x for x in rows if x["kind"] == "fc.query.evidence"]
    assert {x["src"] for x in ev} == {"0"}
    assert sum(int(x["payload_bytes"]) for x in ev) == 3 * 8 * 60 * len(FEATURES)
    recs, _ = audit_records(qaudit)
    assert not [x for x in recs if x["src"] != 0 and x["payload"] == "evidence"]


def test_tree_with_one_server_end_to_end_and_root_away_from_rank_0(data, tmp_path):
    # One intermediate server (rank 1) over hybrid clients (ranks 2, 3): the root stays on rank 0
    # above the server's sum. Before, that sum became the root on rank 1, and the distributed
    # queries left rank 0 out while the clients waited for its evidence until the deadline.
    shards = data["hybrid"]
    r, model, _, _ = train(4, shards, tmp_path, "--glue", "combinatorial", "--clusters", "2",
                           "--assign", "tree", "--servers", "1")
    assert r.returncode == 0, r.stderr
    fc = load_fc(model)
    root = fc.nodes[fc.root]
    assert root.rank == 0 and len(root.children) == 1 and fc.nodes[root.children[0]].rank == 1
    assert abs(np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum() - 1) < 1e-9
    r, qledger, npz, _ = evaluate(4, shards, model, tmp_path, batch=50, extra=("--deadline", "60"))
    assert r.returncode == 0, r.stderr
    check_equal_and_bytes(shards, model, qledger, npz, 50, 50)
    r = run_mpi(4, JOB + ["evaluate", str(shards), "--model", str(model), "--distributed", "--query", "sample",
                          "--n-samples", "7", "--out", str(tmp_path / "s.h5"), "--json"], timeout=120)
    assert r.returncode == 0, r.stderr
    # A root edited onto rank 1 (or a model written before the rule): every rank stops at once
    # with exit 2, long before the 60 s deadline.
    bad = tmp_path / "root-away.h5"
    shutil.copy(model, bad)
    with h5py.File(bad, "a") as f:
        f["fc/nodes/rank"][fc.root] = 1
    seal(bad)  # edited on purpose: the checksum would refuse it first
    for query in ([], ["--query", "mpe", "--out", str(tmp_path / "mpe.h5")]):
        r = run_mpi(4, JOB + ["evaluate", str(shards), "--model", str(bad), "--distributed", "--deadline", "60",
                              *query], timeout=50)
        assert r.returncode == 2, r.stderr
        assert f"the root (node {fc.root}) is on rank 1" in r.stderr and "root-away.h5" in r.stderr


def test_hybrid_end_to_end_and_bad_psi(data, tmp_path):
    shards = data["hybrid"]
    r, model, _, _ = train(3, shards, tmp_path, "--glue", "combinatorial", "--clusters", "2")
    assert r.returncode == 0, r.stderr
    fc = load_fc(model)
    assert abs(np.exp(log_likelihood(fc, all_binary(len(FEATURES)))).sum() - 1) < 1e-9
    r, qledger, npz, _ = evaluate(3, shards, model, tmp_path, batch=50)
    assert r.returncode == 0, r.stderr
    check_equal_and_bytes(shards, model, qledger, npz, 50, 50)
    # Throughput runs: the 50 test rows repeated to 130 queries, in batches of 50, 50 and 30.
    r, qledger, npz, _ = evaluate(3, shards, model, tmp_path, batch=50, name="tiled", extra=("--query-rows", "130"))
    assert r.returncode == 0, r.stderr
    check_equal_and_bytes(shards, model, qledger, npz, 50, 130, query_rows=130)
    joint = np.load(npz)["joint"]
    assert joint.shape[0] == 130 and np.array_equal(joint[50:100], joint[:50])
    assert len(json.loads(r.stdout.strip().splitlines()[-1])["batch_seconds"]) == 3
    # ψ edited to put a leaf on the server: a clear error, exit 2.
    bad = tmp_path / "bad.h5"
    shutil.copy(model, bad)
    leaf = fc.leaves[0]
    with h5py.File(bad, "a") as f:
        f["fc/nodes/rank"][leaf.id] = 0
    seal(bad)  # edited on purpose: the checksum would refuse it first
    r = run_mpi(3, JOB + ["evaluate", str(shards), "--model", str(bad), "--distributed"], timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"leaf node {leaf.id} (client {leaf.leaf.client}) is placed on rank 0" in r.stderr


def _fix_checksum(shards: Path, index: int) -> None:
    from data_prep.shards import sha256_file

    m = json.loads((shards / "manifest.json").read_text())
    m["clients"][index]["sha256"] = sha256_file(shards / f"client-{index}.h5")
    (shards / "manifest.json").write_text(json.dumps(m))


def test_too_few_ranks(data, tmp_path):
    r, model, _, _ = train(3, data["vertical"], tmp_path)
    assert r.returncode == 2 and "too few ranks" in r.stderr
    assert not model.exists() and not list(tmp_path.glob(".*tmp"))


def test_conflicting_meta_types_name_both_clients(data, tmp_path):
    shards = tmp_path / "conflict"
    shutil.copytree(data["horizontal"], shards)
    with h5py.File(shards / "client-2.h5", "a") as f:
        f.attrs["meta_types"] = json.dumps(["discrete", "real", "discrete", "discrete", "discrete"])
    _fix_checksum(shards, 2)
    r, model, _, _ = train(4, shards, tmp_path)
    assert r.returncode == 2
    assert "feature 'b': client 0 declares meta-type 'discrete' but client 2 declares 'real'" in r.stderr
    assert not model.exists()


def test_unaligned_vertical_ids(data, tmp_path):
    # In process, through the same steps as the job: each client reads its own shard file and
    # builds its declaration (read_client_data), rank 0 plans on them (train_rank's _server).
    # The exit-code path of a plan error on rank 0 (exit 2, message on stderr, no model file) is
    # the same as for conflicting meta-types, which runs as a real MPI job above.
    from data_prep.shards import load_manifest
    from mpifc.errors import UserError
    from mpifc.fedpc.data import read_client_data
    from mpifc.cli.train import add_fedpc_train_arguments as add_train_arguments, train_config
    from mpifc.fedpc.train import builder_from_config

    shards = tmp_path / "unaligned"
    shutil.copytree(data["vertical"], shards)
    with h5py.File(shards / "client-1.h5", "a") as f:
        f["train/ids"][:2] = f["train/ids"][:2][::-1].copy()
    _fix_checksum(shards, 1)
    m = load_manifest(shards)
    decls = [read_client_data(shards, i).declaration for i in range(m.n_clients)]
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    cfg = train_config(p.parse_args([str(shards), "--learner", "factorized", "--model", str(tmp_path / "m.h5")]))
    with pytest.raises(UserError) as e:
        builder_from_config(cfg).plan(decls, m.feature_order, m.target, m.setting)
    assert "aligned sample ids" in str(e.value) and "client 1" in str(e.value)


def test_client_with_zero_rows(tmp_path):
    layouts = [(FEATURES, slice(0, None)), (FEATURES, slice(0, 0))]
    shards = write_shards(tmp_path / "zero", "horizontal", binary_table(50), binary_table(10), layouts=layouts)
    r, model, _, _ = train(3, shards, tmp_path)
    assert r.returncode == 2 and "client 1" in r.stderr and "zero training rows" in r.stderr
    assert not model.exists()
