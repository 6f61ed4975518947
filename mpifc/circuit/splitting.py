"""Column and row splits of a data slice, the two moves of LearnSPN.

A column split partitions the slice's variables into groups that are (approximately) mutually
independent: the connected components of the pairwise dependency graph. A row split clusters the
slice's instances. Both are pure functions of a ``(n, d)`` slice and return local indices, so the
structure learner in :mod:`mpifc.circuit.learnspn` owns all bookkeeping.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from mpifc.circuit.kmeans import ClusteringWarning, kmeans_labels
from mpifc.circuit.privacy import MIN_LEAF_ROWS  # no slice of fewer rows is learned on its own
from mpifc.circuit.rdc import RDC_K, gtest_dependent, rdc_groups, rdc_matrix

__all__ = ["MIN_LEAF_ROWS", "ClusteringWarning", "absorb_small_clusters", "clustering_features",
           "dependency_components", "first_appearance", "kmeans_labels", "single_native_thread",
           "split_columns_gtest", "split_columns_rdc", "split_rows"]


_CLOSURE_MAX_D = 64
"""Up to this many columns, components come from a boolean transitive closure (a few tiny
matrix products); beyond, from label propagation (:func:`_components_by_labels`; the closure costs
``O(d^3)`` each)."""


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
        return _components_by_labels(dep)
    # Reachability: square (adjacency | identity) until it stops growing (<= log2(d) products;
    # path counts are small integers, exact in float64). LearnSPN asks this once per column
    # split, mostly of ~10-30 columns, where a per-column Python loop cost ~0.25 ms.
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


def _components_by_labels(dep: np.ndarray) -> list[np.ndarray]:
    """:func:`dependency_components` for large ``d``: every column takes the smallest label among
    itself and its neighbours, then the label of its label (pointer jumping), until nothing
    changes. Labels always name a column of the same component, so the fixed point names each
    component by its smallest member; a few ``O(d^2)`` array passes instead of a Python loop
    over the columns."""
    dep = dep | dep.T
    d = dep.shape[0]
    label = np.arange(d)
    while True:
        nxt = np.minimum(label, np.where(dep, label[None, :], d).min(axis=1))
        nxt = nxt[nxt]
        if np.array_equal(nxt, label):
            break
        label = nxt
    order = np.argsort(label, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(label[order])) + 1)


def split_columns_rdc(
    data: np.ndarray,
    categorical: Sequence[bool],
    cards: Sequence[int],
    threshold: float,
    rng: np.random.Generator,
    k: int = RDC_K,
    ties: str = "max",
    widths: str = "shared",
) -> list[np.ndarray]:
    """Groups of columns whose pairwise RDC is below ``threshold`` across groups (``ties``: see
    :func:`mpifc.circuit.rdc.ecdf`): the connected components of ``rdc_matrix(...) >=
    threshold``, searched pair by pair where that is cheaper (:func:`mpifc.circuit.rdc.rdc_groups`;
    ``widths``: how wide each column's random features are, see there)."""
    groups = rdc_groups(data, categorical, cards, threshold, k=k, rng=rng, ties=ties, widths=widths)
    if groups is not None:
        return groups
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


# threadpoolctl is imported where native pools are limited, not with this module: a rank that
# only loads models does without it.
_CONTROLLER: list[Any] = []


def _thread_pools() -> Any:
    """The process's native thread pools (a ``threadpoolctl.ThreadpoolController``), discovered
    once (discovery costs milliseconds)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        # SciPy's BLAS (k-means' distance products) is loaded first, so that the limit covers
        # it too: a pool loaded after discovery would keep its threads.
        from mpifc.circuit.kmeans import blas_gemm

        blas_gemm()
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


_SINGLE_THREAD_DEPTH = [0]

_POOL_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
"""The variables by which a BLAS library overrides ``OMP_NUM_THREADS`` when it starts its pool."""


def pools_single_by_environment(env: Any = None) -> bool:
    """Whether the environment already starts every native pool with one thread:
    ``OMP_NUM_THREADS=1`` (OpenMP, and each BLAS unless overridden) and no BLAS-specific
    variable (:data:`_POOL_ENV`) that asks for more. The pools read them when they start, so
    limiting them again would only cost the discovery (some 20 ms of CPU per process, paid by
    every rank of a job that learns; ``mpifc.experiments`` starts its ranks so, and so may a user)."""
    import os

    env = os.environ if env is None else env
    one = lambda v: v is not None and v.strip() == "1"  # noqa: E731
    return one(env.get("OMP_NUM_THREADS")) and all(env.get(k) is None or one(env.get(k)) for k in _POOL_ENV)


@contextmanager
def single_native_thread() -> Iterator[None]:
    """Context manager limiting BLAS/OpenMP pools to one thread (re-entrant: inside another
    one it does nothing, since every split of LearnSPN would otherwise pay the limit's ~1 ms).

    LearnSPN makes thousands of small BLAS/OpenMP calls; their thread start-up and, on a shared
    machine, oversubscription cost more than the arithmetic. Where the environment already
    starts every pool with one thread (:func:`pools_single_by_environment`) it does nothing.
    """
    if _SINGLE_THREAD_DEPTH[0] or pools_single_by_environment():
        yield
        return
    with _thread_pools().limit(limits=1):
        _SINGLE_THREAD_DEPTH[0] += 1
        try:
            yield
        finally:
            _SINGLE_THREAD_DEPTH[0] -= 1


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
        method: ``"kmeans"`` (:func:`mpifc.circuit.kmeans.kmeans_labels`, scikit-learn's k-means
            in numpy) or ``"gmm"`` (scikit-learn's diagonal Gaussian mixture).
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
    # With fewer distinct rows than clusters k-means warns and returns duplicate centres.
    k = n_clusters if n > 4 * n_clusters else min(n_clusters, len(np.unique(features, axis=0)))
    # One thread: on small slices OpenMP start-up and oversubscription cost more than Lloyd's
    # iterations themselves (measured ~15x slower with the default pool on a busy 2-core box).
    with single_native_thread(), warnings.catch_warnings():
        # Fewer distinct rows than clusters (duplicates in binary data): k-means warns and
        # returns empty clusters, which the relabelling below drops.
        warnings.simplefilter("ignore", ClusteringWarning)
        if method == "kmeans":
            labels = kmeans_labels(features, k, n_init, seed)
        else:
            labels = _gmm_labels(features, k, n_init, seed)
    # Relabel by first appearance so that empty clusters vanish and labels are canonical.
    return first_appearance(labels)


_FEW_LABELS = 16
"""Largest label id up to which :func:`first_appearance` scans for each id's first row instead
of sorting the labels."""


def first_appearance(labels: np.ndarray) -> np.ndarray:
    """``labels`` renumbered ``0..m-1`` (int64) in the order their values first appear: ids
    compact, whatever the clustering's own numbering."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu" and labels.size and 0 <= labels.min() and labels.max() < _FEW_LABELS:
        # few small ids (a row split's clusters): each one's first row by a scan, no sort
        present = np.flatnonzero(np.bincount(labels))
        first = np.array([np.argmax(labels == v) for v in present])
        new = np.zeros(int(present[-1]) + 1, dtype=np.int64)
        new[present] = np.argsort(np.argsort(first))
        return new[labels]
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse].astype(np.int64)


def _gmm_labels(features: np.ndarray, k: int, n_init: int, seed: int) -> np.ndarray:
    """Labels of scikit-learn's diagonal ``GaussianMixture`` (imported here: only this row
    split needs scikit-learn). Parameters are checked by :func:`split_rows` (scikit-learn's own
    validation costs ~1 ms per call, and LearnSPN clusters once per split)."""
    from sklearn import config_context
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    with warnings.catch_warnings(), config_context(skip_parameter_validation=True):
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm = GaussianMixture(n_components=k, covariance_type="diag", n_init=n_init,
                              random_state=seed, reg_covar=1e-6)
        return gmm.fit(features).predict(features)


def absorb_small_clusters(feats: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``labels`` ``(n,)`` (``0..m-1``) with every cluster of fewer than :data:`MIN_LEAF_ROWS`
    rows merged into the cluster whose mean (in ``feats``) is nearest, relabelled ``0..m'-1`` in
    order of first appearance; unchanged where no cluster is that small. One cluster left: all 0.

    The leaves of a slice of fewer rows would be statistics of a handful of rows (of one row:
    that row itself), so the model a client sends would carry their values
    (:mod:`mpifc.circuit.privacy`)."""
    counts = np.bincount(labels)
    small = counts < MIN_LEAF_ROWS
    if not small.any():
        return labels
    keep = np.flatnonzero(~small)
    out = labels.copy()
    if len(keep):
        means = np.stack([feats[labels == k].mean(axis=0) for k in keep])
        for i in np.flatnonzero(small[labels]):
            out[i] = keep[int(np.argmin(((means - feats[i]) ** 2).sum(axis=1)))]
    else:
        out[:] = 0
    return first_appearance(out).astype(labels.dtype)
