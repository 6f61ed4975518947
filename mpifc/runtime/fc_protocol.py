"""Message kinds of the federated-circuit protocol, and which payload classes clients may send.

Every kind names its payload class (see :mod:`mpifc.runtime.kinds`), which is what the privacy
audit checks: a client rank may send only :data:`CLIENT_ALLOWED` classes, ``cluster_ids`` only
with the opt-in ``cooccurrence`` glue, and never ``evidence`` (only the querier sends evidence,
and only in horizontal inference, where it is the querier's own query).
"""
from __future__ import annotations

from mpifc.runtime.kinds import register_kind

DECLARE = register_kind("fc.train.declare", "feature_declaration",
                        "client -> server: feature names, meta-types, category counts, row count, ids digest")
PLAN = register_kind("fc.train.plan", "control",
                     "server -> client: the client's Algorithm-1 tasks (subspaces, K, seeds, learner)")
COUNTS = register_kind("fc.train.counts", "count",
                       "client -> server: (subspace, cluster, n_rows) per learned PC, int64 (n_leaves, 3)")
CLUSTER_IDS = register_kind("fc.train.cluster_ids", "cluster_ids",
                            "client -> server (cooccurrence only): cluster id per aligned training row")
MODEL = register_kind("fc.train.model", "model_parameters",
                      "client -> server: one leaf PC as HDF5 bytes (structure and parameters)")
TIMING = register_kind("fc.train.timing", "timing", "client -> server: per-phase seconds of this rank")
DONE = register_kind("fc.train.done", "control", "server -> all: training finished, model written")
QUERY_DECLARE = register_kind("fc.query.declare", "feature_declaration",
                              "client -> server: test row count and ids digest (alignment check)")
EVIDENCE = register_kind("fc.query.evidence", "evidence",
                         "querier -> client (horizontal): query rows over the client's features")
VALUES = register_kind("fc.query.values", "likelihood_vector",
                       "rank -> parent rank: per-sample log-values of the nodes crossing this link")
EM_STRUCTURE = register_kind("fc.em.structure", "model_parameters",
                             "server -> client: the assembled FC without leaf models (for exact EM)")
FLOWS = register_kind("fc.em.flows", "flow", "parent rank -> child rank: per-sample flows of crossing nodes")
EM_STATS = register_kind("fc.em.stats", "flow", "client -> server: summed sum-node edge flows (EM statistics)")

CLIENT_ALLOWED = frozenset({"feature_declaration", "count", "model_parameters", "likelihood_vector",
                            "flow", "cluster_ids", "timing"})
"""Payload classes a client rank may send in an FC job (cluster_ids only with cooccurrence)."""
