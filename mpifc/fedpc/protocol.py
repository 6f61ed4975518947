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
CLASS_TERMS = register_kind("fc.query.class_terms", "model_parameters",
                            "rank -> parent rank (class queries of 16+ classes), once before the first batch: "
                            "per node crossing the link that holds the target its number of terms (0: sent "
                            "as class values), then each such node's class terms (its target leaves' "
                            "log-probabilities of each class), float64")
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


class Shape:
    """The declared payload of one message kind, as the privacy audit checks it.

    Args:
        form: ``"pickle"`` (a small control object) or ``"array"``.
        dtypes: allowed NumPy dtype kinds for arrays (``"f"`` float, ``"i"`` signed,
            ``"u"`` unsigned int, ``"b"`` bool), e.g. ``"f"``.
        axes: one entry per axis: an int (exactly that length), ``"n"`` (any length: leaves, bytes,
            features), or ``"rows"`` (one entry per row the sender holds: per-sample data by
            design, e.g. a cluster id or a likelihood per sample; a flattened per-sample bundle of
            several values per row counts too).
    """

    def __init__(self, form: str, dtypes: str = "", axes: tuple = ()) -> None:
        self.form, self.dtypes, self.axes = form, dtypes, tuple(axes)

    @property
    def per_sample(self) -> bool:
        return "rows" in self.axes

    def problem(self, arr_shape: tuple[int, ...] | None, dtype_kind: str | None) -> str | None:
        """Why a payload does not fit this declaration, or None."""
        if self.form == "pickle":
            return None if arr_shape is None else "an array where a pickled object is declared"
        if arr_shape is None:
            return "a pickled object where an array is declared"
        if dtype_kind not in self.dtypes:
            return f"dtype kind {dtype_kind!r}, declared {self.dtypes!r}"
        if len(arr_shape) != len(self.axes):
            return f"{len(arr_shape)} axes, declared {len(self.axes)} ({self.axes})"
        for got, want in zip(arr_shape, self.axes):
            if isinstance(want, int) and got != want:
                return f"shape {list(arr_shape)}, declared {list(self.axes)}"
        return None

    def describe(self) -> str:
        return "pickle" if self.form == "pickle" else f"{self.dtypes}{list(self.axes)}"


TIMING_VALUES = 8
"""Length of ``fc.train.timing``: CPU and wall seconds of the client phases (read, learn, serialize, em)."""

PAYLOAD_SHAPES: dict[str, Shape] = {
    DECLARE.name: Shape("pickle"), PLAN.name: Shape("pickle"),
    COUNTS.name: Shape("array", "i", ("n", 3)),
    CLUSTER_IDS.name: Shape("array", "u", ("rows",)),
    MODEL.name: Shape("array", "u", ("n",)),
    TIMING.name: Shape("array", "f", (TIMING_VALUES,)),
    DONE.name: Shape("pickle"), QUERY_DECLARE.name: Shape("pickle"),
    EVIDENCE.name: Shape("array", "f", ("rows", "n")),
    VALUES.name: Shape("array", "f", ("rows",)),
    CLASS_TERMS.name: Shape("array", "f", ("n",)),
    EM_STRUCTURE.name: Shape("array", "u", ("n",)),
    FLOWS.name: Shape("array", "f", ("rows",)),
    EM_STATS.name: Shape("array", "f", ("n",)),
    EM_PARAMS.name: Shape("array", "u", ("n",)),
    EM_SUM_STATS.name: Shape("array", "f", ("n",)),
    EM_LEAF_STATS.name: Shape("array", "f", ("n",)),
    EM_LEAF.name: Shape("array", "u", ("n",)),
    MAX_VALUES.name: Shape("array", "f", ("rows",)),
    DECISIONS.name: Shape("array", "u", ("rows",)),
    ANSWER.name: Shape("array", "f", ("rows", "n")),
}
"""The declared payload of every kind above (what :mod:`mpifc.fedpc.audit` checks each message
against). ``rows`` axes are per-sample by design: the query passes carry one value per query row,
exact vertical EM one value per aligned training row, and cluster ids (``--glue cooccurrence``
only) one id per training row."""
