"""Default hyperparameters that adapt to a client's data: the rule ``mpifc train`` applies to
every hyperparameter the user did not set.

A fixed default cannot fit every client: LearnSPN's ``min_instances_slice = 200`` fully
factorises every PC of a client with fewer rows (so ``p(y | x) = p(y)``, a majority-class
model), and an RDC threshold of 0.3 calls almost every pair of binary columns independent. The
rule here is a pure function of what is known about the rows one PC is fitted on -- the learner,
the number of rows, the columns' meta-types, whether the classification target is one of them --
and of the hyperparameters the user set, which always win. The server evaluates the same
function on the row counts the clients report, so the model file records what every PC was
learned with (``meta["hyperparameters"]``) without any extra message.

LearnSPN (the only learner with adapted keys, :data:`ADAPTED_KEYS`; the others keep their own
defaults), for a PC of ``n`` rows and ``d`` columns:

* every column discrete or categorical (binary sets, codes) -> the G-test column split
  (``col_split="gtest"``). Its level depends on the rows: from :data:`GTEST_COLUMN_LEVEL_ROWS`
  rows on, a family-wise level of 5 % over each column's ``d - 1`` tests (``gtest_pvalue = 0.05 /
  (d - 1)``: a column is joined to an independent one by chance with probability about 5 %);
  below, 5 % over all ``d (d - 1) / 2`` pairs (``0.05 / (d (d - 1) / 2)``). The looser level
  finds the weak dependencies that many rows support and leads to more row splits; on fewer rows
  those extra clusters overfit (DNA, 1,600 rows and 180 columns: test LL -85.4 at the looser
  level, -82.7 at the strict one). The test's critical value is about the rows, so the test
  itself stops the splitting where nothing is significant, and slices stop at
  ``min_instances_slice = 50`` rows (a quarter of the PC's rows when fewer). Two k-means
  restarts per row split, the lower inertia kept (``n_init = 2``): with one, the clusters of a
  sparse 500-column set swing its likelihood by 2.6 % from seed to seed (EachMovie at the looser
  level, seeds 0-2: -52.95, -54.32, -53.35; with two: -52.85, -52.80, -52.80).
* any real column -> the RDC column split at ``threshold = 0.3``, ``min_instances_slice`` a
  tenth of the PC's rows between 10 and 100 (the RDC has no such brake: on a few rows columns
  look dependent by chance), ``leaf="mixed"``: a histogram leaf for a real column whose most
  frequent value holds at least 5 % of the rows (codes, counts, imputed values stored as reals:
  a Gaussian would put a variance-floor spike on it in every slice where it is constant),
  Gaussians for the others, and Laplace smoothing ``alpha = 0.01`` (a pseudo-count per bin or
  value, small against a slice's rows).
* the class glue's pool of rare classes, target included -> row clusters down to
  :data:`POOL_MIN_SLICE` rows, whatever the column split.
* a PC that holds the target -> two candidates, chosen between on held-out rows by macro F1
  of the target (:func:`target_candidates`; the client's own validation rows when its shard
  has some, else a fifth of the PC's rows, after which the winner is refitted on all of them):
  ``target_first`` (its rows split by the target's value first, ``p(y) p(x | y)``: every other
  column informs the prediction, and no column split can leave the target on its own), with
  the leaves above; or the joint LearnSPN with Gaussian leaves (``leaf="auto"``). Neither wins
  everywhere: the class split is what lets small clients (breast cancer) predict at all, while
  on a rare class among count-valued columns (Give Me Some Credit) the per-class Gaussians'
  spikes make it call defaulters everywhere and the joint model is better in F1 and likelihood.

A user-set ``threshold``, ``rdc_k`` or ``rdc_ties`` keeps the RDC, a user-set ``gtest_pvalue`` the
G-test, whatever the meta-types.

Algorithm 1's K (clusters per single-owner subspace, ``--clusters``; :func:`default_clusters`):
a subspace that holds the target is learned as one PC (K = 1: no "label clusters", which the
random glue would pair with unrelated clusters of other clients), as is the single subspace of
a one-client federation (``--setting central``: one LearnSPN, whose own first row split weighs
its clusters by their rows); every other single-owner subspace gets the paper's K = 2.

The glue (``--glue``; :func:`default_glue`): the ``class`` glue on vertical data with a target,
on hybrid data where every client holds the target, and on horizontal data whose smallest client
has fewer than 1,000 training rows or whose target has more than :data:`MAX_SCORED_CLASSES`
classes; elsewhere (no target, one client, larger horizontal clients of fewer classes)
the paper's ``random`` glue. Under the class glue, a client that holds the target
splits the rows of its subspaces by the class (the class is its own knowledge, so only counts
per class travel), and the root mixes one product per class over every subspace's class PCs
(a shared subspace: the sum of its owners' class PCs, by rows). On hybrid data the prediction
then uses every client's private columns, where the random glue, pairing private clusters with
no tie to the class, leaves it to the shared block alone. On horizontal data every class's
density pools all clients' PCs of that class, where a per-client choice between the class split
and the joint model, made on a client's few held-out rows, is noisy on small clients (breast
cancer, 45-230 rows per client: accuracy 0.88-0.92 on a hard test split, 0.95-0.97 pooled);
from 1,000 rows per client that choice is sound, and the joint model it picks on Income and
Give Me Some Credit gives a higher macro F1 than the class split (0.75 against 0.73, 0.68
against 0.67). Past :data:`MAX_SCORED_CLASSES` classes no choice is made (the class split,
unscored), and a client's class split gives every class it holds fewer than five rows of its
whole distribution: the class glue pools those classes instead (:data:`POOL_MIN_SLICE`). On vertical data the
client without the target has its columns k-means clustered in groups (:func:`class_glue_groups`,
K per group: :func:`default_group_clusters`; a categorical column one-hot, as in LearnSPN's own
row split), and the root has, per class, one sum per group over its clusters; with several
clients without the target each is clustered as a whole (K = 4, one more per 200 rows beyond
800, at most 16: :func:`default_clusters`) and their clusters' combinations are joined with every
class (combinatorial weights). Sampled EM (``--refine em``, at most :data:`CLASS_GLUE_EM_ITERS`
iterations on :data:`CLASS_GLUE_EM_ROWS` seeded aligned rows, every PC kept;
:func:`default_refine`, :mod:`mpifc.federated.sampled_em`) learns how the classes and those
clusters go together: without it the prediction would use the label owner's columns alone. Each
client sends the float32 values of its PCs on the sample once (``4 * rows * PCs`` bytes: 57 kB
for two classes and K = 4 on 2,048 rows, 541 kB for the groups' 64 clusters of a client of 640 rows or more) and the server runs the iterations alone. Exact EM over
every row sends ``2 * 8 * rows * PCs`` bytes an iteration (13 MB for ten on 13,000 rows), and
moving the clusters' PCs too (``--em-leaves``) sends values and flows every iteration and the
PCs again at the end: on small tables that is several times the rest of the training traffic,
for no better accuracy on the tables measured (``launch/bench/defaults.py``).

Presets (:data:`PRESETS`): ``adaptive`` (this rule, the default), ``learner`` (every learner's
own defaults and K = 2: the rule off) and ``paper`` (Table 4 of the paper, resolved by the
command line from :mod:`mpifc.experiments.paper`, then the ``learner`` defaults for the rest).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

SEPARABLE_CLASSES = 16
"""From this many classes on, a class query is evaluated as terms, one per class, where the
circuit allows it (:mod:`mpifc.federated.flat`: the cost of unrolling grows with classes times
the nodes over the target), and a LearnSPN PC holding the target sizes its RDC features per
column (:func:`mpifc.federated.one_pass.leaf_candidates`). Here, not in the evaluator's
module, so a client rank, which fits and never evaluates the circuit, need not load that."""

PRESETS = ("adaptive", "learner", "paper")
"""``mpifc train --preset``: which defaults fill the hyperparameters the user did not set."""

ADAPTED_KEYS = {"learnspn": ("col_split", "gtest_pvalue", "threshold", "min_instances_slice", "n_init", "leaf",
                             "alpha", "target_first")}
"""Per learner, the hyperparameters the adaptive rule may set (all others: the learner's own)."""

FAMILY_WISE_LEVEL = 0.05
"""Probability that a G-test column split joins two independent columns by chance (Bonferroni)."""

GTEST_MIN_SLICE = 50
"""Rows below which a G-test LearnSPN slice is factorised (at most a quarter of the PC's rows)."""

GTEST_N_INIT = 2
"""k-means restarts per row split of a G-test LearnSPN."""

GTEST_COLUMN_LEVEL_ROWS = 2000
"""Rows from which a G-test LearnSPN splits the family-wise level over each column's tests, not all pairs."""

RDC_THRESHOLD = 0.3
"""RDC above which two columns count as dependent (LearnSPN's own default)."""

RDC_SLICE_FRACTION = 0.1
RDC_MIN_SLICE = (10, 100)
"""RDC LearnSPN: ``min_instances_slice = clip(round(RDC_SLICE_FRACTION * n), *RDC_MIN_SLICE)``."""

POOL_MIN_SLICE = 10
"""Rows below which the class glue's pool of rare classes (a PC over the rows of classes its client
holds fewer than five rows of, target included) stops cutting row clusters: twice the k-rows rule's
five, so that a split leaves at least five rows each side. Its class probabilities are those of
its clusters' target leaves, which the finest clusters keep closest to one class each (on
horizontal clients, where a class's rows are spread over the clients, most classes are pooled;
``launch/bench/usertables.py --many-classes`` measures it)."""

RDC_LEAF = "mixed"
RDC_ALPHA = 0.01
"""RDC LearnSPN leaves: histogram for real columns with a point mass, Gaussian otherwise
(:data:`mpifc.circuit.learnspn.POINT_MASS_SHARE`), smoothed with ``RDC_ALPHA`` per bin/value."""

_RDC_KEYS = ("threshold", "rdc_k", "rdc_ties")


def gtest_pvalue(n_columns: int, n_rows: int = 0) -> float:
    """The G-test level of a PC of ``n_columns`` columns and ``n_rows`` rows:
    :data:`FAMILY_WISE_LEVEL` split evenly over each column's ``n_columns - 1`` tests from
    :data:`GTEST_COLUMN_LEVEL_ROWS` rows on, else over all ``n_columns (n_columns - 1) / 2`` pairs
    (at most :data:`FAMILY_WISE_LEVEL`)."""
    d = int(n_columns)
    tests = d - 1 if int(n_rows) >= GTEST_COLUMN_LEVEL_ROWS else d * (d - 1) // 2
    return FAMILY_WISE_LEVEL / max(1, tests)


def column_split(meta_types: Sequence[str], explicit: Mapping[str, Any]) -> str:
    """``"gtest"`` or ``"rdc"``: the user's ``col_split``, else the split their other keys imply,
    else the G-test when every column is discrete or categorical."""
    if "col_split" in explicit:
        return str(explicit["col_split"])
    if "gtest_pvalue" in explicit:
        return "gtest"
    if any(k in explicit for k in _RDC_KEYS):
        return "rdc"
    return "gtest" if meta_types and all(m in ("discrete", "categorical") for m in meta_types) else "rdc"


def learnspn_defaults(n_rows: int, meta_types: Sequence[str], holds_target: bool,
                      explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The adaptive LearnSPN hyperparameters of one PC that the user did not set (module doc).

    Args:
        n_rows: rows the PC is learned on (a cluster's rows for a clustered subspace).
        meta_types: per column of the PC, ``"real"``, ``"discrete"`` or ``"categorical"``.
        holds_target: whether the classification target is one of the PC's columns.
        explicit: the hyperparameters the user set.
    """
    explicit = dict(explicit or {})
    n = max(int(n_rows), 1)
    out: dict[str, Any] = {"col_split": column_split(meta_types, explicit)}
    if out["col_split"] == "gtest":
        out["gtest_pvalue"] = gtest_pvalue(len(meta_types), n)
        out["min_instances_slice"] = max(2, min(GTEST_MIN_SLICE, n // 4))
        out["n_init"] = GTEST_N_INIT
    else:
        out["threshold"] = RDC_THRESHOLD
        lo, hi = RDC_MIN_SLICE
        out["min_instances_slice"] = int(min(max(round(RDC_SLICE_FRACTION * n), lo), hi))
        out["leaf"] = RDC_LEAF
        out["alpha"] = RDC_ALPHA
    if holds_target:
        out["target_first"] = "auto"
    return {k: v for k, v in out.items() if k not in explicit}


def adaptive_hyperparameters(learner: str, n_rows: int, meta_types: Sequence[str], holds_target: bool,
                             explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``explicit`` completed by the adaptive rule for ``learner`` (module doc); explicit keys win.

    Learners without adapted keys (:data:`ADAPTED_KEYS`) get ``explicit`` unchanged.
    """
    explicit = dict(explicit or {})
    if learner == "learnspn":
        return {**learnspn_defaults(n_rows, meta_types, holds_target, explicit), **explicit}
    return explicit


HELD_OUT_FRACTION = 0.2
"""Share of a PC's rows held out to choose between :func:`target_candidates` when its client
has no validation rows of its own."""

MIN_HELD_OUT = 10
"""Fewer held-out rows than this: no choice, the first candidate (the class split)."""

MAX_SCORED_CLASSES = 32
"""A target with more classes than this: no choice, the first candidate (the class split, the
natural model of many classes). Scoring a candidate evaluates every held-out row once per class,
so its cost grows with the square of the classes (minutes for 100, hours for 1,000)."""


def target_candidates(hp: Mapping[str, Any], explicit: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The hyperparameters to choose between for one PC (one entry: nothing to choose).

    ``hp`` is :func:`adaptive_hyperparameters`' result; with ``target_first="auto"`` (a PC that
    holds the target, the user having set no ``target_first``) the candidates are the class
    split with ``hp``'s leaves, then the joint model with Gaussian leaves (``leaf="auto"``,
    unless the user set a leaf). Ties go to the first.
    """
    if hp.get("target_first") != "auto":
        return [dict(hp)]
    explicit = dict(explicit or {})
    split = {**hp, "target_first": True}
    joint = {**hp, "target_first": False}
    if "leaf" not in explicit and "leaf" in joint:
        joint["leaf"] = "auto"
    return [split, joint]


CLASS_GLUE_CLUSTERS = 4
"""K of a single-owner subspace without the target under the ``class`` glue (vertical data): the
clusters that exact EM ties to the classes."""

CLASS_GLUE_ROWS_PER_CLUSTER = 200
CLASS_GLUE_MAX_CLUSTERS = 16
"""The class glue's K grows with the clustered client's rows: ``n_rows // CLASS_GLUE_ROWS_PER_CLUSTER``
between :data:`CLASS_GLUE_CLUSTERS` and this (16 from 3,200 rows). The class reaches the clustered
client's columns only through which cluster a row falls in, so the clusters are as fine as the
rows allow: at 200 rows a cluster, the class glue's weights of a few classes by K clusters each
rest on tens of rows, and the cluster's PC keeps room for LearnSPN's own splits (10 % of its rows
a slice). Each cluster costs the default sampled EM ``4 * CLASS_GLUE_EM_ROWS`` bytes (8 kB) and its
PC. Measured with ``mpifc.simulate`` on the vertical shards of ``launch/bench/usertables.py``'s
Exam (3,247 training rows, seed 0): K = 4 (one per 800 rows) 0.676 / 0.593, K = 8 0.713 / 0.641,
K = 16 0.717 / 0.652 (accuracy / macro F1; central HistGradientBoosting 0.754 / 0.698); on fair
(``launch/bench/defaults.py``'s held-out table, seed 0) K = 7 0.683 / 0.608, K = 16 0.697 / 0.628,
seed 1 0.705 / 0.644 and 0.704 / 0.645. On adult (13,333 rows) K is 16 either way; more (32-48)
did not raise it (``launch/bench/vertical_gap.py``)."""

CLASS_GLUE_MAX_PRODUCTS = 256
"""The class glue's default K keeps ``classes x K^m`` (m: the clustered subspaces) products at
most this many: with two classes, K up to 16 for 2 clients, 11 for 3, fewer for more."""

CLASS_GLUE_GROUPS = 8
"""Under the adaptive defaults the class glue splits the columns of a client without the target
into at most this many groups (:func:`class_glue_groups`), each k-means clustered on its own;
the root then takes, per class, one sum over every group's clusters (the groups independent
given the class: a naive Bayes over the groups, whose components are the clusters' PCs). The
class reaches that client's columns through which cluster a row falls in, and one clustering of
all its columns, learned without the labels, rarely splits its rows where the class changes:
one per column (up to this many) lets each column's values reach the class on their own.
Measured 2026-11-28 with ``mpifc.simulate`` on default flags (2 shared cores, 1-minute load
12-35; accuracy / macro F1, one clustering of all the columns -> the groups, central
HistGradientBoosting in brackets): adult 20,000 rows, seeds 0-2, mean 0.827 / 0.763 -> 0.832 /
0.782 (0.871 / 0.810); credit seed 0 0.924 / 0.694 -> 0.926 / 0.696 (0.937 / 0.661); breast
cancer seed 0 0.982 / 0.981 both (0.974 / 0.971); on ``launch/bench/usertables.py``'s tables,
seed 0: Exam 0.717 / 0.652 -> 0.740 / 0.708 (0.754 / 0.698), mpg 0.681 / 0.571 -> 0.745 /
0.661 (0.957 / 0.960), HELPmiss 0.511 / 0.508 -> 0.489 / 0.485 (0.585 / 0.593; 94 test rows,
one row 0.011). The default job's bytes on adult (seed 0) go from 255 kB to 562 kB. More cluster
PCs (96) or fewer per group (one per 25 rows) did not help (adult 0.825 / 0.778, mpg 0.681 /
0.620)."""

CLASS_GLUE_GROUP_PCS = 64
"""The most cluster PCs all the groups of the class glue hold together: each costs the default
sampled EM ``4 * CLASS_GLUE_EM_ROWS`` bytes (8 kB), so at most 512 kB in all."""

CLASS_GLUE_ROWS_PER_GROUP_PC = 10
"""All the groups together hold at most one cluster PC per this many rows of their client (and at
most :data:`CLASS_GLUE_GROUP_PCS`; :func:`group_pc_budget`): each PC costs the sampled EM four
bytes per sampled row, so on a small table (wine's 124 training rows: 12 PCs, 3 groups) the
job's bytes stay a tenth of SplitNN's on the same rows."""


def group_pc_budget(n_rows: int) -> int:
    """The most cluster PCs the class glue's groups of a client of ``n_rows`` rows hold together:
    one per :data:`CLASS_GLUE_ROWS_PER_GROUP_PC` rows, between :data:`CLASS_GLUE_CLUSTERS` and
    :data:`CLASS_GLUE_GROUP_PCS`."""
    return max(CLASS_GLUE_CLUSTERS, min(CLASS_GLUE_GROUP_PCS, int(n_rows) // CLASS_GLUE_ROWS_PER_GROUP_PC))


def group_count(n_rows: int) -> int:
    """How many column groups a client of ``n_rows`` rows is split into at most: :data:`CLASS_GLUE_GROUPS`,
    fewer where its PC budget (:func:`group_pc_budget`) gives a group fewer than
    :data:`CLASS_GLUE_CLUSTERS` clusters."""
    return max(1, min(CLASS_GLUE_GROUPS, group_pc_budget(n_rows) // CLASS_GLUE_CLUSTERS))


CLASS_GLUE_ROWS_PER_GROUP_CLUSTER = 10
"""A group's K grows by one per this many rows of its client, from :data:`CLASS_GLUE_CLUSTERS`
up to :data:`CLASS_GLUE_MAX_CLUSTERS` (a group of one or a few columns needs fewer rows per
cluster than a clustering of every column; k-means folds a cluster of fewer than five rows into
its nearest)."""


def class_glue_groups(features: Sequence[str], n_groups: int = CLASS_GLUE_GROUPS) -> list[tuple[str, ...]]:
    """The column groups the class glue clusters a client's ``features`` in (:data:`CLASS_GLUE_GROUPS`):
    one per column up to ``n_groups`` columns, else ``n_groups`` runs of consecutive columns,
    their sizes differing by at most one."""
    f = list(features)
    g = max(1, min(len(f), int(n_groups)))
    cut = [len(f) * i // g for i in range(g + 1)]
    return [tuple(f[cut[i]:cut[i + 1]]) for i in range(g)]


def default_group_clusters(n_rows: Sequence[int], distinct: Sequence[int]) -> list[int]:
    """K of every class-glue group (:func:`class_glue_groups`) of the plan, in order: one more
    per :data:`CLASS_GLUE_ROWS_PER_GROUP_CLUSTER` of its client's ``n_rows``, between
    :data:`CLASS_GLUE_CLUSTERS` and :data:`CLASS_GLUE_MAX_CLUSTERS`, no more than the values
    the group's columns can take together (``distinct``, 0: unbounded), and, while all the
    groups' K pass the client's budget (:func:`group_pc_budget` of the fewest ``n_rows``), the
    largest (the last of equals) one fewer, down to 2."""
    ks = []
    for n, d in zip(n_rows, distinct):
        k = min(max(CLASS_GLUE_CLUSTERS, int(n) // CLASS_GLUE_ROWS_PER_GROUP_CLUSTER), CLASS_GLUE_MAX_CLUSTERS)
        ks.append(max(1, min(k, int(d))) if int(d) > 0 else k)
    budget = group_pc_budget(min(int(n) for n in n_rows)) if len(ks) else CLASS_GLUE_GROUP_PCS
    while sum(ks) > budget and max(ks) > 2:
        j = len(ks) - 1 - ks[::-1].index(max(ks))
        ks[j] -= 1
    return ks


CLASS_GLUE_EM_ITERS = 100
"""EM iterations the ``class`` glue runs by default on vertical data (``--em-iters`` wins): on the
server alone, over values each client sent once, so they cost no bytes; they stop earlier once
the likelihood settles (:data:`mpifc.federated.sampled_em.STOP_TOL`)."""

LEAF_EM_ITERS = 10
"""EM iterations of sampled EM that moves the clusters' PCs too (``--em-leaves``; every iteration
sends values and flows), when ``--em-iters`` is not given."""


CLASS_GLUE_EM_ROWS = 2048
"""Aligned rows the class glue's default EM runs on (:mod:`mpifc.federated.sampled_em`: a seeded
sample, float32 values; ``--em-rows`` wins, 0 for exact EM on every row)."""


HORIZONTAL_CLASS_GLUE_ROWS = 1000
"""Horizontal data takes the ``class`` glue while its smallest client has fewer training rows."""


def default_glue(setting: str, target_holders: int, n_clients: int, min_rows: int = 0,
                 learners: Sequence[str] = (), n_classes: int = 0) -> str:
    """The glue when ``--glue`` is not given (module doc): ``class`` on vertical data with a
    target, on hybrid data whose every client holds the target, and on horizontal data (two
    clients or more, all holding the target) with a client of fewer than
    :data:`HORIZONTAL_CLASS_GLUE_ROWS` training rows or a target of more than
    :data:`MAX_SCORED_CLASSES` classes; else the paper's ``random``.

    Args:
        setting: the shards' setting.
        target_holders: clients holding the classification target (0: none, or no target).
        n_clients: clients in the federation.
        min_rows: the smallest client's training rows.
        n_classes: the target's classes (0: unknown or none).
        learners: the clients' learners (FC[DT], ``dt``, averages one tree per client at the
            root: no glue applies, and the paper's is recorded).
    """
    if "dt" in learners:
        return "random"
    if setting == "vertical" and target_holders >= 1:
        return "class"
    if n_clients > 1 and target_holders == n_clients:
        if setting == "hybrid" or (setting == "horizontal" and (int(min_rows) < HORIZONTAL_CLASS_GLUE_ROWS
                                                               or int(n_classes) > MAX_SCORED_CLASSES)):
            return "class"
    return "random"


def default_refine(setting: str, glue: str, target_holders: int, n_clients: int, learners: Sequence[str],
                   assign: str) -> tuple[str, int]:
    """``(refine, em_iters)`` when ``--refine`` is not given: EM (at most :data:`CLASS_GLUE_EM_ITERS`
    iterations, sampled on :data:`CLASS_GLUE_EM_ROWS` rows: the job's resolution sets ``em_rows``,
    and :data:`LEAF_EM_ITERS` iterations under ``--em-leaves``)
    where the ``class`` glue joins the label owner's classes with other clients'
    clusters on aligned rows (vertical data, LearnSPN, flat ψ), else none. Without it those
    clusters' weights are independent of the class, and the prediction uses the owner's
    columns alone."""
    if (setting == "vertical" and glue == "class" and 1 <= target_holders < n_clients and assign == "flat"
            and set(learners) <= {"learnspn"}):
        return "em", CLASS_GLUE_EM_ITERS
    return "none", 0


def default_clusters(n_clients: int, n_subspaces: int, holds_target: bool, glue: str = "random",
                     n_clustered: int = 1, n_classes: int = 2, n_rows: int = 0) -> int:
    """K of one single-owner subspace when ``--clusters`` is not given (module doc).

    Args:
        n_clients: clients in the federation.
        n_subspaces: subspaces of the federation (shared and single-owner).
        holds_target: whether the subspace holds the classification target.
        glue: the plan's glue (``class``: :data:`CLASS_GLUE_CLUSTERS` for a subspace without the
            target, one more per :data:`CLASS_GLUE_ROWS_PER_CLUSTER` rows beyond, up to
            :data:`CLASS_GLUE_MAX_CLUSTERS`; fewer where ``n_classes x K^n_clustered`` would pass
            :data:`CLASS_GLUE_MAX_PRODUCTS`).
        n_clustered: subspaces the class glue clusters by k-means.
        n_classes: the target's classes.
        n_rows: the subspace owner's training rows.
    """
    if holds_target or (n_clients == 1 and n_subspaces == 1):
        return 1
    if glue != "class":
        return 2
    k = int(min(max(CLASS_GLUE_CLUSTERS, int(n_rows) // CLASS_GLUE_ROWS_PER_CLUSTER), CLASS_GLUE_MAX_CLUSTERS))
    while k > 1 and max(int(n_classes), 1) * k ** max(int(n_clustered), 1) > CLASS_GLUE_MAX_PRODUCTS:
        k -= 1
    return k


RULE_HELP = (
    "Hyperparameters not given follow the adaptive rule (--preset adaptive, the default; "
    "mpifc.federated.defaults), per client PC of n rows and d columns: LearnSPN on all-discrete "
    "columns uses the G-test at p = 0.05 / (d-1) from 2,000 rows, else 0.05 / (d(d-1)/2), "
    "min_instances_slice min(50, n/4), two k-means restarts; with any real column the RDC at "
    "threshold 0.3, min_instances_slice = n/10 clipped to "
    "[10, 100], histogram leaves for real columns with a point mass (a value on >= 5% of the rows), "
    "Gaussians otherwise, alpha 0.01; a PC holding the target chooses, by macro F1 on held-out "
    "rows (the shard's validation rows, else a fifth of its rows), between splitting its rows by "
    "the target first (target_first) and the joint LearnSPN with Gaussian leaves. K (--clusters) "
    "is 1 for the subspace holding the target and for a one-client federation, else 2. The glue is "
    "'class' on vertical data with a target, on hybrid data whose every client holds it and on "
    "horizontal data whose smallest client has fewer than 1,000 rows or whose target has more than 32 classes "
    "(the target's holders split their rows by class; on vertical data the other clients' subspaces "
    "are k-means clustered (categorical columns one-hot): one such client in column groups, one per column up to 8, "
    "K = n/10 between 4 and 16 a group, at most n/10 and 64 clusters in all (fewer groups on few rows), each group independent of the others given the class; "
    "several, each whole, K = n/200 between 4 and 16; --refine em runs up to 100 iterations of sampled EM on the server over the "
    "values of every PC on 2,048 rows, sent once, --em-rows), "
    "else 'random'. Explicit flags and --hp keys "
    "always win; the values used are in the "
    "model's meta (hyperparameters). --preset learner: the learners' own defaults (LearnSPN "
    "threshold 0.3, min_instances_slice 200), K = 2; --preset paper: the paper's Table 4 for the "
    "shards' dataset and setting.")
"""The rule in one paragraph, for ``mpifc train --help``."""
