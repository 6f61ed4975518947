"""k-means with k-means++ seeding in numpy: the labels of scikit-learn's ``KMeans``, bit for bit.

``kmeans_labels(x, k, n_init, seed)`` returns what ``KMeans(n_clusters=k, n_init=n_init,
random_state=seed).fit_predict(x)`` returns (scikit-learn 1.x, Lloyd's algorithm, OpenMP at one
thread) without loading scikit-learn: importing it costs a LearnSPN rank ~1.3 s and ~125 MB
(it pulls in ``scipy.stats`` and pandas), more than the rest of the rank together.

The arithmetic is the estimator's, in its order, because LearnSPN's models are pinned by their
fingerprints and a row split decides the structure:

* fit: a C-ordered float64 copy; tolerance ``1e-4 * mean(var(x, axis=0))`` of the uncentred
  copy; ``RandomState(seed)`` shared by all restarts; unit sample weights; centring by the column
  means; squared row norms by ``einsum``.
* k-means++ (:func:`_plusplus`): first centre by ``choice`` with uniform ``p``; then per centre
  ``2 + int(log k)`` candidates drawn by ``searchsorted`` of uniform draws (times the current
  potential) in the cumulative squared distances; squared distances as ``-2 x.y + |x|^2 + |y|^2``
  clipped at 0; the candidate with the smallest potential wins (first on ties).
* Lloyd (:func:`_lloyd`): per block of :data:`_CHUNK` rows, distances ``|c|^2 - 2 x.c`` and the
  first nearest centre; centre sums accumulated row by row in row order, then multiplied by the
  reciprocal of the count; an empty cluster takes the point farthest from its own centre
  (``argpartition``), and one left empty sits on the biggest cluster's centre; stop on unchanged
  labels, or when the summed squared centre shift is at most the tolerance (then one more
  labelling with the final centres).
* restarts: the first run is kept unless a later one has strictly lower inertia and a different
  partition (:func:`_same_partition`, the estimator's one-way label map).

``tests/circuit/test_kmeans.py`` compares the labels with the estimator's on random problems.
"""
from __future__ import annotations

import math
import threading
import warnings
from typing import Any, Callable

import numpy as np

from mpifc.circuit.arrays import distinct_ints

_CHUNK = 256
"""Rows per block of the assignment step (scikit-learn's ``CHUNK_SIZE``): the distance products
are formed per block, as the estimator forms them, so that they round alike."""

TOL = 1e-4
"""Relative tolerance on the centre shift (scikit-learn's default ``tol``), scaled by the data's
mean column variance."""

MAX_ITER = 300
"""Lloyd iterations per restart at most (scikit-learn's default ``max_iter``)."""


class ClusteringWarning(UserWarning):
    """Fewer distinct clusters were found than asked for (duplicate rows)."""


_RANDOM_STATES = threading.local()


def _seeded_random_state(seed: int) -> np.random.RandomState:
    """This thread's reused ``RandomState``, re-seeded: the same state (and draws) as a fresh
    ``RandomState(seed)``. A fresh one first seeds its ``MT19937`` from OS entropy and then
    overwrites that with the legacy seeding (~0.45 ms, a tenth of a small slice's clustering);
    ``RandomState.seed`` only does the latter (MT19937 init + cleared Gaussian cache)."""
    state = getattr(_RANDOM_STATES, "state", None)
    if state is None:
        state = _RANDOM_STATES.state = np.random.RandomState(0)
    state.seed(seed)
    return state


def _row_norms(x: np.ndarray) -> np.ndarray:
    """Squared Euclidean norm of each row ``(n,)``, summed as scikit-learn's ``row_norms``."""
    return np.einsum("ij,ij->i", x, x)


def _squared_distances(a: np.ndarray, data: np.ndarray, data_norms: np.ndarray) -> np.ndarray:
    """``(m, n)`` squared distances from the rows of ``a`` to the rows of ``data``:
    ``-2 a.data^T + |a|^2 + |data|^2``, clipped at 0."""
    dist = -2 * (a @ data.T)
    dist += _row_norms(a)[:, None]
    dist += data_norms.reshape(1, -1)
    np.maximum(dist, 0, out=dist)
    return dist


def _plusplus(data: np.ndarray, k: int, norms: np.ndarray, weights: np.ndarray,
              random_state: np.random.RandomState) -> np.ndarray:
    """k-means++ initial centres ``(k, d)`` (Arthur & Vassilvitskii 2007, greedy variant with
    ``2 + int(log k)`` candidates per centre)."""
    n, d = data.shape
    centres = np.empty((k, d), dtype=data.dtype)
    trials = 2 + int(np.log(k))
    first = random_state.choice(n, p=weights / weights.sum())
    centres[0] = data[first]
    closest = _squared_distances(centres[0, np.newaxis], data, norms)
    potential = closest @ weights
    for c in range(1, k):
        draws = random_state.uniform(size=trials) * potential
        candidates = np.searchsorted(np.cumsum(weights * closest), draws)
        np.clip(candidates, None, closest.size - 1, out=candidates)  # rounding at the top end
        to_candidates = _squared_distances(data[candidates], data, norms)
        np.minimum(closest, to_candidates, out=to_candidates)
        potentials = to_candidates @ weights.reshape(-1, 1)
        best = np.argmin(potentials)
        potential = potentials[best]
        closest = to_candidates[best]
        centres[c] = data[candidates[best]]
    return centres


def _unrolled_squared_sums(diff: np.ndarray) -> np.ndarray:
    """Per row of ``diff`` ``(m, d)``, the sum of squares in scikit-learn's order: groups of
    four columns summed left to right, the groups accumulated in turn, then the leftover
    columns one by one.

    The running total is a cumulative sum along the row (``add.accumulate`` adds in order)
    over the group sums followed by the leftover squares: the same additions, in the same
    order, as accumulating them one at a time into zeros (squares are never ``-0.0``)."""
    sq = diff * diff
    m, d = sq.shape
    full = d // 4
    if d == 0:
        return np.zeros(m, dtype=diff.dtype)
    quads = sq[:, : 4 * full].reshape(m, full, 4)
    groups = ((quads[:, :, 0] + quads[:, :, 1]) + quads[:, :, 2]) + quads[:, :, 3]
    terms = np.concatenate([groups, sq[:, 4 * full :]], axis=1) if d % 4 else groups
    return np.cumsum(terms, axis=1)[:, -1]


_GEMM: list = []


def blas_gemm() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """``gemm(ct, rows, out)``: ``out += -2 * ct^T rows^T`` by SciPy's BLAS ``dgemm`` (the
    library scikit-learn's Lloyd step calls), found once.

    ``ct`` is ``(d, k)`` Fortran-ordered (the centres' rows), ``rows`` ``(m, d)`` C-ordered and
    ``out`` ``(k, m)`` Fortran-ordered, updated in place. The routine is called straight from
    SciPy's bundled OpenBLAS when the wheel ships one (:func:`_bundled_dgemm`): importing
    ``scipy.linalg`` for it would cost a rank ~0.2 s of imports. Otherwise through
    ``scipy.linalg.blas``.
    """
    if not _GEMM:
        _GEMM.append(_bundled_dgemm() or _scipy_dgemm())
    return _GEMM[0]


def _scipy_dgemm() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    from scipy.linalg.blas import dgemm

    def gemm(ct: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        dgemm(-2.0, ct, rows.T, beta=1.0, c=out, trans_a=1, trans_b=0, overwrite_c=1)

    return gemm


def _bundled_dgemm() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None:
    """SciPy's ``dgemm`` from the OpenBLAS in its wheel (``scipy.libs/libscipy_openblas*``,
    32-bit integers, symbol ``scipy_dgemm_``), loaded without importing SciPy; ``None`` when
    SciPy is installed another way."""
    import ctypes
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("scipy")
        if spec is None or spec.origin is None:
            return None
        libs = sorted((Path(spec.origin).parent.parent / "scipy.libs").glob("libscipy_openblas-*.so*"))
        if len(libs) != 1:
            return None
        routine = ctypes.CDLL(str(libs[0])).scipy_dgemm_
    except (OSError, AttributeError, ValueError):
        return None
    int_p, double_p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double)
    routine.restype = None
    routine.argtypes = [ctypes.c_char_p, ctypes.c_char_p, int_p, int_p, int_p, double_p, ctypes.c_void_p,
                        int_p, ctypes.c_void_p, int_p, double_p, ctypes.c_void_p, int_p]
    alpha, beta = ctypes.c_double(-2.0), ctypes.c_double(1.0)

    def gemm(ct: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        d, k = ct.shape
        m = rows.shape[0]
        if not (ct.flags.f_contiguous and rows.flags.c_contiguous and out.flags.f_contiguous
                and ct.dtype == rows.dtype == out.dtype == np.float64 and rows.shape[1] == d
                and out.shape == (k, m)):
            raise ValueError("kmeans: gemm operands have unexpected layouts")
        kk, mm, dd = ctypes.c_int(k), ctypes.c_int(m), ctypes.c_int(d)
        # column-major: out (k x m) = -2 * ct^T (k x d) @ rows^T (d x m) + out
        routine(b"T", b"N", kk, mm, dd, alpha, ct.ctypes.data, dd, rows.ctypes.data, dd, beta,
                out.ctypes.data, kk)

    # the raw call, for _Distances' blocks of one table (operands checked there)
    gemm.raw = (routine, alpha, beta)  # type: ignore[attr-defined]
    return gemm


class _Distances:
    """``|c|^2 - 2 x.c`` of every row of ``data`` ``(n, d)`` (C-ordered float64) and every centre,
    into a ``(k, n)`` Fortran-ordered array kept for the whole Lloyd run.

    Per block of :data:`_CHUNK` rows, one :func:`blas_gemm` call with the operands, flags,
    ``alpha = -2`` and ``beta = 1`` of scikit-learn's (column-major: ``op(A) = C`` transposed
    from the centres' rows, ``B`` = the block's rows, the product added to the norms), so it
    rounds as the estimator's does (numpy's product of a one-row block goes through ``gemv``,
    whose partial sums round differently: seen to flip near-tied labels). A column range of the
    Fortran-ordered result is exactly the array a call on that block alone would fill; the
    blocks' sizes and addresses are worked out once.
    """

    def __init__(self, data: np.ndarray, k: int) -> None:
        n, d = data.shape
        self.data = data
        self.dist = np.empty((k, n), order="F")
        gemm = blas_gemm()
        raw = getattr(gemm, "raw", None)
        self._gemm = gemm
        self._calls: list[tuple[Any, ...]] = []
        if raw is not None:
            import ctypes

            kk, dd = ctypes.c_int(k), ctypes.c_int(d)
            b, c = data.ctypes.data, self.dist.ctypes.data
            self._calls = [(ctypes.c_int(min(_CHUNK, n - s)), b + 8 * d * s, c + 8 * k * s)
                           for s in range(0, n, _CHUNK)]
            self._raw = (raw[0], raw[1], raw[2], kk, dd)

    def __call__(self, centres: np.ndarray) -> np.ndarray:
        dist = self.dist
        centres = np.ascontiguousarray(centres)
        dist[...] = _row_norms(centres)[:, None]
        ct = centres.T  # (d, k): a Fortran-ordered view of the centres' C-ordered rows
        if self._calls:
            routine, alpha, beta, kk, dd = self._raw
            a = ct.ctypes.data
            for mm, b, c in self._calls:
                routine(b"T", b"N", kk, mm, dd, alpha, a, dd, b, dd, beta, c, kk)
        else:
            for start in range(0, self.data.shape[0], _CHUNK):
                self._gemm(ct, self.data[start : start + _CHUNK], dist[:, start : start + _CHUNK])
        return dist


def _cluster_sums(data: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Per cluster, the sum of its rows ``(k, d)``, added row by row in row order into zeros
    (``np.add.at``'s order). For two columns or more, each cluster's rows are reduced over
    axis 0, which numpy does one row at a time down each column (it sums pairwise only along
    a contiguous axis); ``+ 0.0`` turns the ``-0.0`` of an all-``-0.0`` column into the
    ``0.0`` that zeros plus ``-0.0`` give. A single column would be summed pairwise: ``add.at``."""
    d = data.shape[1]
    if d < 2:
        sums = np.zeros((k, d))
        np.add.at(sums, labels, data)
        return sums
    sums = np.empty((k, d))
    for j in range(k):
        np.add.reduce(data[labels == j], axis=0, out=sums[j])  # zeros where the cluster is empty
    sums += 0.0
    return sums


def _update(data: np.ndarray, old: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New centres ``(k, d)`` from ``labels`` and the shift of each centre ``(k,)``."""
    k = old.shape[0]
    sums = _cluster_sums(data, labels, k)  # row by row, in row order
    counts = np.bincount(labels, minlength=k)
    if counts.all():  # every cluster holds rows: each centre is its sum times 1 / count
        sums *= (1.0 / counts)[:, None]
        return sums, np.sqrt(_unrolled_squared_sums(sums - old))
    counts = counts.astype(np.float64)
    empty = np.flatnonzero(counts == 0)
    far = ((data - old[labels]) ** 2).sum(axis=1)
    if np.max(far) != 0:
        farthest = np.argpartition(far, -empty.size)[: -empty.size - 1 : -1]
        for cluster, row in zip(empty, farthest):
            source = labels[row]
            sums[source] -= data[row]
            sums[cluster] = data[row]
            counts[cluster] = 1.0
            counts[source] -= 1.0
    biggest = int(np.argmax(counts))
    for j in range(k):
        if counts[j] > 0:
            sums[j] *= 1.0 / counts[j]
        else:  # still empty (fewer distinct rows than clusters): on the biggest cluster's centre
            sums[j] = sums[biggest]
    return sums, np.sqrt(_unrolled_squared_sums(sums - old))


def _lloyd(data: np.ndarray, centres: np.ndarray, tol: float, inertia: bool = True) -> tuple[np.ndarray, float]:
    """One Lloyd run from ``centres``: labels ``(n,)`` int32 (each row's nearest centre, the
    first one on ties) and inertia (summed squared distances to the assigned centres; ``inertia``
    false: not computed, ``inf``, for a single run, which has nothing to be compared with)."""
    labels = np.full(data.shape[0], -1, dtype=np.int32)
    previous = labels.copy()
    distances = _Distances(data, centres.shape[0])
    strict = False
    for _ in range(MAX_ITER):
        labels[:] = distances(centres).argmin(axis=0)
        centres, shift = _update(data, centres, labels)
        if (labels == previous).all():
            strict = True
            break
        if (shift ** 2).sum() <= tol:
            break
        previous[:] = labels
    if not strict:
        labels[:] = distances(centres).argmin(axis=0)
    if not inertia:
        return labels, math.inf
    per_row = _unrolled_squared_sums(data - centres[labels])
    return labels, float(np.cumsum(per_row)[-1])  # summed in row order


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether each label of ``a`` maps to a single label of ``b`` (scikit-learn's one-way test
    of two clusterings being the same up to renaming)."""
    for u in distinct_ints(a):
        mapped = b[a == u]
        if np.any(mapped != mapped[0]):
            return False
    return True


def _check(x: np.ndarray, n_clusters: int) -> np.ndarray:
    """``x`` as a C-ordered float64 array (``x`` itself when it is one: never written to), with the
    estimator's errors for what it refuses."""
    data = np.asarray(x, dtype=np.float64, order="C")
    if data.ndim != 2:
        raise ValueError(f"Expected 2D array, got an array of shape {data.shape}")
    if not np.isfinite(data).all():
        if np.isnan(data).any():
            raise ValueError("Input X contains NaN.")
        raise ValueError("Input X contains infinity or a value too large for dtype('float64').")
    if data.shape[1] < 1 or data.shape[0] < 1:
        raise ValueError(f"Found array with shape {data.shape}: k-means needs a row and a column")
    if data.shape[0] < n_clusters:
        raise ValueError(f"n_samples={data.shape[0]} should be >= n_clusters={n_clusters}.")
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _estimator_labels(x: np.ndarray, n_clusters: int, n_init: int, seed: object) -> np.ndarray:
    """The estimator's labels, its duplicate-rows warning re-issued as :class:`ClusteringWarning`."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        labels = KMeans(n_clusters=n_clusters, n_init=n_init, random_state=seed).fit_predict(x)
    for w in caught:
        category = ClusteringWarning if issubclass(w.category, ConvergenceWarning) else w.category
        warnings.warn(str(w.message), category, stacklevel=3)
    return labels


def kmeans_labels(x: np.ndarray, n_clusters: int, n_init: int, seed: int) -> np.ndarray:
    """``KMeans(n_clusters, n_init=n_init, random_state=seed).fit_predict(x)``: the same labels
    ``(n,)`` int32, bit for bit (see the module docstring).

    ``x`` may be float64, integer or boolean (converted to float64, as the estimator does).
    Anything else -- float32 data, whose arithmetic the estimator keeps in float32, or a seed
    that is not an integer -- goes to the estimator itself (scikit-learn imported then).

    Warns :class:`ClusteringWarning` when fewer distinct clusters than ``n_clusters`` were
    found (duplicate rows), as the estimator warns.
    """
    kind = np.asarray(x).dtype.kind
    if kind not in "biuf" or (kind == "f" and np.asarray(x).dtype != np.float64) or not _is_int(seed) \
            or not _is_int(n_clusters) or not _is_int(n_init):
        return _estimator_labels(x, n_clusters, n_init, seed)
    k, restarts = int(n_clusters), int(n_init)
    if k < 1:
        raise ValueError(f"kmeans_labels: n_clusters must be >= 1, got {n_clusters!r}")
    if restarts < 1:
        raise ValueError(f"kmeans_labels: n_init must be >= 1, got {n_init!r}")
    data = _check(x, k)
    # np.var's own steps (column sums over the rows divided by n, the centred rows, their squares
    # summed over the rows divided by n), keeping the centred rows, which k-means runs on
    data = data - data.mean(axis=0)
    tol = float(np.mean((data * data).sum(axis=0) / data.shape[0])) * TOL
    random_state = _seeded_random_state(int(seed))
    weights = np.ones(data.shape[0], dtype=np.float64)
    norms = _row_norms(data)
    best_labels, best_inertia = None, math.inf
    for _ in range(restarts):
        centres = _plusplus(data, k, norms, weights, random_state)
        labels, inertia = _lloyd(data, centres, tol, restarts > 1)
        if best_labels is None or (inertia < best_inertia and not _same_partition(labels, best_labels)):
            best_labels, best_inertia = labels, inertia
    distinct = int(np.count_nonzero(np.bincount(best_labels, minlength=k)))
    if distinct < k:  # the estimator's warning, word for word
        warnings.warn(
            f"Number of distinct clusters ({distinct}) found smaller than n_clusters ({k}). "
            "Possibly due to duplicate points in X.",
            ClusteringWarning,
            stacklevel=2,
        )
    return best_labels
