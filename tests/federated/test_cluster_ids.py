"""Cooccurrence cluster ids on the wire (one_pass.pack_cluster_ids / unpack_cluster_ids): the
smallest unsigned dtype holding K - 1, checked by the server, and the same model as int64 ids."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated.one_pass import (
    ClientDeclaration,
    ClientReport,
    LeafReport,
    OnePassBuilder,
    cluster_id_dtype,
    pack_cluster_ids,
    run_client_tasks,
    unpack_cluster_ids,
)
from tests.federated.fixtures import FEATURES, binary_table, split


def test_dtype_is_the_smallest_unsigned_that_holds_k_minus_1():
    cases = {1: np.uint8, 2: np.uint8, 256: np.uint8, 257: np.uint16, 65_536: np.uint16, 65_537: np.uint32,
             2**32: np.uint32, 2**32 + 1: np.uint64, 2**64: np.uint64}
    for k, dt in cases.items():
        assert cluster_id_dtype(k) == np.dtype(dt), k
        assert np.iinfo(cluster_id_dtype(k)).max >= k - 1
    with pytest.raises(ValueError, match="K must be >= 1"):
        cluster_id_dtype(0)


def _wire(a: np.ndarray) -> np.ndarray:
    """What the transport delivers: the raw bytes, read back with the dtype in the header."""
    return np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=a.dtype).copy()


def _same_circuit(a, b) -> None:
    assert len(a.nodes) == len(b.nodes) and a.root == b.root
    for x, y in zip(a.nodes, b.nodes):
        assert (x.op, list(x.children), x.rank) == (y.op, list(y.children), y.rank)
        assert np.array_equal(x.weights, y.weights)


@pytest.mark.parametrize("k", [3, 300])
def test_model_through_the_wire_equals_in_process_int64_ids(k):
    """The server's FC from compact ids (counts + packed ids, rebuilt reports) is the in-process
    one (int64 ids, no wire) node for node and weight for weight. K = 300 takes uint16 (every
    row its own cluster at most: 240 rows)."""
    shards = split(binary_table(240, seed=3), "vertical")
    b = OnePassBuilder(n_clusters=k, glue="cooccurrence", seed=7, learner="factorized")
    plan = b.plan([d for d, _, _ in shards], FEATURES, "y", "vertical")
    local = [run_client_tasks(plan, d.index, x, d.features) for d, x, _ in shards]
    ref = b.assemble(plan, local)
    received = []
    for r in local:
        assert r.cluster_ids.dtype == np.int64
        sent = pack_cluster_ids(plan, r.client, r.cluster_ids)
        assert sent.dtype == cluster_id_dtype(k) and sent.nbytes == len(r.cluster_ids) * sent.itemsize
        assert sent.itemsize == (1 if k <= 256 else 2)
        rep = ClientReport.from_counts(r.client, _wire(r.counts()), plan)
        rep.cluster_ids = unpack_cluster_ids(plan, rep, _wire(sent), f"client {r.client} (rank {r.client + 1})")
        assert rep.cluster_ids.dtype == np.int64 and np.array_equal(rep.cluster_ids, r.cluster_ids)
        received.append(rep)
    _same_circuit(b.assemble(plan, received), ref)


def _plan_and_report(k: int = 3, found: int = 2, n: int = 6):
    decls = [ClientDeclaration(c, (f,), ("discrete",), (2,), n, "s") for c, f in enumerate("ab")]
    plan = OnePassBuilder(n_clusters=k, glue="cooccurrence").plan(decls, setting="vertical")
    (task,) = plan.tasks_for(1)
    leaves = [LeafReport(1, task.subspace, j, n // found, "f", task.features) for j in range(found)]
    return plan, ClientReport(1, leaves)


def test_server_accepts_exactly_the_dtype_of_the_plans_k():
    plan, rep = _plan_and_report(k=3, found=2)
    ok = np.array([0, 1, 1, 0, 0, 1], dtype=np.uint8)
    got = unpack_cluster_ids(plan, rep, ok, "client 1 (rank 2)")
    assert got.dtype == np.int64 and got.tolist() == ok.tolist()
    for bad in (ok.astype(np.int64), ok.astype(np.uint16), ok.astype(np.int8), ok[:5], ok.reshape(2, 3)):
        with pytest.raises(UserError, match=r"client 1 \(rank 2\): cluster ids .* expected uint8 \(6,\) for K = 3"):
            unpack_cluster_ids(plan, rep, bad, "client 1 (rank 2)")


def test_server_rejects_ids_of_clusters_the_client_did_not_report():
    # K = 3 planned, k-means left one cluster empty: 2 cluster PCs, so id 2 is out of range
    plan, rep = _plan_and_report(k=3, found=2)
    with pytest.raises(UserError, match=r"client 1 \(rank 2\): cluster ids outside 0\.\.1 .* largest id 2"):
        unpack_cluster_ids(plan, rep, np.array([0, 1, 2, 0, 0, 1], dtype=np.uint8), "client 1 (rank 2)")
    with pytest.raises(ValueError, match="outside 0..2"):
        pack_cluster_ids(plan, 1, np.array([0, 1, 3, 0, 0, 1]))
