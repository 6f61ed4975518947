"""Per-split fixed costs of :mod:`mpifc.circuit.splitting`, trimmed without changing a bit.

* ``kmeans_labels`` (numpy k-means, :mod:`mpifc.circuit.kmeans`) must give exactly
  ``KMeans(...).fit_predict``'s labels, as LearnSPN calls it and as a bare call. This guards a
  scikit-learn upgrade as well: a change of the estimator's order of operations or of a default
  shows up here as a label mismatch (``tests/circuit/test_kmeans.py`` has more cases).
* ``dependency_components`` (transitive closure for small ``d``) must give the label
  propagation's groups, members and order.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from mpifc.circuit import splitting
from mpifc.circuit.splitting import ClusteringWarning, kmeans_labels, single_native_thread


def _problem(rng: np.random.Generator, t: int) -> tuple[np.ndarray, int]:
    """A random clustering problem: mixtures, rounded/duplicated rows, constant and rescaled
    columns, one-hot blocks; n from 5 to 3000, k 2 or 3."""
    sizes = [5, 6, 9, 17, 40, 100, 255, 256, 257, 513, 1000, 3000]  # 256: Lloyd's chunk
    n = int(rng.choice(sizes)) if t % 4 else int(rng.integers(5, 3000))
    d = int(rng.integers(1, 16))
    k = int(rng.choice([2, 3]))
    centres = rng.normal(size=(k, d)) * rng.choice([0.5, 2.0, 10.0])
    x = centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    for j in range(d):
        r = rng.random()
        if r < 0.15:
            x[:, j] = np.round(x[:, j])  # ties
        elif r < 0.25:
            x[:, j] = 3.0  # constant column
        elif r < 0.35:
            x[:, j] *= rng.choice([1e-4, 1e4])  # scaled column
        elif r < 0.45:
            x[:, j] = rng.integers(0, 2, n)  # binary / one-hot-like
    if t % 5 == 0:  # many duplicated rows (binary data, tiny slices)
        x = x[rng.integers(0, max(2, n // 8), n)]
    if t % 7 == 0:
        x = np.asfortranarray(x)  # the estimator copies to C order; so must the direct path
    if t % 11 == 0:
        x = x[:, ::-1]  # non-contiguous view
    return x, k


def _estimator(x: np.ndarray, k: int, n_init: int, seed: int) -> np.ndarray:
    return KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)


def test_direct_kmeans_labels_equal_the_estimators_on_random_problems() -> None:
    rng = np.random.default_rng(11)
    for t in range(120):
        x, k = _problem(rng, t)
        seed, n_init = int(rng.integers(0, 2**31 - 1)), int(rng.choice([1, 3, 4]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", ClusteringWarning)
            if t % 2:  # as LearnSPN calls it (native pools already at one thread) ...
                with single_native_thread():
                    want = _estimator(x, k, n_init, seed)
                    got = kmeans_labels(x, k, n_init, seed)
            else:  # ... and as a bare call (one_pass.cluster_rows); OpenMP at one thread on
                # both sides, whatever OMP_NUM_THREADS says (Lloyd's per-thread partial sums
                # make its bits depend on the thread count)
                with threadpool_limits(limits=1, user_api="openmp"):
                    want = _estimator(x, k, n_init, seed)
                    got = kmeans_labels(x, k, n_init, seed)
        assert got.dtype == want.dtype and got.shape == want.shape, t
        assert np.array_equal(got, want), (t, x.shape, k, n_init, seed)


def test_direct_kmeans_warns_like_the_estimator_on_duplicates() -> None:
    x = np.repeat(np.array([[0.0, 1.0], [2.0, 3.0]]), 5, axis=0)  # two distinct rows, k = 3
    message = r"Number of distinct clusters \(2\) found smaller than n_clusters \(3\)"
    with pytest.warns(ClusteringWarning, match=message):
        got = kmeans_labels(x, 3, 3, 0)
    with pytest.warns(ConvergenceWarning, match=message):
        want = _estimator(x, 3, 3, 0)
    assert np.array_equal(got, want)


def test_direct_kmeans_falls_back_to_the_estimator_and_raises_its_errors() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 3))
    # Integer and boolean data are converted to float64 (as the estimator does); float32 data,
    # whose arithmetic the estimator keeps in float32, goes to the estimator itself.
    for arg in (x.astype(np.float32), np.round(x * 3).astype(np.int64), x > 0.2):
        assert np.array_equal(kmeans_labels(arg, 2, 3, 5), _estimator(arg, 2, 3, 5))
    bad = x.copy()
    bad[4, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        kmeans_labels(bad, 2, 3, 0)
    bad[4, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        kmeans_labels(bad, 2, 3, 0)
    with pytest.raises(ValueError, match="n_samples=2 should be >= n_clusters=3"):
        kmeans_labels(x[:2], 3, 3, 0)


def test_dependency_components_closure_equals_label_propagation() -> None:
    """The closure path (d <= 64) gives exactly the label propagation's groups: same members, same order."""
    rng = np.random.default_rng(6)
    for t in range(300):
        d = int(rng.integers(1, 70))
        dep = rng.random((d, d)) < rng.choice([0.0, 0.01, 0.05, 0.2, 0.6])
        if t % 3 == 0:  # chains: long paths need several squarings
            perm = rng.permutation(d)
            dep[perm[:-1], perm[1:]] = True
        got = splitting.dependency_components(dep)
        want = splitting._components_by_labels(dep)
        assert len(got) == len(want), t
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w), t
    assert splitting.dependency_components(np.zeros((0, 0), dtype=bool)) == []


def test_native_pools_are_left_alone_only_where_the_environment_pins_them_to_one_thread() -> None:
    """``single_native_thread`` skips threadpoolctl only where every pool starts with one thread:
    ``OMP_NUM_THREADS=1`` and no BLAS-specific variable asking for more."""
    single = splitting.pools_single_by_environment
    assert single({"OMP_NUM_THREADS": "1"})
    assert single({"OMP_NUM_THREADS": " 1 ", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert not single({})
    assert not single({"OMP_NUM_THREADS": "2"})
    for var in splitting._POOL_ENV:  # a BLAS reads its own variable before OMP_NUM_THREADS
        assert not single({"OMP_NUM_THREADS": "1", var: "4"}), var


def test_distinct_ints_equals_numpy_unique() -> None:
    """The sorted distinct values of integer and raw-bits arrays, as ``np.unique`` gives them."""
    from mpifc.circuit.arrays import distinct_ints

    rng = np.random.default_rng(7)
    for t in range(200):
        n = int(rng.integers(0, 50))
        a = rng.integers(-5, 6, size=n) if t % 2 else rng.random(n).view(np.uint64)
        if t % 5 == 0:
            a = a.reshape(-1, 1)
        got, want = distinct_ints(a), np.unique(a)
        assert got.dtype == want.dtype and np.array_equal(got, want), t
