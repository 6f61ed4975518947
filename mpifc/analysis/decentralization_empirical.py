"""The cost of decentralisation on real data: the four vertical-FL settings of the seed paper measured with FedPCs.

Pure logic (no MPI, no files): given per-client training/test blocks of a vertical split in which
every client holds the label, learn the models of the four settings, score them, and count the
bytes each one moves. The experiment driver (:mod:`mpifc.experiments.decentralization`) adds the
datasets and the output files.

Settings (``K`` agents, agent ``k`` sees ``x_k``; losses are test cross-entropies in nats):

* **CL/CI**: one one-pass FedPC over all clients; ``p(y | x)`` from one upward pass with every
  feature observed.
* **CL/DI**: the same FedPC; agent ``k`` computes ``p(y | x_k)`` with the other clients' features
  marginalised (NaN). Reported: the worst agent.
* **DL/CI**: agent ``k`` learns a LearnSPN PC on ``(X_k, Y)`` alone; the agents' class
  log-likelihood vectors ``log p_k(y = c, x_k)`` travel to a combiner, which forms the product of
  experts ``p(y | x) ∝ p(y)^(1-K) Π_k p_k(y | x_k)`` (:func:`product_of_experts`).
* **DL/DI**: agent ``k``'s own ``p_k(y | x_k)``; worst agent.

Which FedPC is "CL" (the label on every client): Algorithm 1 turns a feature held by several
clients into a *shared subspace*, i.e. a sum over the clients' PCs of ``y`` alone, and every
product multiplies that sum with the single-owner cluster PCs. The FedPC is then
``p(y) · Σ_p w_p Π_k p_kp(x_k)``: ``y`` is independent of every feature and ``p(y | x) = p(y)``
for every row (:func:`fedpc_declarations` with ``label_from="all"``; tested). So the CL model used
here lets **only the label owner (client 0) contribute the label** (``label_from="owner"``): its
single-owner subspace is ``(x_0, y)``, clustered and modelled jointly, and ``y`` reaches the other
clients' features through Assumption 2's cluster latent. The glue is ``cooccurrence`` (the
product weights are the joint cluster frequencies): with ``random`` glue the products pair
clusters at random and ``y`` is nearly independent of ``x_{k != 0}``. Cost of that choice, counted
in the training bytes: each client sends one cluster id per training row (1 byte each for
K <= 256: the smallest unsigned dtype holding K - 1, :func:`mpifc.federated.one_pass.cluster_id_dtype`).
``n_clusters = 2`` by default: over the six full cases (breast cancer, Income, credit; 2 and 3
clients) it gave the lowest mean CL/CI loss of ``n_clusters in {2, 4, 8}`` (0.302 vs 0.350 and
0.391 nats); more clusters make client 0's per-cluster PCs sharper and a row routed to the wrong
cluster then costs several nats. ``n_clusters = 1`` (mean 0.298) is no collaboration at all: the
FedPC is a plain product of the clients' PCs, ``y`` only sees ``x_0``, CL/CI equals agent 0's
CL/DI and every other agent's CL/DI is the label prior (tested).

The reported results do not come from this module's single-process run: the experiment runs the
four settings as real MPI jobs (``mpifc train/evaluate`` for CL on label-owner-0
shards, which is exactly ``label_from="owner"``; :mod:`mpifc.analysis.decentralization_job` for the
CL/DI pack and for DL) and reads every byte from their ledgers. :func:`four_settings` is the
in-process reference their predictions are tested against (equal to 1e-9), and gives the
closed forms below.

Bytes in-process (float64 everywhere, 8 bytes a value; what the ledgers' payloads must match where
the messages are arrays of float64):

* Inference, CL/CI: the arrays that cross a rank link in one upward pass with ψ = ``flat`` (leaves
  on their client's rank, inner nodes on the server), measured from the evaluated node values
  (:func:`upward_link_bytes`); closed form ``Σ_leaves 8 · n · m`` with ``m = n_classes`` for the
  leaves whose scope holds ``y`` and 1 otherwise (:func:`fedpc_closed_form_bytes`).
* Inference, DL/CI: ``8 · n_test · n_classes`` per agent (:func:`dl_ci_closed_form_bytes`),
  measured as the ``nbytes`` of the vectors handed to the combiner.
* Inference, CL/DI and DL/DI: 0 (no messages at test time).
* Training, CL: what one-pass training sends (counts, cluster ids, every leaf PC as HDF5 bytes in
  the gather, as :mod:`mpifc.fedpc.train` does). CL/DI adds, per agent, what it needs to
  evaluate the FedPC alone with the others marginalised (:func:`di_pack_bytes`): the structure
  (children ids), the sum weights, and for every other client's leaf that holds ``y`` its label
  marginal (``n_classes`` values); the others' other leaves marginalise to 1 and need nothing.
  Training, DL: nothing but one agent's class counts (``8 · n_classes``) for the combiner's prior
  under DL/CI.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.special import logsumexp

from mpifc.analysis import decentralization as dz
from mpifc.errors import UserError
from mpifc.federated import evaluate as ev
from mpifc.federated.assign import assign_flat
from mpifc.federated.one_pass import (
    ClientDeclaration,
    OnePassBuilder,
    ids_digest,
    pack_cluster_ids,
    run_client_tasks,
)
from mpifc.federated.structure import LEAF, FederatedCircuit

FLOAT_BYTES = 8
LABEL_FROM = ("owner", "all")


# -- inputs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientBlock:
    """One agent's data (it never leaves the agent; only arrays derived from it are counted).

    Attributes:
        index: client index (0 is the label owner of the CL FedPC).
        features: column names; the target is one of them.
        x_train: ``(n_train, d)`` float64, rows aligned across clients.
        ids_train: ``(n_train,)`` int64 sample ids.
        x_test: ``(n_test, d)`` float64, rows aligned across clients, target included.
    """

    index: int
    features: tuple[str, ...]
    x_train: np.ndarray
    ids_train: np.ndarray
    x_test: np.ndarray


@dataclass(frozen=True)
class Schema:
    """Feature meta-data from the manifest: ``meta_types[f]`` and ``n_categories[f]`` (0 = real)."""

    target: str
    n_classes: int
    meta_types: dict[str, str]
    n_categories: dict[str, int]
    feature_order: tuple[str, ...]


@dataclass(frozen=True)
class FedPCConfig:
    """Hyperparameters of both the FedPC (one-pass) and the local PCs (LearnSPN)."""

    n_clusters: int = 2
    glue: str = "cooccurrence"
    n_products: int = 2
    label_from: str = "owner"
    seed: int = 0
    # Gaussian leaves ("auto"). Piecewise/histogram leaves score better on credit's heavy-tailed
    # counts, but give zero density outside the training range (floored at -1e30): a test row
    # out of range then gets the same floor for every class and a meaningless posterior.
    learnspn: dict[str, Any] = field(default_factory=lambda: {"min_instances_slice": 50, "threshold": 0.3})


# -- scores ----------------------------------------------------------------------------------------
def log_posterior(log_joint: np.ndarray) -> np.ndarray:
    """``log p(y = c | evidence)`` ``(n, C)`` from class log-joints ``log p(y = c, evidence)``."""
    return log_joint - logsumexp(log_joint, axis=1, keepdims=True)


def zero_likelihood_rows(log_joint: np.ndarray, floor: float = -1e29) -> int:
    """Rows whose class log-joints are all at the circuit's zero-density floor: no usable posterior."""
    return int(np.sum(np.all(~np.isfinite(log_joint) | (log_joint <= floor), axis=1)))


def product_of_experts(local_log_posteriors: Sequence[np.ndarray], log_prior: np.ndarray) -> np.ndarray:
    """``log p(y | x) ∝ (1 - K) log p(y) + Σ_k log p_k(y | x_k)``, normalised, ``(n, C)`` nats.

    Exact when the ``x_k`` are conditionally independent given ``y`` and every expert's marginal
    of ``y`` is ``p(y)``; otherwise it is the DL/CI combination rule of the issue.
    """
    if not local_log_posteriors:
        raise UserError("product of experts needs at least one expert")
    k = len(local_log_posteriors)
    total = (1 - k) * np.asarray(log_prior, dtype=np.float64)[None, :]
    for lp in local_log_posteriors:
        total = total + lp
    return log_posterior(total)


def cross_entropy(log_post: np.ndarray, y: np.ndarray) -> float:
    """Mean ``-log p(y_i | ·)`` over the test rows, nats."""
    y = np.asarray(y, dtype=np.int64)
    return float(-log_post[np.arange(len(y)), y].mean())


def accuracy(log_post: np.ndarray, y: np.ndarray) -> float:
    return float((np.argmax(log_post, axis=1) == np.asarray(y, dtype=np.int64)).mean())


# -- the CL model: one-pass FedPC --------------------------------------------------------------------
def fedpc_declarations(blocks: Sequence[ClientBlock], schema: Schema, label_from: str = "owner"
                       ) -> list[tuple[ClientDeclaration, np.ndarray]]:
    """``(declaration, x_train)`` per client for Algorithm 1.

    ``label_from="owner"``: only client 0 declares the target (see the module doc);
    ``"all"``: every client does, so Algorithm 1 makes the target a shared subspace.
    """
    if label_from not in LABEL_FROM:
        raise UserError(f"label_from must be one of {LABEL_FROM}, got {label_from!r}")
    out = []
    for b in blocks:
        if schema.target not in b.features:
            raise UserError(f"client {b.index} does not hold the target {schema.target!r}; "
                            f"the four settings need the label on every client (label_owner='all')")
        keep = [f for f in b.features if label_from == "all" or b.index == 0 or f != schema.target]
        cols = [b.features.index(f) for f in keep]
        decl = ClientDeclaration(b.index, tuple(keep), tuple(schema.meta_types[f] for f in keep),
                                 tuple(int(schema.n_categories.get(f, 0)) for f in keep),
                                 int(b.x_train.shape[0]), ids_digest(b.ids_train))
        out.append((decl, b.x_train[:, cols]))
    return out


@dataclass
class TrainedFedPC:
    """The assembled FC (ψ flat) and the bytes its one-pass training sent."""

    fc: FederatedCircuit
    train_bytes: int
    model_bytes: int


def train_fedpc(blocks: Sequence[ClientBlock], schema: Schema, cfg: FedPCConfig) -> TrainedFedPC:
    """Algorithm 1 in one process; the uplink is measured from the arrays a client would send."""
    from mpifc.federated.wire_format import model_to_bytes

    pairs = fedpc_declarations(blocks, schema, cfg.label_from)
    builder = OnePassBuilder(n_clusters=cfg.n_clusters, n_products=max(cfg.n_products, cfg.n_clusters),
                             glue=cfg.glue, seed=cfg.seed, hyperparameters=dict(cfg.learnspn), defaults="learner")
    plan = builder.plan([d for d, _ in pairs], schema.feature_order, schema.target, "vertical")
    reports = [run_client_tasks(plan, d.index, x, d.features) for d, x in pairs]
    sent = 0
    model_bytes = 0
    for r in reports:
        sent += r.counts().nbytes
        if cfg.glue == "cooccurrence" and r.cluster_ids is not None:
            sent += pack_cluster_ids(plan, r.client, r.cluster_ids).nbytes  # as fc_train sends them
        for leaf in r.leaves:
            model_bytes += model_to_bytes(leaf.model).nbytes
    fc = assign_flat(builder.assemble(plan, reports))
    return TrainedFedPC(fc, sent + model_bytes, model_bytes)


def di_pack_bytes(fc: FederatedCircuit, agent: int, schema: Schema) -> int:
    """Bytes the server sends agent ``agent`` so it can compute ``p(y | x_agent)`` with no messages.

    Int64 children ids and float64 sum weights of every inner node, plus ``n_classes`` float64
    label marginals per leaf of *another* client whose scope holds the target.
    """
    total = 0
    for nid in fc.reachable():
        node = fc.nodes[nid]
        if node.op == LEAF:
            if node.leaf.client != agent and schema.target in node.scope:
                total += FLOAT_BYTES * schema.n_classes
            continue
        total += FLOAT_BYTES * len(node.children) + FLOAT_BYTES * len(node.weights)
    return total


def evidence_columns(schema: Schema, blocks: Sequence[ClientBlock], visible: Sequence[int]
                     ) -> dict[str, np.ndarray]:
    """Test evidence as FC columns: features of the ``visible`` clients; the rest and y are NaN."""
    n = blocks[0].x_test.shape[0]
    cols = {f: np.full(n, np.nan) for f in schema.feature_order}
    for b in blocks:
        if b.index in visible:
            for j, f in enumerate(b.features):
                if f != schema.target:
                    cols[f] = b.x_test[:, j]
    return cols


def fedpc_class_values(fc: FederatedCircuit, cols: dict[str, np.ndarray], schema: Schema
                       ) -> dict[int, np.ndarray]:
    """Every node's class log-values ``{id: (n, m)}`` from one upward pass (the target expanded)."""
    return ev.upward(fc, cols, ev.Query(schema.target, schema.n_classes))


def upward_link_bytes(fc: FederatedCircuit, values: dict[int, np.ndarray]) -> int:
    """Bytes of the node values that cross a rank link in that pass (ψ as set on ``fc``)."""
    return int(sum(values[nid].astype(np.float64).nbytes
                   for ids in fc.rank_edges().values() for nid in ids))


def fedpc_closed_form_bytes(fc: FederatedCircuit, n_test: int, schema: Schema) -> int:
    """``Σ_{crossing nodes} 8 · n_test · m`` with ``m = n_classes`` if the scope holds ``y``."""
    total = 0
    for ids in fc.rank_edges().values():
        for nid in ids:
            m = schema.n_classes if schema.target in fc.nodes[nid].scope else 1
            total += FLOAT_BYTES * n_test * m
    return total


# -- the DL models: one LearnSPN per agent -------------------------------------------------------------
def learn_local_pc(block: ClientBlock, schema: Schema, cfg: FedPCConfig) -> Any:
    """Agent ``k``'s own PC on ``(X_k, Y)``, from its rows only."""
    from mpifc.federated.one_pass import derive_seed
    from mpifc.federated.learners import fit_leaf

    meta = [schema.meta_types[f] for f in block.features]
    cats = [int(schema.n_categories.get(f, 0)) for f in block.features]
    return fit_leaf("learnspn", block.x_train, meta, derive_seed(cfg.seed, 0x444C, block.index),
                    n_categories=cats, **cfg.learnspn)


def local_class_log_joint(model: Any, block: ClientBlock, schema: Schema) -> np.ndarray:
    """``log p_k(y = c, x_k)`` ``(n_test, C)`` float64: the vector agent ``k`` sends under DL/CI."""
    t = block.features.index(schema.target)
    n, c = block.x_test.shape[0], schema.n_classes
    rep = np.repeat(block.x_test, c, axis=0)
    rep[:, t] = np.tile(np.arange(c, dtype=np.float64), n)
    v = model.log_likelihood(rep)
    v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
    return np.asarray(v, dtype=np.float64).reshape(n, c)


def dl_ci_closed_form_bytes(n_test: int, n_classes: int, n_agents: int) -> int:
    """``8 · n_test · n_classes`` per agent: the class log-likelihood vectors sent upward."""
    return FLOAT_BYTES * n_test * n_classes * n_agents


# -- the four settings ---------------------------------------------------------------------------------
@dataclass
class SettingResult:
    """One setting's scores. ``per_agent`` losses for DI settings (worst = the reported one)."""

    setting: str
    cross_entropy: float
    accuracy: float
    train_bytes: int
    infer_bytes: int
    worst_agent: int | None = None
    per_agent: tuple[float, ...] = ()
    closed_form_infer_bytes: int = 0


def _worst(scores: list[tuple[float, float]]) -> tuple[int, float, float]:
    k = int(np.argmax([ce for ce, _ in scores]))
    return k, scores[k][0], scores[k][1]


def four_settings(blocks: Sequence[ClientBlock], schema: Schema, y_train: np.ndarray,
                  cfg: FedPCConfig = FedPCConfig()) -> tuple[dict[str, SettingResult], dict[str, Any]]:
    """Learn and score CL/CI, CL/DI, DL/CI, DL/DI.

    Args:
        blocks: the ``K`` agents' data, label on every agent, rows aligned.
        y_train: ``(n_train,)`` training labels (every agent holds them; used for ``p(y)``).

    Returns:
        ``{setting: SettingResult}`` and extras (the FC, sizes, zero-likelihood row counts, label-prior
        loss, and ``log_post``: ``{setting: [log p(y | ·) (n_test, C)]}``, one per agent for DI).
        This is the in-process reference; the experiment runs the same settings as MPI jobs
        (:mod:`mpifc.analysis.decentralization_job`) and takes the bytes from their ledgers.
    """
    if len(blocks) < 1:
        raise UserError("four_settings needs at least one agent")
    k_agents = len(blocks)
    tj = blocks[0].features.index(schema.target)
    y = blocks[0].x_test[:, tj].astype(np.int64)
    n = len(y)

    trained = train_fedpc(blocks, schema, cfg)
    fc = trained.fc
    values = fedpc_class_values(fc, evidence_columns(schema, blocks, [b.index for b in blocks]), schema)
    zero = {"CL/CI": zero_likelihood_rows(values[fc.root])}
    ci = log_posterior(values[fc.root])
    measured = upward_link_bytes(fc, values)
    res = {"CL/CI": SettingResult("CL/CI", cross_entropy(ci, y), accuracy(ci, y), trained.train_bytes,
                                  measured, closed_form_infer_bytes=fedpc_closed_form_bytes(fc, n, schema))}
    di = []
    posts: dict[str, list[np.ndarray]] = {"CL/CI": [ci], "CL/DI": [], "DL/CI": [], "DL/DI": []}
    for b in blocks:
        lj = fedpc_class_values(fc, evidence_columns(schema, blocks, [b.index]), schema)[fc.root]
        zero["CL/DI"] = zero.get("CL/DI", 0) + zero_likelihood_rows(lj)
        lp = log_posterior(lj)
        posts["CL/DI"].append(lp)
        di.append((cross_entropy(lp, y), accuracy(lp, y)))
    k, ce_, acc = _worst(di)
    di_bytes = sum(di_pack_bytes(fc, b.index, schema) for b in blocks)
    res["CL/DI"] = SettingResult("CL/DI", ce_, acc, trained.train_bytes + di_bytes, 0,
                                 k, tuple(s for s, _ in di))

    counts = np.bincount(np.asarray(y_train, dtype=np.int64), minlength=schema.n_classes).astype(np.float64)
    log_prior = np.log((counts + 1.0) / (counts.sum() + schema.n_classes))  # Laplace, like the leaves
    sent: list[np.ndarray] = []
    local = []
    for b in blocks:
        model = learn_local_pc(b, schema, cfg)
        lj = local_class_log_joint(model, b, schema)
        sent.append(lj)
        zero["DL"] = zero.get("DL", 0) + zero_likelihood_rows(lj)
        lp = log_posterior(lj)
        posts["DL/DI"].append(lp)
        local.append((cross_entropy(lp, y), accuracy(lp, y)))
    poe = product_of_experts([log_posterior(v) for v in sent], log_prior)
    posts["DL/CI"].append(poe)
    dl_train = counts.nbytes
    closed = dl_ci_closed_form_bytes(n, schema.n_classes, k_agents)
    res["DL/CI"] = SettingResult("DL/CI", cross_entropy(poe, y), accuracy(poe, y), dl_train,
                                 int(sum(v.nbytes for v in sent)), closed_form_infer_bytes=closed)
    k, ce_, acc = _worst(local)
    res["DL/DI"] = SettingResult("DL/DI", ce_, acc, 0, 0, k, tuple(s for s, _ in local))
    extras = {"fc": fc, "n_test": n, "n_train": int(len(y_train)), "n_agents": k_agents,
              "fc_leaves": len(fc.leaves), "zero_likelihood_rows": zero, "log_post": posts,
              "label_prior_ce": cross_entropy(
                  np.broadcast_to(log_prior, (n, schema.n_classes)), y)}
    return res, extras


def cl_losses(blocks: Sequence[ClientBlock], schema: Schema, cfg: FedPCConfig
              ) -> tuple[float, tuple[float, ...]]:
    """CL/CI cross-entropy and the per-agent CL/DI cross-entropies of one FedPC (nats)."""
    y = blocks[0].x_test[:, blocks[0].features.index(schema.target)].astype(np.int64)
    fc = train_fedpc(blocks, schema, cfg).fc

    def ce(visible: list[int]) -> float:
        values = fedpc_class_values(fc, evidence_columns(schema, blocks, visible), schema)
        return cross_entropy(log_posterior(values[fc.root]), y)

    return ce([b.index for b in blocks]), tuple(ce([b.index]) for b in blocks)


# -- Table I and eq. 14 ----------------------------------------------------------------------------------
def as_losses(results: dict[str, SettingResult]) -> dz.SettingLosses:
    """The empirical ``R`` of each setting in :class:`dz.SettingLosses` form (worst agent)."""
    per = {s: (results[s].per_agent or (results[s].cross_entropy,)) for s in dz.SETTINGS}
    return dz.SettingLosses(per_agent=per)


def empirical_costs(results: dict[str, SettingResult]) -> dict[tuple[str, str], float]:
    """``C^{a-b} = R^a - R^b`` (nats) for the pairs of Table I; negative = ordering violated."""
    return dz.table_i_costs(as_losses(results))


def eq14_departures(results: dict[str, SettingResult], tol: float = 1e-9) -> list[str]:
    """Which inequalities of eq. 14 the measured losses break (empty list: eq. 14 holds).

    Eq. 14: ``R(CL/CI) <= min(R(CL/DI), R(DL/CI)) <= max(R(CL/DI), R(DL/CI)) <= R(DL/DI)``.
    """
    r = {s: as_losses(results).R(s) for s in dz.SETTINGS}
    out = []
    for a, b in (("CL/CI", "CL/DI"), ("CL/CI", "DL/CI"), ("CL/DI", "DL/DI"), ("DL/CI", "DL/DI")):
        if r[a] > r[b] + tol:
            out.append(f"R({a}) = {r[a]:.4f} > R({b}) = {r[b]:.4f}")
    return out
