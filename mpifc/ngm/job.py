"""FedNGM as an MPI job on the mpifc runtime: rank 0 is the master, every other rank a client.

Protocol (every message is a named kind, so the ledger shows the bytes of each step):

1. client -> master ``ngm.declare``: feature declaration (names, types, category counts) and
   the row count; ``ngm.graph``: the client's local dependency graph (uint8 adjacency).
2. master: merge (intersection of nodes, union of edges), release rule on the consensus graph;
   master -> client ``ngm.release``: the consensus graph and schema, or a refusal.
3. client: trains its NGM on its own rows restricted to the consensus features (eq. 1);
   client -> master ``ngm.model.meta`` + ``ngm.model.array`` (one message per weight array).
4. master: samples every client NGM, trains the global NGM (eq. 2, eq. 3 with public data),
   release rule again; master -> client ``ngm.release`` + the global model (same two kinds).
5. client (optional): stitches its extra features onto the global NGM and retrains.

Client rows never leave their rank. Which rows a client holds is the caller's business (the
CLI reads data_prep shards): :func:`fedngm_rank` takes them as arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.ngm.federation import ReleaseRefused, ReleaseRule, distill_global, stitch, to_stitched_columns, train_stitched
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.graph_recovery import recover_graph
from mpifc.ngm.merge import merge_graphs, merge_schemas
from mpifc.ngm.model import NGM
from mpifc.ngm.schema import Schema
from mpifc.ngm.training import TrainConfig, fit_ngm
from mpifc.runtime.job import JobContext
from mpifc.runtime.kinds import register_kind

DECLARE = register_kind("ngm.declare", "feature_declaration",
                        "client -> master: feature names, types, category counts and row count")
GRAPH = register_kind("ngm.graph", "model_parameters", "client -> master: local dependency graph (uint8 adjacency)")
RELEASE = register_kind("ngm.release", "control",
                        "master -> client: consensus graph/schema or global-model header, or a refusal")
MODEL_META = register_kind("ngm.model.meta", "model_parameters", "NGM metadata: schema, layer sizes, array names")
MODEL_ARRAY = register_kind("ngm.model.array", "model_parameters", "one NGM weight/statistics array")

CLIENT_ALLOWED = frozenset({"feature_declaration", "model_parameters"})
"""Payload classes a client rank sends in a FedNGM job (no data, no samples): its declaration
(feature names, types and row count), its graph and its model weights."""


class PrivacyViolation(RuntimeError):
    """A client rank sent a payload class outside :data:`CLIENT_ALLOWED` (a bug, not bad input)."""


def audit_client_sends(table: Any, master: int = 0) -> dict[str, int]:
    """Check a gathered ledger: every message a client rank sent carries an allowed payload class.

    Args:
        table: the job's :class:`~mpifc.runtime.ledger.LedgerTable` (rank 0 after the gather).
        master: the master's rank; every other source rank is a client.

    Returns:
        Bytes (payload + header) the clients sent per payload class.

    Raises:
        PrivacyViolation: naming the kind, its class and the sending rank.
    """
    from mpifc.runtime.kinds import kind_by_id

    out: dict[str, int] = {}
    rows = table.rows
    for kid, src, pb, hb in zip(rows["kind"].tolist(), rows["src"].tolist(), rows["payload_bytes"].tolist(),
                                rows["header_bytes"].tolist()):
        if src == master:
            continue
        try:
            kind = kind_by_id(kid)
        except KeyError:
            raise PrivacyViolation(f"client rank {src} sent a message of unregistered kind id {kid}") from None
        if kind.payload not in CLIENT_ALLOWED:
            raise PrivacyViolation(f"client rank {src} sent {kind.name!r} ({kind.payload}); FedNGM clients may "
                                   f"send only {sorted(CLIENT_ALLOWED)}")
        out[kind.payload] = out.get(kind.payload, 0) + int(pb + hb)
    return out


@dataclass(frozen=True)
class FedNGMSettings:
    """Job settings (all ranks must agree).

    Attributes:
        min_clients: release rule k (``--min-clients``).
        hidden, activation: architecture of every NGM (clients and global).
        client_config, global_config: training settings.
        graph_alpha, graph_tol: graphical lasso settings for the local graphs.
        total_samples: samples the master draws from the client models in all.
        proportional: draw in proportion to the clients' row counts instead of equally.
        stitch_hidden: extra hidden units per layer when a client stitches; 0 = no stitching.
    """

    min_clients: int = 1
    hidden: tuple[int, ...] = (32, 32)
    activation: str = "elu"
    client_config: TrainConfig = TrainConfig()
    global_config: TrainConfig = TrainConfig()
    graph_alpha: float = 0.05
    graph_tol: float = 0.02
    total_samples: int = 10000
    proportional: bool = False
    stitch_hidden: int = 0


@dataclass
class FedNGMResult:
    """What a rank ends with: the master has ``global_model`` and the consensus graph; a client
    also its ``local_model`` and, when it stitched, ``stitched_model``."""

    graph: DependencyGraph
    global_model: NGM
    local_model: NGM | None = None
    stitched_model: NGM | None = None
    sample_counts: list[int] = field(default_factory=list)


def send_model(ctx: JobContext, model: NGM, dest: int) -> None:
    """Metadata as a small object, then each array with the buffer API."""
    meta, arrays = model.to_payload()
    names = sorted(arrays)
    ctx.transport.send_obj({"meta": meta, "arrays": names}, dest, MODEL_META)
    for name in names:
        ctx.transport.send(np.ascontiguousarray(arrays[name]), dest, MODEL_ARRAY)


def recv_model(ctx: JobContext, source: int) -> NGM:
    head = ctx.transport.recv_obj(source, MODEL_META)
    arrays = {name: ctx.transport.recv(source, MODEL_ARRAY) for name in head["arrays"]}
    return NGM.from_payload(head["meta"], arrays)


def _refuse_all(ctx: JobContext, err: ReleaseRefused) -> None:
    for c in ctx.roles.clients:
        ctx.transport.send_obj({"refused": str(err)}, c, RELEASE)
    raise err


def _master(ctx: JobContext, s: FedNGMSettings, public: np.ndarray | None,
            public_schema: Schema | None) -> FedNGMResult:
    clients = list(ctx.roles.clients)
    labels = [f"client rank {c}" for c in clients]
    rule = ReleaseRule(s.min_clients)
    ctx.ledger.set_phase("ngm.graph")
    decls = [ctx.transport.recv_obj(c, DECLARE) for c in clients]
    schemas = [Schema.from_dict(d["schema"]) for d in decls]
    graphs = [DependencyGraph(sch.names, ctx.transport.recv(c, GRAPH).astype(bool)) for c, sch in zip(clients, schemas)]
    schema = merge_schemas(schemas, labels)
    graph = merge_graphs(graphs, labels).reorder(schema.names)
    try:
        rule.check(labels, "global dependency graph")
    except ReleaseRefused as err:
        _refuse_all(ctx, err)
    for c in clients:
        ctx.transport.send_obj({"schema": schema.to_dict(), "names": list(graph.names)}, c, RELEASE)
        ctx.transport.send(graph.adjacency.astype(np.uint8), c, GRAPH)
    ctx.ledger.set_phase("ngm.local")
    models = [recv_model(ctx, c) for c in clients]
    ctx.ledger.set_phase("ngm.global")
    pub = None
    if public is not None:
        if public_schema is None:
            raise UserError("FedNGM master: public data given without its schema")
        pub = np.asarray(public, dtype=np.float64)[:, [public_schema.index(n) for n in schema.names]]
    glob, counts = distill_global(models, graph, s.total_samples, s.proportional, public=pub, hidden=s.hidden,
                                  activation=s.activation, config=s.global_config)
    try:
        rule.check(labels, "global NGM")
    except ReleaseRefused as err:
        _refuse_all(ctx, err)
    for c in clients:
        ctx.transport.send_obj({"global": True}, c, RELEASE)
        send_model(ctx, glob, c)
    return FedNGMResult(graph, glob, sample_counts=counts)


def _client(ctx: JobContext, s: FedNGMSettings, x: np.ndarray, schema: Schema,
            expert: DependencyGraph | None) -> FedNGMResult:
    master = ctx.roles.coordinator
    x = schema.validate(x, what=f"client rank {ctx.rank} training data")
    ctx.ledger.set_phase("ngm.graph")
    local_graph = expert if expert is not None else recover_graph(x, schema, s.graph_alpha, s.graph_tol)
    local_graph = local_graph.reorder(schema.names)
    ctx.transport.send_obj({"schema": schema.to_dict(), "n_rows": int(x.shape[0])}, master, DECLARE)
    ctx.transport.send(local_graph.adjacency.astype(np.uint8), master, GRAPH)
    head = ctx.transport.recv_obj(master, RELEASE)
    if "refused" in head:
        raise ReleaseRefused(head["refused"])
    common = Schema.from_dict(head["schema"])
    graph = DependencyGraph(tuple(head["names"]), ctx.transport.recv(master, GRAPH).astype(bool))
    ctx.ledger.set_phase("ngm.local")
    x_common = x[:, [schema.index(n) for n in common.names]]
    local = fit_ngm(x_common, common, graph, s.hidden, s.activation, s.client_config)
    send_model(ctx, local, master)
    ctx.ledger.set_phase("ngm.global")
    head = ctx.transport.recv_obj(master, RELEASE)
    if "refused" in head:
        raise ReleaseRefused(head["refused"])
    glob = recv_model(ctx, master)
    result = FedNGMResult(graph, glob, local_model=local)
    if s.stitch_hidden > 0 and len(schema.names) > len(common.names):
        ctx.ledger.set_phase("ngm.stitch")
        st = stitch(glob, schema, local_graph, s.stitch_hidden, seed=s.client_config.seed)
        train_stitched(st, to_stitched_columns(x, schema, st), s.client_config)
        result.stitched_model = st
    return result


def fedngm_rank(ctx: JobContext, settings: FedNGMSettings, x: np.ndarray | None = None,
                schema: Schema | None = None, expert_graph: DependencyGraph | None = None,
                public: np.ndarray | None = None) -> FedNGMResult:
    """Run this rank's part of FedNGM.

    Args:
        ctx: the job context (rank 0 = master).
        settings: the same on every rank.
        x: a client's own ``(n, d)`` rows (ignored on the master).
        schema: the features of ``x`` on a client, of ``public`` on the master.
        expert_graph: a client's expert-given graph instead of graphical lasso recovery.
        public: the master's optional public rows for the extra fit term of eq. 3 (any column
            order containing the consensus features).

    Raises:
        ReleaseRefused: on every rank, when fewer than ``settings.min_clients`` clients contributed.
    """
    if ctx.is_server:
        return _master(ctx, settings, public, schema)
    if x is None or schema is None:
        raise UserError(f"client rank {ctx.rank}: no training data given to the FedNGM job")
    return _client(ctx, settings, x, schema, expert_graph)


def result_summary(result: FedNGMResult) -> dict[str, Any]:
    """Small JSON-able summary (sizes, graph, path norms) for logs and tests."""
    off, on = result.global_model.path_norm_split()
    out = {"features": list(result.graph.names), "edges": sorted(sorted(e) for e in result.graph.edges()),
           "global_parameters": result.global_model.n_parameters(),
           "global_payload_bytes": result.global_model.payload_nbytes(),
           "global_path_norm_off": off, "global_path_norm_on": on, "sample_counts": result.sample_counts}
    if result.stitched_model is not None:
        out["stitched_features"] = list(result.stitched_model.schema.names)
    return out
