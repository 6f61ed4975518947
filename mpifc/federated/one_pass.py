"""One-pass training (Algorithm 1 of the paper), split into a *plan* and an *assembly*.

1. Clients declare feature names, meta-types, row counts (:class:`ClientDeclaration`).
2. :meth:`OnePassBuilder.plan` builds the indicator matrix ``M`` (clients × features), groups
   features by identical columns into subspaces ``S(j)`` with owners ``O_S(j)``, and tells every
   client what to learn (:class:`LeafTask`): one PC per shared subspace over all its rows, and for
   its single-owner subspace K k-means clusters with one PC each. Seeds derive from
   ``(seed, client index, subspace, cluster)``, never from ranks.
3. Clients run :func:`run_client_tasks` on their own rows and report counts (and, for the
   ``cooccurrence`` glue, one cluster id per aligned row). Opt-in plan hyperparameter
   :data:`CLUSTER_WITHOUT_TARGET`: the label owner's k-means leaves the target column out.
4. :meth:`OnePassBuilder.assemble` builds the circuit: a sum per shared subspace, products that
   take every sum plus one cluster-PC per single-owner subspace (the glue), a root sum over the
   products, weights from row counts; trivial nodes are collapsed. Models can be inserted later
   (:func:`insert_models`), so the server needs only counts to build the structure.

Glue modes (single-owner part):

* ``random`` — the paper: P products, each cluster-PC a child of at least one. Product weights use
  the paper's rule ``w_i = ρ(N_i) / Σ ρ`` with ``ρ(N) = Σ_{C ∈ ch(N)} ρ(C)`` and ``ρ(leaf) =``
  its training rows (sums contribute the rows of all their leaves, a constant per product).
* ``combinatorial`` — all ``Π_j k_j`` combinations. Weight of a combination is the product of the
  cluster fractions ``Π_j n_{j,k_j} / n_j``: what Assumption 2 gives when the cluster choices are
  independent (the only joint the server can form from per-client counts).
* ``class`` — for classification (the adaptive default with a target,
  :func:`mpifc.federated.defaults.default_glue`): a client splits the rows of each subspace whose
  owners all hold the target by the target's class instead of k-means (the class is each
  client's own knowledge, so nothing travels but counts per class); other single-owner subspaces
  (vertical data: the clients without the target) are k-means clustered; under the adaptive
  defaults, when one client lacks the target, its columns in groups
  (:func:`mpifc.federated.defaults.class_glue_groups`), each group clustered on its own and
  entering every class's product as one sum over its clusters (``FederationPlan.factorized``:
  the groups independent given the class). Otherwise the root has, per class
  ``y`` and combination of those clusters, one product over the class-``y`` PCs of every
  class-split subspace (a shared subspace: their sum over its owners holding the class, by rows)
  and the clusters, weighted by the class's rows times the clusters' fractions. ``p(y | x)`` then
  uses every hybrid client's private features (independent given ``y`` across subspaces), which
  the random glue, pairing clusters without any tie to the class, cannot; on vertical data exact
  EM (``--refine em``) learns how classes and clusters go together. A single-owner class-split
  subspace whose client holds no row of a class stands in its PC over all its rows.
* ``cooccurrence`` — opt-in, vertical/hybrid with aligned ids: each single-owner client sends one
  cluster id per training row (rows in the shared id order). The server counts joint assignments
  and makes one product per observed combination, weighted by its frequency: Assumption 2's latent
  mixture estimated directly. **What it reveals:** to the server, a K-ary label per sample id per
  client, i.e. which of the client's K k-means groups every shared sample fell into (and hence the
  joint cluster histogram). No feature values are sent.
"""
from __future__ import annotations

import copy
import hashlib
import json
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
# derive_seed's SeedSequence: numpy imports numpy.random lazily, on first use, which would charge
# ~10 ms of import time to the server's first plan (a timed phase of mpifc.fedpc.train).
import numpy.random  # noqa: F401

from mpifc.circuit.privacy import MIN_LEAF_ROWS
from mpifc.errors import UserError
from mpifc.federated.structure import (
    AVERAGE,
    PRODUCT,
    SUM,
    ClientInfo,
    FederatedCircuit,
    LeafInfo,
)

GLUE_MODES = ("random", "combinatorial", "cooccurrence", "class")


# -- declarations and plan ---------------------------------------------------------------------
@dataclass(frozen=True)
class ClientDeclaration:
    """What a client tells the server before training (no data).

    Attributes:
        index: client index from the manifest.
        features: feature names the client holds, in its column order.
        meta_types: per feature, "real", "discrete" or "categorical".
        n_categories: per feature, number of categories (0 for real).
        n_rows: training rows.
        ids_digest: SHA-256 of the client's training sample ids (int64 bytes, in row order),
            used only to check vertical alignment.
    """

    index: int
    features: tuple[str, ...]
    meta_types: tuple[str, ...]
    n_categories: tuple[int, ...]
    n_rows: int
    ids_digest: str = ""


def ids_digest(ids: np.ndarray) -> str:
    """Digest of a sample-id vector (order matters: aligned clients store ids in the same order)."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()


@dataclass(frozen=True)
class Subspace:
    """A feature group ``S(j)``: features sharing one column of ``M``, held by ``owners``."""

    index: int
    features: tuple[str, ...]
    owners: tuple[int, ...]

    @property
    def shared(self) -> bool:
        return len(self.owners) > 1


@dataclass(frozen=True)
class LeafTask:
    """One thing a client must learn: PCs over ``features`` of its rows.

    ``n_clusters == 0`` means one PC over all rows (shared subspace); otherwise the rows are split
    into up to ``n_clusters`` k-means clusters with one PC each, or, ``by_class`` (the ``class``
    glue), by the plan target's class (``n_clusters`` classes, cluster id = class code).
    """

    client: int
    subspace: int
    features: tuple[str, ...]
    n_clusters: int
    seed: int
    learner: str
    by_class: bool = False


@dataclass
class FederationPlan:
    """Everything the clients need to learn their PCs, and the server to assemble the FC."""

    features: tuple[str, ...]
    meta_types: dict[str, str]
    n_categories: dict[str, int]
    subspaces: list[Subspace]
    tasks: list[LeafTask]
    declarations: dict[int, ClientDeclaration]
    glue: str
    n_clusters: int
    n_products: int
    seed: int
    target: str | None = None
    setting: str = ""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    kind: str = "fedpc"  # "fedpc" (Algorithm 1) or "fcdt" (trees averaged at the root)
    # "adaptive": hyperparameters the user did not set follow mpifc.federated.defaults (per PC);
    # "learner": every learner's own defaults
    defaults: str = "adaptive"
    # class glue: the clustered subspaces are column groups of their clients, independent given
    # the class (one sum per class and group at the root), instead of joined by combinations
    factorized: bool = False

    def tasks_for(self, client: int) -> list[LeafTask]:
        return [t for t in self.tasks if t.client == client]

    @property
    def indicator_matrix(self) -> np.ndarray:
        """``M`` ``(n_clients, n_features)`` int8, rows in ascending client index."""
        clients = sorted(self.declarations)
        col = {f: j for j, f in enumerate(self.features)}
        m = np.zeros((len(clients), len(self.features)), dtype=np.int8)
        for i, c in enumerate(clients):
            for f in self.declarations[c].features:
                m[i, col[f]] = 1
        return m


def derive_seed(*parts: int) -> int:
    """A 32-bit seed from integer parts (e.g. ``(seed, client, subspace, cluster)``)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


# -- client side -------------------------------------------------------------------------------
@dataclass
class LeafReport:
    """One learned PC: which task, which cluster, how many rows; the model stays on the client
    until the gather."""

    client: int
    subspace: int
    cluster: int
    n_rows: int
    learner: str
    features: tuple[str, ...]
    model: Any = None


@dataclass
class ClientReport:
    """What a client produced: its leaves and, for cooccurrence, per-row cluster ids.

    ``cluster_ids`` is ``(n_rows,)`` int64 (cluster of each training row in its single-owner
    subspace, rows in id order) or ``None``. On the wire it travels in the smallest unsigned
    dtype that holds ``K - 1`` (:func:`pack_cluster_ids`, :func:`unpack_cluster_ids`).
    """

    client: int
    leaves: list[LeafReport]
    cluster_ids: np.ndarray | None = None

    def counts(self) -> np.ndarray:
        """``(n_leaves, 3)`` int64 rows ``(subspace, cluster, n_rows)``: all the server needs."""
        return np.array([[r.subspace, r.cluster, r.n_rows] for r in self.leaves], dtype=np.int64).reshape(-1, 3)

    @classmethod
    def from_counts(cls, client: int, counts: np.ndarray, plan: FederationPlan,
                    cluster_ids: np.ndarray | None = None) -> "ClientReport":
        """Rebuild a model-less report from :meth:`counts` (server side)."""
        tasks = {t.subspace: t for t in plan.tasks_for(client)}
        leaves = []
        for s, k, n in np.asarray(counts, dtype=np.int64).reshape(-1, 3).tolist():
            t = tasks.get(s)
            if t is None:
                raise UserError(f"client {client} reported a PC for subspace {s}, which it was not asked to learn")
            leaves.append(LeafReport(client, s, k, n, t.learner, t.features))
        return cls(client, leaves, cluster_ids)


def cluster_rows(x: np.ndarray, k: int, seed: int, cards: Sequence[int] | None = None) -> np.ndarray:
    """k-means labels ``(n,)`` int64 in ``0..k'-1`` (``k' <= k``; empty clusters dropped).

    ``cards``: per column, the categories of a categorical column (0 for the others). A
    categorical column of more than two categories enters k-means one-hot, as in LearnSPN's own
    row split (:func:`mpifc.circuit.splitting.clustering_features`): its codes carry no distance,
    and standardised codes would put two makes or schools that happen to be numbered apart
    farther from each other than from a third. Every other column enters standardised."""
    n = x.shape[0]
    k = min(k, n)
    if k <= 1:
        return np.zeros(n, dtype=np.int64)
    # KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(z), same labels, in numpy
    # (mpifc.circuit.kmeans; imported here: only ranks that cluster load it).
    # With native pools at one thread, as LearnSPN's own k-means: Lloyd's partial sums depend on
    # the OpenMP thread count, so the labels (and the model) would otherwise depend on the
    # machine's cores in near-ties; the same seed gives the same clusters everywhere.
    from mpifc.circuit.splitting import absorb_small_clusters, first_appearance, kmeans_labels, single_native_thread

    scale = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)
    if cards is not None and any(int(c) > 2 for c in cards):
        from mpifc.circuit.splitting import clustering_features

        onehot = [int(c) > 2 for c in cards]
        z = clustering_features(np.where(onehot, x, z), onehot, [int(c) for c in cards])
    # no more clusters than distinct rows (a class-glue group of one column of a few values)
    k = min(k, len(np.unique(z, axis=0)))
    if k <= 1:
        return np.zeros(n, dtype=np.int64)
    with single_native_thread():
        labels = kmeans_labels(z, k, 3, seed)
    # Ids by first appearance (compact, independent of k-means' numbering); a cluster of one row
    # would be a PC of that row alone: it joins the nearest cluster.
    return absorb_small_clusters(z, first_appearance(labels))


# -- cluster ids on the wire (cooccurrence glue) -----------------------------------------------
_ID_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)


def cluster_id_dtype(n_clusters: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds cluster ids ``0..n_clusters-1``.

    uint8 for K <= 256, uint16 for K <= 65,536, then uint32, uint64. It depends on the plan's K
    only (never on the data), so the server knows which dtype to expect before it receives.
    """
    k = int(n_clusters)
    if k < 1:
        raise ValueError(f"cluster_id_dtype: K must be >= 1, got {k}")
    for dt in _ID_DTYPES:
        if k - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"cluster_id_dtype: K = {k} does not fit uint64")


def cluster_id_task(plan: FederationPlan, client: int) -> LeafTask | None:
    """The clustered task whose row labels ``client`` reports as ``cluster_ids`` (``None``: none).

    Every single-owner feature of a client has the same indicator column, so a client owns at
    most one single-owner subspace; should there be several, :func:`run_client_tasks` reports the
    labels of the last one, and so does this.
    """
    clustered = [t for t in plan.tasks_for(client) if t.n_clusters > 0]
    return clustered[-1] if clustered else None


def pack_cluster_ids(plan: FederationPlan, client: int, ids: np.ndarray) -> np.ndarray:
    """Client side: ``ids`` (``(n_rows,)``, values in ``0..K-1``) in :func:`cluster_id_dtype` of the
    plan's K for this client's clustered task, ready to send (1 B per row for K <= 256)."""
    task = cluster_id_task(plan, client)
    if task is None:
        raise ValueError(f"client {client}: the plan gives it no clustered task, so no cluster ids to send")
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() >= task.n_clusters)):
        raise ValueError(f"client {client}: cluster ids of shape {a.shape} with values outside "
                         f"0..{task.n_clusters - 1}")
    return a.astype(cluster_id_dtype(task.n_clusters))


def unpack_cluster_ids(plan: FederationPlan, report: ClientReport, ids: np.ndarray, source: str) -> np.ndarray:
    """Server side: check the cluster ids a client sent and return them as int64 for counting.

    ``report`` is the client's model-less report (:meth:`ClientReport.from_counts`): its leaves
    give K', the number of cluster PCs the client learned for its clustered subspace (K' <= K,
    k-means may leave clusters empty). Accepted: exactly :func:`cluster_id_dtype` of the plan's
    K, shape ``(n_rows,)`` with the client's declared row count, values in ``0..K'-1``.

    Raises:
        UserError: naming ``source`` (e.g. ``"client 1 (rank 2)"``) and what is wrong.
    """
    c = report.client
    task = cluster_id_task(plan, c)
    if task is None:
        raise UserError(f"{source}: sent cluster ids, but the plan gives it no clustered subspace")
    a = np.asarray(ids)
    want = cluster_id_dtype(task.n_clusters)
    n_rows = plan.declarations[c].n_rows if c in plan.declarations else None
    if a.dtype != want or a.ndim != 1 or (n_rows is not None and a.shape[0] != n_rows):
        raise UserError(f"{source}: cluster ids (fc.train.cluster_ids) arrived as {a.dtype} {tuple(a.shape)}; "
                        f"expected {want} ({n_rows if n_rows is not None else 'n_rows'},) for K = {task.n_clusters}")
    k_found = sum(1 for r in report.leaves if r.subspace == task.subspace and r.cluster >= 0)
    if a.size and int(a.max()) >= k_found:
        raise UserError(f"{source}: cluster ids outside 0..{k_found - 1} (it reported {k_found} cluster PCs "
                        f"for subspace {task.subspace}; largest id {int(a.max())})")
    return a.astype(np.int64)


# Plan hyperparameter (opt-in, default off): the label owner clusters its rows without the target.
CLUSTER_WITHOUT_TARGET = "cluster_without_target"
"""Key of :attr:`FederationPlan.hyperparameters` (``fc_job train --cluster-without-target``).

Off (absent or false, the default: Algorithm 1 as written), a single-owner subspace is k-means
clustered on all its columns; when the subspace holds the classification target (the label
owner's, e.g. vertical Table 7), k-means may split the rows by label, and each "label cluster"
PC then predicts one class for every row it dominates. On: the k-means input of a subspace that
holds ``plan.target`` leaves the target column out (the cluster PCs still model every column of
the subspace, the target included; only the row split ignores the label). A subspace holding
nothing but the target is then one cluster. Seeds, tasks and messages are unchanged, so the same
seed still gives the same model regardless of rank placement. Not a learner hyperparameter:
:func:`run_client_tasks` removes it before calling the learner.
"""


TARGET_FIRST = "target_first"
"""Hyperparameter key (``--hp target_first=1|0``): a LearnSPN PC that holds the target splits its
rows by the target's value first (``learn_spn(class_column=...)``: ``p(y) p(x | y)``, so the
prediction uses every other column of the PC). On by default under the adaptive defaults
(:mod:`mpifc.federated.defaults`), off otherwise; ignored by other learners and by PCs without
the target."""


def hp_flag(value: Any, name: str) -> bool:
    """A boolean plan option as given in code or through ``--hp KEY=VALUE`` (int/str)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false", "yes", "no"):
        return value.strip().lower() in ("1", "true", "yes")
    raise UserError(f"hyperparameter {name}={value!r}: expected true/false (or 1/0)")


def clusters_without_target(hyperparameters: dict[str, Any]) -> bool:
    """Whether plan ``hyperparameters`` switch :data:`CLUSTER_WITHOUT_TARGET` on (absent: off)."""
    return hp_flag(hyperparameters.get(CLUSTER_WITHOUT_TARGET, False), CLUSTER_WITHOUT_TARGET)


def cluster_columns(plan: FederationPlan, task: LeafTask) -> list[int]:
    """Positions in ``task.features`` that the task's k-means sees (:data:`CLUSTER_WITHOUT_TARGET`)."""
    cols = list(range(len(task.features)))
    if clusters_without_target(plan.hyperparameters):
        if plan.target is None:
            raise UserError(f"hyperparameter {CLUSTER_WITHOUT_TARGET}: the data has no target column to leave out")
        cols = [j for j in cols if task.features[j] != plan.target]
    return cols


DEFAULTS_MODES = ("adaptive", "learner")
""":attr:`FederationPlan.defaults`: the adaptive rule of :mod:`mpifc.federated.defaults`, or
each learner's own defaults."""


def leaf_candidates(plan: FederationPlan, task: LeafTask, n_rows: int, cluster: int | None = None
                    ) -> list[dict[str, Any]]:
    """The learner hyperparameters of one PC of ``task`` fitted on ``n_rows`` rows: the plan's
    (the user's) keys, completed by :func:`mpifc.federated.defaults.adaptive_hyperparameters`
    when ``plan.defaults == "adaptive"``; several candidates where the defaults leave a choice to
    held-out rows (:func:`mpifc.federated.defaults.target_candidates`), in order of preference.
    :data:`TARGET_FIRST` becomes LearnSPN's ``class_column`` where the PC holds the target.

    A LearnSPN PC that holds a target of :data:`~mpifc.federated.defaults.SEPARABLE_CLASSES` classes
    or more sizes its RDC features per column (``rdc_widths="own"``, unless the user set it): with
    the shared width, the target's hundreds of values would widen every column's features to
    as many, and the eigensolves grow with the cube of that width.

    ``cluster``: the PC's cluster id; the class glue's pool of rare classes (cluster id = the
    number of classes, :func:`pool_rare_classes`) holding the target is cut into row clusters
    down to :data:`~mpifc.federated.defaults.POOL_MIN_SLICE` rows (with the adaptive defaults,
    unless the user set ``min_instances_slice``)."""
    from mpifc.federated.defaults import POOL_MIN_SLICE, SEPARABLE_CLASSES, adaptive_hyperparameters, target_candidates

    explicit = {k: v for k, v in plan.hyperparameters.items()
                if k != CLUSTER_WITHOUT_TARGET and not k.startswith("dp_")}
    hp = dict(explicit)
    if plan.defaults == "adaptive" and plan.kind == "fedpc":
        meta = [plan.meta_types[f] for f in task.features]
        hp = adaptive_hyperparameters(task.learner, n_rows, meta, plan.target in task.features, hp)
    # a class-split PC holds one class: there is no target split to choose
    holds = (task.learner == "learnspn" and plan.target is not None and plan.target in task.features
             and not task.by_class)
    if task.by_class:
        hp.pop(TARGET_FIRST, None)
    n_classes = int(plan.n_categories.get(plan.target, 0) or 0) if plan.target else 0
    if (task.learner == "learnspn" and plan.target in task.features and n_classes >= SEPARABLE_CLASSES
            and "rdc_widths" not in hp):
        hp["rdc_widths"] = "own"
    if (plan.defaults == "adaptive" and task.by_class and cluster == task.n_clusters and task.learner == "learnspn"
            and plan.target in task.features and "min_instances_slice" not in explicit):
        hp["min_instances_slice"] = POOL_MIN_SLICE
    if hp.get(TARGET_FIRST) == "auto" and not holds:
        hp.pop(TARGET_FIRST)
    out = []
    for cand in target_candidates(hp, explicit):
        if TARGET_FIRST in cand and hp_flag(cand.pop(TARGET_FIRST), TARGET_FIRST) and holds:
            cand["class_column"] = task.features.index(plan.target)
        out.append(cand)
    return out


def leaf_hyperparameters(plan: FederationPlan, task: LeafTask, n_rows: int) -> dict[str, Any]:
    """The first (preferred) of :func:`leaf_candidates`."""
    return leaf_candidates(plan, task, n_rows)[0]


def held_out_macro_f1(model: Any, rows: np.ndarray, target: int, n_classes: int) -> float:
    """Macro F1 of ``model``'s arg-max ``p(y | x)`` on ``rows`` ``(n, d)`` whose column ``target``
    holds the class code; classes neither present nor predicted are left out of the mean."""
    n = len(rows)
    z = np.repeat(rows, n_classes, axis=0)
    z[:, target] = np.tile(np.arange(n_classes, dtype=np.float64), n)
    # the model's numpy likelihoods when it has them (no torch on a client that fits LearnSPN)
    fast = getattr(model, "log_likelihood_numpy", None)
    ll = np.asarray(fast(z) if fast is not None else model.log_likelihood(z), dtype=np.float64).reshape(n, n_classes)
    pred, y = ll.argmax(1), rows[:, target].astype(np.int64)
    f1 = []
    for c in range(n_classes):
        tp, fp, fn = np.sum((pred == c) & (y == c)), np.sum((pred == c) & (y != c)), np.sum((pred != c) & (y == c))
        if tp + fp + fn:
            f1.append(2.0 * tp / (2.0 * tp + fp + fn))
    return float(np.mean(f1)) if f1 else 0.0


def fit_pc(fit: Callable[..., Any], plan: FederationPlan, task: LeafTask, x: np.ndarray, seed: int,
           held: np.ndarray | None = None, cluster: int | None = None, **extra: Any) -> Any:
    """Fit one PC of ``task`` on ``x`` ``(n, len(task.features))`` with its
    :func:`leaf_candidates`; the model records what it was fitted with (``fit_record``).

    Several candidates: each is fitted and scored by :func:`held_out_macro_f1` of the target on
    ``held`` (the client's validation rows of these columns, when it has at least
    :data:`~mpifc.federated.defaults.MIN_HELD_OUT`), else on a seeded fifth of ``x`` held out of
    the fit, after which the winner is refitted on all of ``x``. Ties go to the earlier candidate;
    too few rows to hold out, or more than :data:`~mpifc.federated.defaults.MAX_SCORED_CLASSES`
    classes: the first candidate, unscored."""
    from mpifc.federated.defaults import HELD_OUT_FRACTION, MAX_SCORED_CLASSES, MIN_HELD_OUT

    meta = [plan.meta_types[f] for f in task.features]
    ks = [plan.n_categories.get(f, 0) for f in task.features]
    cands = leaf_candidates(plan, task, len(x), cluster)
    n_classes = int(plan.n_categories.get(plan.target, 0) or 0) if plan.target else 0
    choice: dict[str, Any] | None = None
    hp = cands[0]
    model = None
    if len(cands) > 1 and 2 <= n_classes <= MAX_SCORED_CLASSES:
        j = task.features.index(plan.target)
        if held is not None and len(held) >= MIN_HELD_OUT:
            train, test, where = x, held, "validation rows"
        else:
            n_held = int(len(x) * HELD_OUT_FRACTION)
            order = np.random.default_rng(derive_seed(seed, 0x68656C64)).permutation(len(x))
            train, test, where = x[np.sort(order[n_held:])], x[np.sort(order[:n_held])], "held-out training rows"
        if len(test) >= MIN_HELD_OUT:
            fitted = [fit(task.learner, train, meta, seed, n_categories=ks, **c, **extra) for c in cands]
            scores = [held_out_macro_f1(m, test, j, n_classes) for m in fitted]
            best = int(np.argmax(scores))
            hp = cands[best]
            model = fitted[best] if train is x else None
            # the candidates by name (their settings follow from the plan): the record travels with
            # the model, so it stays a few dozen bytes
            names = ["class_split" if "class_column" in c else "joint" for c in cands]
            choice = {"on": where, "rows": int(len(test)), "candidates": names,
                      "macro_f1": [round(float(v), 6) for v in scores], "chosen": names[best]}
    if model is None:
        model = fit(task.learner, x, meta, seed, n_categories=ks, **hp, **extra)
    if choice is not None:
        # Only the choice travels with the model (a few dozen bytes): the settings themselves
        # follow from the plan and the row count (record_hyperparameters recomputes them).
        try:
            model.fit_record = {"choice": choice}
        except AttributeError:
            pass  # a model without instance attributes: the choice goes unrecorded
    return model


def run_client_tasks(plan: FederationPlan, client: int, x: np.ndarray, features: Sequence[str],
                     fit: Callable[..., Any] | None = None, x_valid: np.ndarray | None = None,
                     device: str | None = None) -> ClientReport:
    """Learn every PC the plan asks of ``client`` on its rows ``x`` ``(n_rows, len(features))``.

    Clustered tasks split the rows by k-means over :func:`cluster_columns` (all the task's
    columns unless the plan sets :data:`CLUSTER_WITHOUT_TARGET`) and fit one PC per cluster on
    all the task's columns. Every PC is fitted by :func:`fit_pc` with the hyperparameters of its
    own rows.

    Every fit also gets ``var_min_var``: the variance floors the task's columns' repeated values
    set on all of the client's rows (:func:`mpifc.circuit.leaves.tie_variance_floors`), so that a
    cluster whose rows are all one value in a column still gets that value's floor.

    Args:
        fit: ``fit(learner, x, meta_types, seed, n_categories=..., var_min_var=..., **hp)``;
            defaults to :func:`mpifc.federated.learners.fit_leaf`.
        x_valid: the client's validation rows ``(n_valid, len(features))`` (its shard's
            ``valid/``), used to choose between candidate hyperparameters of unclustered PCs;
            None or empty: such choices hold out training rows instead.
        device: the client's device (``"cpu"``, ``"cuda:N"``), handed to every ``fit`` call
            (:func:`~mpifc.federated.learners.fit_leaf` passes it to the learners that compute
            on torch); None: not passed (they use the CPU).
    """
    if plan.hyperparameters.get("dp_epsilon") is not None:
        return _noisy_client_tasks(plan, client, x, features)
    if fit is None:
        from mpifc.federated.learners import fit_leaf as fit
    from mpifc.circuit.leaves.gaussian import tie_variance_floors

    col = {f: j for j, f in enumerate(features)}
    leaves: list[LeafReport] = []
    cluster_ids = None
    on = {"device": device} if device is not None else {}
    for t in plan.tasks_for(client):
        idx = [col[f] for f in t.features]
        xs = x[:, idx]
        floors = tie_variance_floors(xs, [plan.meta_types[f] == "real" for f in t.features])
        if t.by_class:
            leaves += _fit_by_class(plan, t, client, xs, x[:, col[plan.target]], fit, floors, on)
            continue
        if t.n_clusters == 0:
            extra = {"target_index": t.features.index(plan.target)} if plan.kind == "fcdt" else {}
            held = x_valid[:, idx] if x_valid is not None and len(x_valid) else None
            model = fit_pc(fit, plan, t, xs, t.seed, held, var_min_var=floors, **extra, **on)
            leaves.append(LeafReport(client, t.subspace, -1, len(xs), t.learner, t.features, model))
            continue
        ccols = cluster_columns(plan, t)
        cards = [int(plan.n_categories.get(t.features[j]) or 0) if plan.meta_types[t.features[j]] == "categorical"
                 else 0 for j in ccols]
        labels = (cluster_rows(xs[:, ccols], t.n_clusters, t.seed, cards) if ccols
                  else np.zeros(len(xs), dtype=np.int64))  # only the target: nothing to cluster on
        cluster_ids = labels
        for k in range(int(labels.max()) + 1):
            rows = xs[labels == k]
            model = fit_pc(fit, plan, t, rows, derive_seed(t.seed, k), var_min_var=floors, **on)
            leaves.append(LeafReport(client, t.subspace, k, len(rows), t.learner, t.features, model))
    return ClientReport(client, leaves, cluster_ids)


def check_dp_plan(glue: str, learners: Sequence[str]) -> None:
    """What ``--dp-epsilon`` needs of a plan (:mod:`mpifc.federated.dp`): factorized PCs, and no
    glue that sends per-sample data."""
    if glue == "cooccurrence":
        raise UserError("--dp-epsilon: the cooccurrence glue sends one cluster id per row, which no noise on "
                        "statistics covers; use another --glue")
    other = sorted(set(learners) - {"factorized"})
    if other:
        raise UserError(f"--dp-epsilon: learner {other[0]!r} chooses its structure on the rows; only the factorized "
                        "learner's statistics are noised (--learner factorized)")


def _noisy_client_tasks(plan: FederationPlan, client: int, x: np.ndarray, features: Sequence[str]) -> ClientReport:
    """:func:`run_client_tasks` under ``--dp-epsilon`` (:mod:`mpifc.federated.dp`): per task one
    PC over all rows, or one per class of the class glue (every class, held or not), each from
    Laplace-noised statistics; the reported row counts are the noisy ones."""
    from mpifc.federated.dp import DEFAULT_CLIP, client_sensitivity, fit_noisy, noise_generator

    hp = plan.hyperparameters
    clip = float(hp.get("dp_clip") or DEFAULT_CLIP)
    tasks = plan.tasks_for(client)
    delta = client_sensitivity([[plan.meta_types[f] for f in t.features] for t in tasks], clip)
    scale = delta / float(hp["dp_epsilon"])
    rng = noise_generator(hp, client)
    col = {f: j for j, f in enumerate(features)}
    leaves: list[LeafReport] = []
    for t in tasks:
        xs = x[:, [col[f] for f in t.features]]
        meta = [plan.meta_types[f] for f in t.features]
        ks = [plan.n_categories.get(f, 0) for f in t.features]
        if t.by_class:
            codes = np.rint(x[:, col[plan.target]]).astype(np.int64)
            cells = [(k, xs[codes == k]) for k in range(int(t.n_clusters))]
        else:
            cells = [(-1 if t.n_clusters == 0 else 0, xs)]
        for k, rows in cells:
            model, n = fit_noisy(rows, meta, ks, clip, scale, rng, alpha=float(hp.get("alpha", 1.0)))
            leaves.append(LeafReport(client, t.subspace, k, n, t.learner, t.features, model))
    return ClientReport(client, leaves, None)


def _fit_by_class(plan: FederationPlan, t: LeafTask, client: int, xs: np.ndarray, y: np.ndarray,
                  fit: Callable[..., Any], floors: Any, on: dict[str, Any]) -> list[LeafReport]:
    """The ``class`` glue's PCs of one task: one per class the client holds at least
    ``MIN_LEAF_ROWS`` rows of (cluster id = class code), and one over the rows of the classes it
    holds fewer rows of (:func:`pool_rare_classes`; cluster id = the number of classes). A
    single-owner subspace without the target also needs one for every other class: its PC over
    all the client's rows stands in (its row count then says so: it is not the class's)."""
    n_classes = int(t.n_clusters)
    codes = pool_rare_classes(np.rint(y).astype(np.int64), n_classes)
    out = []
    whole = None
    for k in range(n_classes + 1):
        rows = xs[codes == k]
        # a class of fewer than k rows is no PC of its own: its leaves would be those rows' values
        if len(rows) < MIN_LEAF_ROWS:
            if plan.subspaces[t.subspace].shared or plan.target in t.features:
                continue  # the subspace's other owners hold the class, or it is left out
            if whole is None:
                whole = fit_pc(fit, plan, t, xs, derive_seed(t.seed, 0x616C6C), var_min_var=floors, **on)
            out.append(LeafReport(client, t.subspace, k, len(xs), t.learner, t.features, copy.deepcopy(whole)))
            continue
        model = fit_pc(fit, plan, t, rows, derive_seed(t.seed, k), cluster=k, var_min_var=floors, **on)
        out.append(LeafReport(client, t.subspace, k, len(rows), t.learner, t.features, model))
    return out


def pool_rare_classes(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """The class codes ``codes`` of a client's rows with the classes it holds fewer than
    ``MIN_LEAF_ROWS`` (but some) rows of pooled into the code ``n_classes`` when the pool holds at
    least ``MIN_LEAF_ROWS`` rows; ``codes`` unchanged otherwise. The pool's PC then models those
    classes together (the target's leaf in it weighs them by their rows), so a target of many
    classes with a few rows each, which no class PC of its own may be learned on, still joins the
    class glue as one product, weighted by the pool's rows."""
    held = codes[(codes >= 0) & (codes < n_classes)]
    counts = np.bincount(held, minlength=n_classes)
    rare = np.flatnonzero((counts > 0) & (counts < MIN_LEAF_ROWS))
    pool = np.isin(codes, rare)
    if int(pool.sum()) < MIN_LEAF_ROWS:
        return codes
    return np.where(pool, n_classes, codes)


# -- the builder -------------------------------------------------------------------------------
class OnePassBuilder:
    """Algorithm 1: plan from declarations, assemble from counts.

    Args:
        n_clusters: K, clusters per single-owner subspace; ``None``: per subspace by
            :func:`mpifc.federated.defaults.default_clusters` (``defaults="adaptive"``) or 2.
        n_products: P, products for the ``random`` glue.
        glue: one of :data:`GLUE_MODES`; ``None``: :func:`mpifc.federated.defaults.default_glue`
            (``defaults="adaptive"``: ``class`` where every client of hybrid data holds the
            target) or ``random``.
        seed: master seed.
        learner: default learner name; ``learners`` overrides it per client index.
        hyperparameters: the user's, passed to every learner call.
        defaults: one of :data:`DEFAULTS_MODES`: what fills the hyperparameters (and K) the
            user did not set.
    """

    def __init__(self, n_clusters: int | None = 2, n_products: int = 4, glue: str | None = "random", seed: int = 0,
                 learner: str = "learnspn", learners: dict[int, str] | None = None,
                 hyperparameters: dict[str, Any] | None = None, defaults: str = "adaptive") -> None:
        if glue is not None and glue not in GLUE_MODES:
            raise UserError(f"unknown glue {glue!r}; expected one of {', '.join(GLUE_MODES)}")
        if defaults not in DEFAULTS_MODES:
            raise UserError(f"unknown defaults {defaults!r}; expected one of {', '.join(DEFAULTS_MODES)}")
        if n_clusters is not None and n_clusters < 1:
            raise UserError(f"--clusters must be >= 1, got {n_clusters}")
        if n_products < 1:
            raise UserError(f"--products must be >= 1, got {n_products}")
        self.n_clusters = None if n_clusters is None else int(n_clusters)
        self.defaults = defaults
        self.n_products = int(n_products)
        self.glue = glue
        self.seed = int(seed)
        self.learner = learner
        self.learners = dict(learners or {})
        self.hyperparameters = dict(hyperparameters or {})

    # Lines 1-7 of Algorithm 1.
    @staticmethod
    def merge_declarations(decls: Iterable[ClientDeclaration], feature_order: Sequence[str] | None = None
                           ) -> tuple[tuple[str, ...], dict[str, str], dict[str, int]]:
        """Global feature order, meta-types and category counts; conflicts raise naming both clients."""
        meta: dict[str, tuple[str, int]] = {}
        cats: dict[str, int] = {}
        order: list[str] = []
        for d in sorted(decls, key=lambda d: d.index):
            if d.n_rows <= 0:
                raise UserError(f"client {d.index} has zero training rows")
            if d.n_rows < MIN_LEAF_ROWS:
                raise UserError(f"client {d.index} has {d.n_rows} training rows; a client needs at least "
                                f"{MIN_LEAF_ROWS}, since no PC is fitted on fewer rows (the k-rows rule)")
            if len(set(d.features)) != len(d.features):
                raise UserError(f"client {d.index} declares a feature twice: {list(d.features)}")
            for f, m, k in zip(d.features, d.meta_types, d.n_categories):
                if f in meta and meta[f][0] != m:
                    raise UserError(f"feature {f!r}: client {meta[f][1]} declares meta-type {meta[f][0]!r} "
                                    f"but client {d.index} declares {m!r}")
                if f not in meta:
                    meta[f] = (m, d.index)
                    order.append(f)
                cats[f] = max(cats.get(f, 0), int(k))
        if feature_order is not None:
            unknown = [f for f in order if f not in feature_order]
            if unknown:
                raise UserError(f"clients declare features {unknown} that the manifest's feature_order lacks")
            order = [f for f in feature_order if f in meta]
        return tuple(order), {f: m for f, (m, _) in meta.items()}, cats

    @staticmethod
    def subspaces(decls: Sequence[ClientDeclaration], features: Sequence[str]) -> list[Subspace]:
        """Distinct columns of ``M`` → subspaces ``S(j)`` with owners, in first-feature order."""
        clients = sorted(d.index for d in decls)
        held = {d.index: set(d.features) for d in decls}
        groups: dict[tuple[int, ...], list[str]] = {}
        for f in features:
            owners = tuple(c for c in clients if f in held[c])
            groups.setdefault(owners, []).append(f)
        return [Subspace(j, tuple(fs), owners) for j, (owners, fs) in enumerate(groups.items())]

    def plan(self, decls: Sequence[ClientDeclaration], feature_order: Sequence[str] | None = None,
             target: str | None = None, setting: str = "") -> FederationPlan:
        """The plan: subspaces and per-client tasks (no data needed)."""
        decls = list(decls)
        if not decls:
            raise UserError("no clients declared any features")
        idx = [d.index for d in decls]
        if len(set(idx)) != len(idx):
            raise UserError(f"client indices are not unique: {idx}")
        features, meta, cats = self.merge_declarations(decls, feature_order)
        subs = self.subspaces(decls, features)
        single = [s for s in subs if not s.shared]
        by_index = {d.index: d for d in decls}
        glue = self.resolve_glue(decls, target, setting)
        if setting == "vertical":
            self._check_aligned([by_index[c] for c in sorted(by_index)], "vertical setting")
        if glue == "class":
            n_classes = self._check_class_glue(decls, meta, cats, target)
            holders = {d.index for d in decls if target in d.features}
        # one client without the target (two-client vertical data): its columns in groups; with
        # more, their joint clusters' combinations, which tie the clients to one another
        # (y = a XOR c with a and c on two of them) where a product given the class cannot
        factorized = (glue == "class" and self.defaults == "adaptive"
                      and sum(1 for s in single if not set(s.owners) <= holders) == 1)
        if factorized:
            subs = self.group_subspaces(subs, holders, {i: int(d.n_rows) for i, d in by_index.items()})
            single = [s for s in subs if not s.shared]
        if glue == "cooccurrence":
            if setting == "horizontal":
                raise UserError("glue 'cooccurrence' needs vertical or hybrid data (aligned sample ids); "
                                "the data is horizontal")
            self._check_aligned([by_index[s.owners[0]] for s in single], "glue 'cooccurrence'")
        dp = self.hyperparameters.get("dp_epsilon") is not None
        if dp:
            check_dp_plan(glue, [self.learners.get(d.index, self.learner) for d in decls])
        if self.learner == "dt" or "dt" in self.learners.values():
            return self._plan_fcdt(decls, features, meta, cats, by_index, target, setting, glue)
        tasks = []
        n_clustered = (sum(1 for s in single if not set(s.owners) <= holders) if glue == "class" else len(single))
        if factorized:
            from mpifc.federated.defaults import default_group_clusters

            grouped = [s for s in single if not set(s.owners) <= holders]
            ks = default_group_clusters([by_index[s.owners[0]].n_rows for s in grouped],
                                        [self.distinct_values(s.features, meta, cats) for s in grouped])
            group_k = {s.index: k for s, k in zip(grouped, ks)}
        for s in subs:
            for c in s.owners:
                learner = self.learners.get(c, self.learner)
                seed = derive_seed(self.seed, c, s.index)
                if glue == "class" and set(s.owners) <= holders:
                    tasks.append(LeafTask(c, s.index, s.features, n_classes, seed, learner, by_class=True))
                    continue
                if factorized and not s.shared:
                    k = self.n_clusters if self.n_clusters is not None else group_k[s.index]
                else:
                    k = 0 if s.shared else self.clusters_of(s, len(decls), len(subs), target, glue, n_clustered,
                                                             n_classes if glue == "class" else 2,
                                                             int(by_index[c].n_rows))
                if dp and k:
                    k = 1  # differential privacy: no k-means (a row's cluster depends on the others)
                tasks.append(LeafTask(c, s.index, s.features, k, seed, learner))
        if glue == "class" and not factorized:
            n_products = n_classes * int(np.prod([t.n_clusters for t in tasks if not t.by_class and t.n_clusters]))
            if n_products > 65536:
                raise UserError(f"glue 'class': {n_products} products (classes x the clusters' combinations); "
                                f"ask for fewer clusters (--clusters)")
        k_max = max([t.n_clusters for t in tasks] + [1])
        if glue == "random" and single and self.n_products < k_max:
            raise UserError(f"--products {self.n_products} < --clusters {k_max}: every "
                            f"cluster-PC must be the child of at least one product")
        return FederationPlan(features, meta, cats, subs, tasks, by_index, glue,
                              n_classes if glue == "class" else self.plan_clusters(k_max),
                              self.n_products, self.seed, target, setting, dict(self.hyperparameters),
                              defaults=self.defaults, factorized=factorized)

    @staticmethod
    def distinct_values(features: Sequence[str], meta: dict[str, str], cats: dict[str, int]) -> int:
        """How many value combinations ``features`` can take: the product of their categories
        when every one is discrete with known categories, else 0 (unbounded)."""
        n = 1
        for f in features:
            k = int(cats.get(f, 0) or 0)
            if meta.get(f) == "real" or k < 1:
                return 0
            n *= k
        return n

    @staticmethod
    def group_subspaces(subs: Sequence[Subspace], holders: set[int], n_rows: dict[int, int] | None = None) -> list[Subspace]:
        """``subs`` with every single-owner subspace of a client without the target split into
        its column groups (:func:`mpifc.federated.defaults.class_glue_groups`; as many as its rows
        allow, :func:`mpifc.federated.defaults.group_count`, ``n_rows`` per client index),
        renumbered in order."""
        from mpifc.federated.defaults import CLASS_GLUE_GROUPS, class_glue_groups, group_count

        out: list[Subspace] = []
        for s in subs:
            if s.shared or set(s.owners) <= holders:
                groups = [s.features]
            else:
                rows = min(int((n_rows or {}).get(c, 0)) for c in s.owners) if n_rows else 0
                groups = class_glue_groups(s.features, group_count(rows) if rows else CLASS_GLUE_GROUPS)
            out += [Subspace(len(out) + i, g, s.owners) for i, g in enumerate(groups)]
        return out

    def resolve_glue(self, decls: Sequence[ClientDeclaration], target: str | None, setting: str) -> str:
        """The glue the plan uses: the user's, else the defaults' rule."""
        if self.glue is not None:
            return self.glue
        if self.defaults != "adaptive":
            return "random"
        from mpifc.federated.defaults import default_glue

        holders = sum(1 for d in decls if target is not None and target in d.features)
        learners = [self.learners.get(d.index, self.learner) for d in decls]
        classes = max([int(d.n_categories[d.features.index(target)] or 0) for d in decls
                       if target is not None and target in d.features] + [0])
        return default_glue(setting, holders, len(decls), min(int(d.n_rows) for d in decls), learners, classes)

    @staticmethod
    def _check_class_glue(decls: Sequence[ClientDeclaration], meta: dict[str, str], cats: dict[str, int],
                          target: str | None) -> int:
        """The number of classes for the ``class`` glue; raises where it does not apply."""
        if target is None:
            raise UserError("glue 'class' needs a classification target; the manifest names none")
        if not any(target in d.features for d in decls):
            raise UserError(f"glue 'class' needs a client that holds the target {target!r}; none does")
        k = int(cats.get(target, 0) or 0)
        if meta.get(target) == "real" or k < 2:
            raise UserError(f"glue 'class' needs a target with at least 2 classes; {target!r} is "
                            f"{meta.get(target)} with {k} categories")
        return k

    def clusters_of(self, subspace: Subspace, n_clients: int, n_subspaces: int, target: str | None,
                    glue: str = "random", n_clustered: int = 1, n_classes: int = 2, n_rows: int = 0) -> int:
        """K of a single-owner subspace: ``n_clusters`` when set, else the defaults' rule."""
        if self.n_clusters is not None:
            return self.n_clusters
        if self.defaults != "adaptive":
            return 2
        from mpifc.federated.defaults import default_clusters

        return default_clusters(n_clients, n_subspaces, target is not None and target in subspace.features, glue,
                                n_clustered, n_classes, n_rows)

    def plan_clusters(self, k_max: int) -> int:
        """The plan's ``n_clusters``: the user's K, else the largest K of any task (at least 1)."""
        return self.n_clusters if self.n_clusters is not None else k_max

    def _plan_fcdt(self, decls: list[ClientDeclaration], features: tuple[str, ...], meta: dict[str, str],
                   cats: dict[str, int], by_index: dict[int, ClientDeclaration], target: str | None,
                   setting: str, glue: str) -> FederationPlan:
        """FC[DT]: one tree per client over all its features, averaged at the root."""
        if target is None:
            raise UserError("FC[DT] (learner 'dt') needs a target feature; the manifest names none")
        for d in decls:
            if target not in d.features:
                raise UserError(f"FC[DT]: client {d.index} does not hold the target {target!r}; "
                                f"every client must hold it to train its tree")
            learner = self.learners.get(d.index, self.learner)
            if learner != "dt":
                raise UserError(f"FC[DT]: client {d.index} uses learner {learner!r}; all clients must use 'dt'")
        tasks = [LeafTask(d.index, -1, tuple(f for f in features if f in d.features), 0,
                          derive_seed(self.seed, d.index), "dt") for d in sorted(decls, key=lambda d: d.index)]
        return FederationPlan(features, meta, cats, [], tasks, by_index, glue, self.plan_clusters(2),
                              self.n_products, self.seed, target, setting, dict(self.hyperparameters), "fcdt",
                              self.defaults)

    @staticmethod
    def _check_aligned(decls: list[ClientDeclaration], why: str) -> None:
        if len(decls) < 2:
            return
        ref = decls[0]
        for d in decls[1:]:
            if d.n_rows != ref.n_rows or d.ids_digest != ref.ids_digest:
                raise UserError(f"{why} needs aligned sample ids, but client {d.index} "
                                f"({d.n_rows} rows) and client {ref.index} ({ref.n_rows} rows) "
                                f"hold different ids or a different order")

    # Lines 8-22 of Algorithm 1.
    def assemble(self, plan: FederationPlan, reports: Sequence[ClientReport],
                 client_ranks: dict[int, int] | None = None) -> FederatedCircuit:
        """Build the FC from the clients' reports (models optional), weights from counts.

        Args:
            client_ranks: client index → MPI rank; default ``index + 1`` (rank 0 is the server).
                Leaves get their client's rank; inner nodes are left unassigned (-1) for ψ.
        """
        by_client = {r.client: r for r in reports}
        missing = sorted(set(plan.declarations) - set(by_client))
        if missing:
            raise UserError(f"no report from clients {missing}")
        ranks = client_ranks or {c: c + 1 for c in plan.declarations}
        fc = FederatedCircuit(
            plan.features, plan.meta_types, plan.n_categories,
            [ClientInfo(c, ranks[c], plan.declarations[c].features) for c in sorted(plan.declarations)],
            target=plan.target, setting=plan.setting)
        fc.meta.update(glue=plan.glue, n_clusters=plan.n_clusters, n_products=plan.n_products,
                       seed=plan.seed, defaults=plan.defaults)
        if plan.setting == "central":
            k = max([t.n_clusters for t in plan.tasks] + [1])
            fc.meta["central"] = (f"Algorithm 1 on one client holding every row and feature: its rows in "
                                  f"K = {k} k-means cluster(s), one client PC each"
                                  + (" (one PC: no clustering)" if k == 1 else ", mixed by the glue"))
        leaf_ids: dict[tuple[int, int, int], int] = {}
        rows: dict[int, float] = {}
        for c in sorted(by_client):
            for r in by_client[c].leaves:
                if r.n_rows <= 0:
                    raise UserError(f"client {c}: PC for subspace {r.subspace} cluster {r.cluster} has no rows")
                nid = fc.add_leaf(LeafInfo(c, tuple(r.features), r.cluster, r.n_rows, r.learner,
                                           r.subspace, r.model), rank=ranks[c])
                leaf_ids[(c, r.subspace, r.cluster)] = nid
                rows[nid] = float(r.n_rows)

        if plan.kind == "fcdt":
            ids = sorted(rows)
            fc.root = ids[0] if len(ids) == 1 else fc.add_inner(AVERAGE, ids)
            fc.meta["kind"] = "fcdt"
            return fc.compact()

        def add(op: str, children: list[int], weights: list[float] | None = None) -> int:
            # Collapse trivial nodes: a sum or product over one child is that child.
            if len(children) == 1:
                return children[0]
            nid = fc.add_inner(op, children, weights)
            rows[nid] = float(sum(rows[ch] for ch in children))
            return nid

        if plan.glue == "class":
            fc.root = self._assemble_by_class(plan, leaf_ids, rows, add)
            fc.compact()
            return fc

        sums = []
        for s in plan.subspaces:
            if not s.shared:
                continue
            ch = [leaf_ids[(c, s.index, -1)] for c in s.owners if (c, s.index, -1) in leaf_ids]
            if len(ch) != len(s.owners):
                raise UserError(f"subspace {s.index} {list(s.features)}: not every owner {list(s.owners)} reported a PC")
            n = np.array([rows[i] for i in ch])
            sums.append(add(SUM, ch, list(n / n.sum())))
        singles = [s for s in plan.subspaces if not s.shared]
        clusters: list[list[int]] = []  # per single-owner subspace, leaf ids by cluster id
        for s in singles:
            c = s.owners[0]
            ks = sorted(k for (cc, sj, k) in leaf_ids if cc == c and sj == s.index)
            if not ks or ks != list(range(len(ks))):
                raise UserError(f"client {c}: cluster PCs for subspace {s.index} are {ks}, expected 0..k-1")
            clusters.append([leaf_ids[(c, s.index, k)] for k in ks])
        combos, weights = self._glue(plan, singles, clusters, rows, sums, by_client)
        products: dict[tuple[int, ...], float] = {}
        for combo, w in zip(combos, weights):
            ch = tuple(sums + [clusters[j][k] for j, k in enumerate(combo)])
            products[ch] = products.get(ch, 0.0) + w  # identical products merge: same mixture
        prod_ids = [add(PRODUCT, list(ch)) for ch in products]
        w = np.array(list(products.values()), dtype=np.float64)
        fc.root = add(SUM, prod_ids, list(w / w.sum()))
        fc.compact()
        return fc

    @staticmethod
    def _assemble_by_class(plan: FederationPlan, leaf_ids: dict[tuple[int, int, int], int],
                           rows: dict[int, float], add: Callable[..., int]) -> int:
        """The ``class`` glue's root (module doc): per class ``y`` and combination of the other
        single-owner subspaces' k-means clusters, a product over the class-``y`` PCs of every
        subspace whose owners hold the target (a shared one: their sum over the owners holding
        the class, by rows), those clusters and the other shared subspaces' sums; weighted by
        the class's rows times the clusters' fractions (the combinatorial rule: exact EM, which
        vertical data allows, then learns how classes and clusters go together). The pool of
        rare classes (:func:`pool_rare_classes`, class index ``n_clusters``) is one more class
        here. A class no client holds a PC of is left out."""
        by_class = {t.subspace for t in plan.tasks if t.by_class}
        clustered = {t.subspace for t in plan.tasks if not t.by_class and t.n_clusters > 0}
        target_sub = next(s for s in plan.subspaces if plan.target in s.features)

        def owner_sum(s: Subspace, k: int) -> int | None:
            ids = [leaf_ids[(c, s.index, k)] for c in s.owners if (c, s.index, k) in leaf_ids]
            if not ids:
                return None
            n = np.array([rows[i] for i in ids])
            return add(SUM, ids, list(n / n.sum()))

        plain = []
        for s in plan.subspaces:
            if s.index not in by_class and s.index not in clustered:
                node = owner_sum(s, -1)
                if node is None or sum(1 for c in s.owners if (c, s.index, -1) in leaf_ids) != len(s.owners):
                    raise UserError(f"subspace {s.index} {list(s.features)}: not every owner {list(s.owners)} "
                                    f"reported a PC")
                plain.append(node)
        clusters = []
        for s in plan.subspaces:
            if s.index in clustered:
                c = s.owners[0]
                ks = sorted(k for (cc, sj, k) in leaf_ids if cc == c and sj == s.index)
                clusters.append([leaf_ids[(c, s.index, k)] for k in ks])
        frac = [np.array([rows[i] for i in cl]) / sum(rows[i] for i in cl) for cl in clusters]
        products: dict[tuple[int, ...], float] = {}
        for k in range(int(plan.n_clusters) + 1):  # every class, then the pool of rare ones
            ch = [leaf_ids[(c, target_sub.index, k)] for c in target_sub.owners
                  if (c, target_sub.index, k) in leaf_ids]
            if not ch:
                continue
            n_class = float(sum(rows[i] for i in ch))
            per_class = []
            for s in plan.subspaces:
                if s.index in by_class:
                    node = owner_sum(s, k)
                    if node is None:
                        raise UserError(f"glue 'class': no PC of class {k} for subspace {s.index} {list(s.features)}")
                    per_class.append(node)
            if plan.factorized:  # each group a sum over its clusters, weighted by their rows (EM ties them)
                children = tuple(per_class + plain + [add(SUM, list(cl), list(f)) for cl, f in zip(clusters, frac)])
                products[children] = products.get(children, 0.0) + n_class
                continue
            for combo in itertools.product(*[range(len(cl)) for cl in clusters]):
                children = tuple(per_class + plain + [clusters[j][b] for j, b in enumerate(combo)])
                w = n_class * float(np.prod([frac[j][b] for j, b in enumerate(combo)]))
                products[children] = products.get(children, 0.0) + w
        if not products:
            raise UserError("glue 'class': no client reported a PC of any class")
        prod_ids = [add(PRODUCT, list(ch)) for ch in products]
        w = np.array(list(products.values()), dtype=np.float64)
        return add(SUM, prod_ids, list(w / w.sum()))

    def _glue(self, plan: FederationPlan, singles: list[Subspace], clusters: list[list[int]],
              rows: dict[int, float], sums: list[int], reports: dict[int, ClientReport]
              ) -> tuple[list[tuple[int, ...]], list[float]]:
        """Cluster combinations (one cluster index per single-owner subspace) and their weights."""
        if not singles:
            return [()], [1.0]
        sizes = [len(c) for c in clusters]
        if plan.glue == "combinatorial":
            combos = list(itertools.product(*[range(k) for k in sizes]))
            frac = [np.array([rows[i] for i in cl]) / sum(rows[i] for i in cl) for cl in clusters]
            return combos, [float(np.prod([frac[j][k] for j, k in enumerate(c)])) for c in combos]
        if plan.glue == "cooccurrence":
            labels = []
            for s in singles:
                ids = reports[s.owners[0]].cluster_ids
                if ids is None:
                    raise UserError(f"glue 'cooccurrence': client {s.owners[0]} sent no cluster ids")
                labels.append(np.asarray(ids, dtype=np.int64))
            n = {len(l) for l in labels}
            if len(n) != 1:
                raise UserError(f"glue 'cooccurrence': clients sent cluster-id vectors of lengths {sorted(n)}")
            for s, l, k in zip(singles, labels, sizes):
                if len(l) and (l.min() < 0 or l.max() >= k):
                    raise UserError(f"glue 'cooccurrence': client {s.owners[0]} sent cluster ids outside 0..{k - 1}")
            joint = np.stack(labels, axis=1)
            uniq, counts = np.unique(joint, axis=0, return_counts=True)
            return [tuple(int(v) for v in u) for u in uniq], [float(c) for c in counts]
        # random: P products; the first k_j products cycle through a random permutation of the
        # clusters so each cluster-PC gets a parent, the rest draw uniformly.
        rng = np.random.default_rng(derive_seed(plan.seed, 0x61756521))
        cols = []
        for k in sizes:
            first = rng.permutation(k)
            rest = rng.integers(0, k, size=plan.n_products - k)
            cols.append(np.concatenate([first, rest]))
        combos = [tuple(int(c[p]) for c in cols) for p in range(plan.n_products)]
        sum_rows = float(sum(rows[s] for s in sums))
        weights = [sum_rows + sum(rows[clusters[j][k]] for j, k in enumerate(c)) for c in combos]
        return combos, weights


def record_hyperparameters(fc: FederatedCircuit, plan: FederationPlan) -> FederatedCircuit:
    """Set ``fc.meta["hyperparameters"]`` (JSON-ready): client index -> one ``{"subspace",
    "cluster", "n_rows", "learner", "hyperparameters"[, "choice"]}`` per PC (cluster -1:
    unclustered), as each client's learner was called for it. The settings are recomputed from
    ``plan`` and the PC's row count by :func:`leaf_candidates` (a pure function, so they are what
    the client used); where the defaults chose between candidates on held-out rows, the PC's
    model carries the choice (its rows, scores and winner) and the winner's settings are listed."""
    from mpifc.circuit.io import FIT_RECORD, fit_record
    from mpifc.federated.wire_format import WireModel

    tasks = {(t.client, t.subspace): t for t in plan.tasks}
    out: dict[str, list[dict[str, Any]]] = {}
    for n in sorted(fc.leaves, key=lambda n: (n.leaf.client, n.leaf.subspace, n.leaf.cluster)):
        m = n.leaf.model
        if isinstance(m, WireModel):
            raw = m.group.attrs.get(FIT_RECORD)
            rec = json.loads(raw) if raw is not None else {}
        else:
            rec = (fit_record(m) if m is not None else None) or {}
        task = tasks.get((n.leaf.client, n.leaf.subspace))
        hp: dict[str, Any] = {}
        if task is not None:
            cands = leaf_candidates(plan, task, int(n.leaf.n_rows), int(n.leaf.cluster))
            names = ["class_split" if "class_column" in c else "joint" for c in cands]
            chosen = rec.get("choice", {}).get("chosen")
            hp = cands[names.index(chosen)] if chosen in names and len(cands) > 1 else cands[0]
        row = {"subspace": int(n.leaf.subspace), "cluster": int(n.leaf.cluster), "n_rows": int(n.leaf.n_rows),
               "learner": n.leaf.learner, "hyperparameters": hp}
        if "choice" in rec:
            row["choice"] = rec["choice"]
        out.setdefault(str(n.leaf.client), []).append(row)
    fc.meta["hyperparameters"] = out
    return fc


def insert_models(fc: FederatedCircuit, models: dict[tuple[int, int, int], Any]) -> FederatedCircuit:
    """Put learned models into the leaves, keyed by ``(client, subspace, cluster)``."""
    for n in fc.leaves:
        key = (n.leaf.client, n.leaf.subspace, n.leaf.cluster)
        if key in models:
            n.leaf.model = models[key]
    return fc


def build_single_process(builder: OnePassBuilder, shards: Sequence[tuple[ClientDeclaration, np.ndarray]],
                         feature_order: Sequence[str] | None = None, target: str | None = None,
                         setting: str = "", client_ranks: dict[int, int] | None = None) -> FederatedCircuit:
    """Run Algorithm 1 in one process on ``(declaration, x_train)`` pairs (tests, baselines)."""
    plan = builder.plan([d for d, _ in shards], feature_order, target, setting)
    reports = [run_client_tasks(plan, d.index, x, d.features) for d, x in shards]
    return record_hyperparameters(builder.assemble(plan, reports, client_ranks), plan)
