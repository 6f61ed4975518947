"""``mpifc.circuit.kmeans.kmeans_labels`` gives scikit-learn's ``KMeans`` labels, bit for bit.

LearnSPN's row splits decide model structure, and models are compared by fingerprint, so the
numpy k-means must return exactly what ``KMeans(n_clusters, n_init=n_init,
random_state=seed).fit_predict(x)`` returns: same k-means++ draws, same Lloyd iterations, same
tie rules, same choice between restarts. scikit-learn is the reference here (test-only import),
run with OpenMP at one thread as LearnSPN runs both (Lloyd's per-thread partial sums make the
estimator's bits depend on the thread count).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from mpifc.circuit import kmeans
from mpifc.circuit.kmeans import ClusteringWarning, kmeans_labels

SIZES = [2, 3, 4, 5, 7, 9, 17, 40, 100, 255, 256, 257, 300, 511, 513, 769]
"""Row counts; 256 is the assignment step's block, so 257 and 513 leave one-row blocks."""


def _problem(rng: np.random.Generator, t: int) -> tuple[np.ndarray, int]:
    """A random clustering problem: Gaussian mixtures with rounded, constant, rescaled and binary
    columns, all-binary tables, duplicated rows, half-integer grids (exact ties), Fortran-ordered,
    strided and integer inputs."""
    n = int(rng.choice(SIZES)) if t % 3 else int(rng.integers(2, 700))
    d = int(rng.integers(1, 20))
    k = min(int(rng.choice([2, 2, 2, 3, 4, 5, 8])), n)
    if t % 6 == 5:
        x = rng.integers(0, 2, (n, d)).astype(np.float64)
    else:
        centres = rng.normal(size=(k, d)) * rng.choice([0.5, 2.0, 10.0])
        x = centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))
        for j in range(d):
            r = rng.random()
            if r < 0.15:
                x[:, j] = np.round(x[:, j])
            elif r < 0.25:
                x[:, j] = 3.0
            elif r < 0.35:
                x[:, j] *= rng.choice([1e-4, 1e4])
            elif r < 0.45:
                x[:, j] = rng.integers(0, 2, n)
    if t % 5 == 0:
        x = x[rng.integers(0, max(2, n // 8), n)]
    if t % 13 == 0:
        x = np.round(x * 2) / 2
    if t % 7 == 0:
        x = np.asfortranarray(x)
    if t % 11 == 0:
        x = x[:, ::-1]
    if t % 17 == 0:
        x = np.round(x).astype(np.int64)
    return x, k


def _both(x: np.ndarray, k: int, n_init: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        want = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
        got = kmeans_labels(x, k, n_init, seed)
    return got, want


def test_labels_equal_the_estimators_on_random_problems() -> None:
    rng = np.random.default_rng(20261127)
    for t in range(200):  # the equality, on 200 random problems (shapes, k, n_init and seeds drawn)
        x, k = _problem(rng, t)
        seed, n_init = int(rng.integers(0, 2**31 - 1)), int(rng.choice([1, 3, 4]))
        got, want = _both(x, k, n_init, seed)
        assert got.dtype == want.dtype == np.int32 and got.shape == want.shape, t
        assert np.array_equal(got, want), (t, x.shape, k, n_init, seed)


@pytest.mark.parametrize("case", ["identical", "two-points", "symmetric", "k-equals-n", "one-cluster", "grid"])
def test_labels_equal_the_estimators_on_degenerate_problems(case: str) -> None:
    x = {
        "identical": np.ones((20, 3)),                               # nothing to separate
        "two-points": np.repeat([[0.0, 1.0], [5.0, -1.0]], 9, axis=0),
        "symmetric": np.array([[-1.0], [0.0], [1.0], [-2.0], [2.0]]),  # equidistant rows
        "k-equals-n": np.arange(12.0).reshape(4, 3),
        "one-cluster": np.random.default_rng(1).normal(size=(50, 4)),
        "grid": np.stack(np.meshgrid(np.arange(6.0), np.arange(6.0)), -1).reshape(-1, 2),
    }[case]
    ks = {"k-equals-n": [4], "one-cluster": [1]}.get(case, [2, 3, 4])
    for k in ks:
        for seed in range(25):
            got, want = _both(x, k, 3, seed)
            assert np.array_equal(got, want), (case, k, seed)


def test_warns_when_rows_are_fewer_than_clusters_and_refuses_bad_arguments() -> None:
    x = np.repeat(np.array([[0.0, 1.0], [2.0, 3.0]]), 5, axis=0)
    with pytest.warns(ClusteringWarning, match=r"distinct clusters \(2\) found smaller than n_clusters \(3\)"):
        kmeans_labels(x, 3, 3, 0)
    with pytest.raises(ValueError, match="n_clusters"):
        kmeans_labels(x, 0, 3, 0)
    with pytest.raises(ValueError, match="n_init"):
        kmeans_labels(x, 2, 0, 0)


def test_the_bundled_blas_routine_is_scipys() -> None:
    """The ``dgemm`` called without importing SciPy rounds as ``scipy.linalg.blas.dgemm``."""
    bundled = kmeans._bundled_dgemm()
    if bundled is None:
        pytest.skip("SciPy without a bundled OpenBLAS: scipy.linalg.blas is used")
    via_scipy = kmeans._scipy_dgemm()
    rng = np.random.default_rng(3)
    for _ in range(500):
        d, k, m = int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(rng.choice([1, 2, 3, 17, 256]))
        centres = rng.normal(size=(k, d)) * rng.choice([1e-3, 1.0, 1e3])
        rows = rng.normal(size=(m, d))
        a = np.asfortranarray(np.repeat(rng.normal(size=(k, 1)), m, axis=1))
        b = a.copy(order="F")
        bundled(centres.T, rows, a)
        via_scipy(centres.T, rows, b)
        assert a.tobytes() == b.tobytes()


def test_row_splits_import_neither_scikit_learn_nor_scipy() -> None:
    import subprocess
    import sys

    code = ("import sys, numpy as np; from mpifc.circuit.splitting import split_rows; "
            "split_rows(np.random.default_rng(0).normal(size=(300, 4)), 'kmeans', 2, 0); "
            "print(sorted(m for m in ('sklearn', 'scipy', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
