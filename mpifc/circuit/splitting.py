"""Column and row splits of a data slice, the two moves of LearnSPN.

A column split partitions the slice's variables into groups that are (approximately) mutually
independent: the connected components of the pairwise dependency graph. A row split clusters the
slice's instances. Both are pure functions of a ``(n, d)`` slice and return local indices, so the
structure learner in :mod:`mpifc.circuit.learnspn` owns all bookkeeping.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from mpifc.circuit.rdc import RDC_K, gtest_dependent, rdc_matrix


_CLOSURE_MAX_D = 64
"""Up to this many columns, components come from a boolean transitive closure (a few tiny
matrix products); beyond, from a breadth-first search (the closure costs ``O(d^3)`` each)."""


def dependency_components(dependent: np.ndarray) -> list[np.ndarray]:
    """Connected components of a boolean ``(d, d)`` dependency graph.

    Returns:
        Arrays of local column indices (ascending), ordered by their smallest member
        (deterministic).
    """
    dep = np.asarray(dependent, dtype=bool)
    d = dep.shape[0]
    if d == 0:
        return []
    if d > _CLOSURE_MAX_D:
        return _components_bfs(dep)
    # Reachability: square (adjacency | identity) until it stops growing (<= log2(d) products;
    # path counts are small integers, exact in float64). LearnSPN asks this once per column
    # split, mostly of ~10-30 columns, where the search's Python loop cost ~0.25 ms.
    reach = dep | dep.T
    np.fill_diagonal(reach, True)
    while True:
        step = reach.astype(np.float64)
        wider = (step @ step) > 0
        if np.array_equal(wider, reach):
            break
        reach = wider
    smallest = np.argmax(reach, axis=1)  # each column's component, named by its smallest member
    order = np.argsort(smallest, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(smallest[order])) + 1)


def _components_bfs(dep: np.ndarray) -> list[np.ndarray]:
    """:func:`dependency_components` by breadth-first search (large ``d``)."""
    dep = dep | dep.T
    d = dep.shape[0]
    assigned = np.zeros(d, dtype=bool)
    groups = []
    for start in range(d):
        if assigned[start]:
            continue
        members = np.zeros(d, dtype=bool)
        members[start] = True
        frontier = np.array([start])
        while frontier.size:
            new = dep[frontier].any(0) & ~members
            members |= new
            frontier = np.flatnonzero(new)
        assigned |= members
        groups.append(np.flatnonzero(members))
    return groups


def split_columns_rdc(
    data: np.ndarray,
    categorical: Sequence[bool],
    cards: Sequence[int],
    threshold: float,
    rng: np.random.Generator,
    k: int = RDC_K,
    ties: str = "max",
) -> list[np.ndarray]:
    """Groups of columns whose pairwise RDC is below ``threshold`` across groups (``ties``: see
    :func:`mpifc.circuit.rdc.ecdf`)."""
    rdc = rdc_matrix(data, categorical, cards, k=k, rng=rng, ties=ties)
    return dependency_components(rdc >= threshold)


def split_columns_gtest(data: np.ndarray, cards: Sequence[int], pvalue: float) -> list[np.ndarray]:
    """Groups of discrete columns; a pair is dependent when its G-test p-value is below ``pvalue``."""
    return dependency_components(gtest_dependent(data, cards, pvalue))


def clustering_features(data: np.ndarray, categorical: Sequence[bool], cards: Sequence[int],
                        scales: Sequence[float] | None = None) -> np.ndarray:
    """Slice as seen by the row clustering: categorical columns with > 2 values one-hot encoded
    (their integer codes carry no distance), every other column divided by its ``scales`` entry
    (default 1: unchanged; a categorical column's entry is ignored).

    ``scales`` puts ordinal level codes ``0..k-1`` on the unit spread of standardised real
    columns, so that a column with many levels does not outweigh the others in k-means."""
    if scales is not None:
        div = np.where(np.asarray(categorical, dtype=bool), 1.0, np.asarray(scales, dtype=np.float64))
        if np.any(div != 1.0):
            data = data / div
    if not any(c and k > 2 for c, k in zip(categorical, cards)):
        return data
    parts = []
    n = data.shape[0]
    for j in range(data.shape[1]):
        if categorical[j] and cards[j] > 2:
            onehot = np.zeros((n, int(cards[j])))
            onehot[np.arange(n), data[:, j].astype(np.int64).clip(0, int(cards[j]) - 1)] = 1.0
            parts.append(onehot)
        else:
            parts.append(data[:, j : j + 1])
    return np.hstack(parts)


# scikit-learn and threadpoolctl are imported where rows are clustered, not with this module: a
# LearnSPN fit that never splits rows (and a rank that only loads models) does without them.
_CONTROLLER: list[Any] = []


def _thread_pools() -> Any:
    """The process's native thread pools (a ``threadpoolctl.ThreadpoolController``), discovered
    once (discovery costs milliseconds)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


_SINGLE_THREAD_DEPTH = [0]


@contextmanager
def single_native_thread() -> Iterator[None]:
    """Context manager limiting BLAS/OpenMP pools to one thread (re-entrant: inside another
    one it does nothing, since every split of LearnSPN would otherwise pay the limit's ~1 ms).

    LearnSPN makes thousands of small BLAS/OpenMP calls; their thread start-up and, on a shared
    machine, oversubscription cost more than the arithmetic.
    """
    if _SINGLE_THREAD_DEPTH[0]:
        yield
        return
    with _thread_pools().limit(limits=1):
        _SINGLE_THREAD_DEPTH[0] += 1
        try:
            yield
        finally:
            _SINGLE_THREAD_DEPTH[0] -= 1


_KMEANS_TOL = 1e-4
"""scikit-learn's default ``KMeans(tol=...)``, scaled by the data's mean variance."""

_KMEANS_MAX_ITER = 300
"""scikit-learn's default ``KMeans(max_iter=...)``."""

_KMEANS_ROUTINES: list = []


def _kmeans_routines() -> tuple | None:
    """scikit-learn's private k-means routines that :meth:`KMeans.fit` runs, imported once;
    ``None`` if this scikit-learn lays them out differently (then :func:`kmeans_labels` uses
    the estimator)."""
    if not _KMEANS_ROUTINES:
        try:
            from sklearn.cluster._kmeans import (_is_same_clustering, _kmeans_plusplus,
                                                 _kmeans_single_lloyd, _tolerance)
            from sklearn.utils._openmp_helpers import _openmp_effective_n_threads
            from sklearn.utils.extmath import row_norms

            routines = (_tolerance, _openmp_effective_n_threads, row_norms, _kmeans_plusplus,
                        _kmeans_single_lloyd, _kmeans_single_lloyd.__wrapped__, _is_same_clustering)
        except (ImportError, AttributeError):
            routines = None
        _KMEANS_ROUTINES.append(routines)
    return _KMEANS_ROUTINES[0]


_RANDOM_STATES = threading.local()


def _seeded_random_state(seed: int) -> np.random.RandomState:
    """This thread's reused ``RandomState``, re-seeded: the same state (and draws) as a fresh
    ``RandomState(seed)``, which is what ``KMeans(random_state=seed)`` builds. A fresh one first
    seeds its ``MT19937`` from OS entropy and then overwrites that with the legacy seeding
    (~0.45 ms, a tenth of a small slice's clustering); ``RandomState.seed`` only does the latter
    (MT19937 init + cleared Gaussian cache)."""
    state = getattr(_RANDOM_STATES, "state", None)
    if state is None:
        state = _RANDOM_STATES.state = np.random.RandomState(0)
    state.seed(seed)
    return state


def _all_finite(x: np.ndarray) -> bool:
    """Whether a float array has no NaN/inf: its sum is finite (an overflowing sum of finite
    values only sends it to the slow path)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(x.sum()))


def kmeans_labels(x: np.ndarray, n_clusters: int, n_init: int, seed: int) -> np.ndarray:
    """``KMeans(n_clusters, n_init=n_init, random_state=seed).fit_predict(x)``, same labels
    (``(n,)`` int32, bit for bit), without the estimator's per-call overheads.

    LearnSPN clusters once per row split, mostly small slices, where the estimator's input
    validation, parameter checks and per-restart thread-pool limit cost as much as the
    clustering. This runs scikit-learn's own routines in :meth:`KMeans.fit`'s order with its
    arguments: a C-ordered copy, the tolerance from the uncentred copy, ``RandomState(seed)``,
    unit weights, centring, squared row norms, then per restart k-means++ and Lloyd, keeping
    the first run unless a later one has lower inertia and a different partition. Inside
    :func:`single_native_thread` (native pools already at one thread) Lloyd runs without its
    own BLAS limit, which is then a no-op. Anything else -- not a finite float64 matrix with
    at least ``n_clusters`` rows, a non-integer seed, or another scikit-learn layout -- goes to
    the estimator, which also raises its usual errors. The seeded ``RandomState`` is reused
    (:func:`_seeded_random_state`). ``tests/circuit/test_splitting_fast_paths.py`` checks the
    labels against the estimator (it guards a scikit-learn upgrade).
    """
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    routines = _kmeans_routines()
    if (routines is None or type(x) is not np.ndarray or x.dtype != np.float64 or x.ndim != 2
            or not isinstance(seed, (int, np.integer)) or not isinstance(n_clusters, (int, np.integer))
            or not isinstance(n_init, (int, np.integer)) or n_clusters < 1 or n_init < 1
            or x.shape[1] < 1 or x.shape[0] < n_clusters or not _all_finite(x)):
        return KMeans(n_clusters=n_clusters, n_init=n_init, random_state=seed).fit_predict(x)
    tolerance, n_threads_of, row_norms, plusplus, lloyd_limited, lloyd_bare, same_clustering = routines
    k = int(n_clusters)
    data = np.array(x, dtype=np.float64, order="C", copy=True)
    tol = tolerance(data, _KMEANS_TOL)
    random_state = _seeded_random_state(seed)
    weights = np.ones(data.shape[0], dtype=np.float64)
    n_threads = n_threads_of()
    data -= data.mean(axis=0)
    squared_norms = row_norms(data, squared=True)
    lloyd = lloyd_bare if _SINGLE_THREAD_DEPTH[0] else lloyd_limited
    best_labels, best_inertia = None, None
    for _ in range(int(n_init)):
        centres, _ = plusplus(data, k, random_state=random_state, x_squared_norms=squared_norms,
                              sample_weight=weights)
        labels, inertia, _, _ = lloyd(data, weights, centres, max_iter=_KMEANS_MAX_ITER,
                                      verbose=False, tol=tol, n_threads=n_threads)
        if best_inertia is None or (inertia < best_inertia and not same_clustering(labels, best_labels, k)):
            best_labels, best_inertia = labels, inertia
    distinct = int(np.count_nonzero(np.bincount(best_labels, minlength=k)))
    if distinct < k:  # the estimator's warning, word for word
        warnings.warn(
            f"Number of distinct clusters ({distinct}) found smaller than n_clusters ({k}). "
            "Possibly due to duplicate points in X.",
            ConvergenceWarning,
            stacklevel=2,
        )
    return best_labels


def split_rows(
    features: np.ndarray,
    method: str,
    n_clusters: int,
    seed: int,
    n_init: int = 3,
) -> np.ndarray:
    """Cluster labels ``(n,)`` in ``0 .. m-1`` for the ``m`` non-empty clusters found (``m`` may be
    1 when the rows cannot be separated, e.g. all identical).

    Args:
        features: ``(n, f)`` rows to cluster.
        method: ``"kmeans"`` (scikit-learn k-means) or ``"gmm"`` (diagonal Gaussian mixture).
        n_clusters: requested number of clusters.
        seed: random state of the clustering.
        n_init: restarts; the best (lowest inertia / highest likelihood) is kept.
    """
    if method not in ("kmeans", "gmm"):
        raise ValueError(f"split_rows: method must be 'kmeans' or 'gmm', got {method!r}")
    if int(n_init) < 1:
        raise ValueError(f"split_rows: n_init must be >= 1, got {n_init!r}")
    n = features.shape[0]
    if n < 2 or n_clusters < 2 or bool(np.all(features == features[0])):
        return np.zeros(n, dtype=np.int64)
    # With fewer distinct rows than clusters scikit-learn warns and returns duplicate centres.
    k = n_clusters if n > 4 * n_clusters else min(n_clusters, len(np.unique(features, axis=0)))
    from sklearn import config_context
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    # One thread: on small slices OpenMP start-up and oversubscription cost more than Lloyd's
    # iterations themselves (measured ~15x slower with the default pool on a busy 2-core box).
    # Parameters are checked above (scikit-learn's own validation costs ~1 ms per call, and
    # LearnSPN clusters once per split).
    with single_native_thread(), warnings.catch_warnings(), config_context(skip_parameter_validation=True):
        # Fewer distinct rows than clusters (duplicates in binary data): scikit-learn warns and
        # returns empty clusters, which the relabelling below drops.
        warnings.simplefilter("ignore", ConvergenceWarning)
        if method == "kmeans":
            labels = kmeans_labels(features, k, n_init, seed)
        else:
            gmm = GaussianMixture(n_components=k, covariance_type="diag", n_init=n_init,
                                  random_state=seed, reg_covar=1e-6)
            labels = gmm.fit(features).predict(features)
    # Relabel by first appearance so that empty clusters vanish and labels are canonical.
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[inverse].astype(np.int64)
