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
                            "client -> server (cooccurrence only): cluster id per aligned training row, "
                            "(n_rows,) in the smallest unsigned dtype holding K - 1 (uint8 for K <= 256, "
                            "uint16 up to 65,536, ...; one_pass.cluster_id_dtype)")
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
# Exact EM for horizontal and hybrid data (pooled statistics, mpifc.fedpc.em): only
# parameters and per-component sums over a client's rows leave it, never per-sample values.
EM_PARAMS = register_kind("fc.em.params", "model_parameters",
                          "server -> client (horizontal/hybrid EM): the whole FC with every leaf PC (HDF5 bytes)")
EM_SUM_STATS = register_kind("fc.em.sum_stats", "flow",
                             "client -> server (horizontal/hybrid EM): float64 (sum edges + 2,): expected "
                             "counts of every sum edge summed over the client's rows, then [sum log p(row), n_rows]")
EM_LEAF_STATS = register_kind("fc.em.leaf_stats", "flow",
                              "client -> owner client (horizontal/hybrid EM): float64, per leaf of the owner "
                              "(ascending id) the leaf learner's addable E-step statistics summed over the "
                              "sender's rows (flow-weighted counts, sums, squares, internal edge counts)")
EM_LEAF = register_kind("fc.em.leaf", "model_parameters",
                        "owner client -> server (horizontal/hybrid EM): one leaf PC after its M-step (HDF5 bytes)")
# Distributed MPE and sampling (mpifc.fedpc.mpe).
MAX_VALUES = register_kind("fc.query.max_values", "likelihood_vector",
                           "rank -> parent rank (MPE): per-sample max-product log-values of crossing nodes, "
                           "float64 (nodes * batch,)")
DECISIONS = register_kind("fc.query.decisions", "flow",
                          "parent rank -> child rank (MPE, sampling): per sample, whether each crossing node is "
                          "in the sample's induced tree (arg-max / sampled sum choices), uint8 (nodes * batch,)")
QUERY_ROWS = register_kind("fc.query.rows", "control",
                            "querier -> every rank of the circuit (mpifc query): how many rows, in batches of "
                            "how many, and what is asked (no row values)")
ANSWER = register_kind("fc.query.answer", "query_answer",
                       "client -> querier (MPE, sampling): the client's features of the answer, float64 "
                       "(batch, d_i); for MPE only entries missing from its evidence (observed ones NaN)")

CLIENT_ALLOWED = frozenset({"feature_declaration", "count", "model_parameters", "likelihood_vector",
                            "flow", "cluster_ids", "timing", "query_answer"})
"""Payload classes a client rank may send in an FC job (cluster_ids only with cooccurrence;
query_answer only to the querier, answering its own MPE or sampling query)."""
