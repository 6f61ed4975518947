"""Pairwise dependence measures for LearnSPN column splits: RDC and the G-test.

Both functions take one data slice ``(n, d)`` and return a symmetric ``(d, d)`` matrix for all
pairs at once, so a column split costs one pass over the data, not ``d**2`` passes.

* :func:`rdc_matrix` is the randomised dependence coefficient (Lopez-Paz et al. 2013): copula
  transform (ECDF), random sinusoidal features, then the largest canonical correlation between
  the features of two columns. Categorical columns are one-hot encoded before the projection, as
  in MSPN (Molina et al. 2018). Values are in ``[0, 1]``.
* :func:`gtest_pvalues` is the G-test of pairwise independence for discrete columns (Gens &
  Domingos 2013); it returns p-values (small = dependent).

Instead of running one CCA per pair, every column's features are whitened once (eigen-
decomposition of its own ``(k, k)`` covariance, keeping only numerically non-zero directions);
the canonical correlations of a pair are then the singular values of the whitened
cross-covariance block, and the largest one is read off a batched ``(k, k)`` eigenproblem.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
from scipy.stats import chi2, rankdata

RDC_K = 10
"""Random features per column (MSPN's default)."""

RDC_S = 1.0 / 6.0
"""Scale of the random projections (Lopez-Paz et al.'s default)."""

_RANK_TOL = 1e-10
"""Relative eigenvalue below which a feature direction is numerically absent (e.g. a binary
column's sin-features span one centred direction only; keeping the rest would amplify rounding
noise into spurious correlation)."""

_ABS_TOL = 1e-13
"""Absolute feature variance below which a direction is rounding noise (features lie in [-1, 1])."""

_ROW_CHUNK = 8192
"""Rows per block when accumulating the feature covariance (bounds memory to O(chunk * d * k))."""


_WORK = threading.local()


@contextmanager
def reuse_work_arrays() -> Iterator[None]:
    """Within this block (per thread; re-entrant), :func:`rdc_matrix` keeps its large work arrays
    between calls instead of allocating them afresh.

    One RDC over ``d`` columns with ``k`` features allocates several ``(d k, d k)`` and
    ``(d (d-1) / 2, k, k)`` float64 temporaries (~15 MB at d = 31, k = 20). Freed after every
    call, the allocator hands the pages back to the OS and the next call faults them in again
    (measured ~3,500 minor page faults per such call, about as long as the arithmetic on slices
    of a hundred rows). LearnSPN runs one RDC per column split, so :func:`mpifc.circuit.learnspn`
    wraps its whole run in this block; the arrays are dropped when the block ends.
    """
    if getattr(_WORK, "arrays", None) is not None:
        yield
        return
    _WORK.arrays = {}
    try:
        yield
    finally:
        _WORK.arrays = None


def _work(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float64 array of ``shape`` with undefined contents: inside :func:`reuse_work_arrays` a
    view of the buffer kept under ``name`` (grown when too small), else a fresh one."""
    arrays = getattr(_WORK, "arrays", None)
    if arrays is None:
        return np.empty(shape)
    size = 1
    for s in shape:
        size *= int(s)
    buf = arrays.get(name)
    if buf is None or buf.size < size:
        buf = arrays[name] = np.empty(size)
    return buf[:size].reshape(shape)


TIES = ("max", "ordinal")
"""Copula conventions for tied values (see :func:`ecdf`)."""


def ecdf(values: np.ndarray, ties: str = "max") -> np.ndarray:
    """Empirical CDF of each column, ``(n, m) -> (n, m)`` in ``(0, 1]``.

    ``ties="max"`` (default; MSPN's ``ecdf``): tied values share one value, ``#{x_i <= x} / n``,
    so the transform is a function of the value alone. ``ties="ordinal"`` (SPFlow 1.1.0 and the
    reference ``rdc.py`` it copies): ties get distinct ranks in row order. That is *not* a
    function of the value: on discrete data every column's tie blocks are ordered by the same
    row index, which makes independent columns look dependent (two independent Bernoulli(0.05)
    columns score an RDC near 0.9). It exists to reproduce SPFlow's statistic, not as a default.
    """
    if ties not in TIES:
        raise ValueError(f"ecdf: ties must be one of {TIES}, got {ties!r}")
    n = values.shape[0]
    if ties == "ordinal" and _plain_table(values):
        return _ordinal_ranks(values) / float(n)
    return rankdata(values, method=ties, axis=0) / float(n)


def _plain_table(values: np.ndarray) -> bool:
    """Whether ``values`` is a non-empty 2-D real array without NaN (an infinite sum of finite
    values only sends it to SciPy)."""
    if not isinstance(values, np.ndarray) or values.ndim != 2 or values.size == 0:
        return False
    if values.dtype.kind not in "biuf":
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(values.sum()))


def _ordinal_ranks(values: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(values, method="ordinal", axis=0)``: the same int64 ranks (ties in
    row order, i.e. the inverse of the stable sort, which is unique), computed as SciPy does
    (stable argsort of the transposed columns, ranks scattered back) without its ~50 us of
    array-API dispatch and NaN handling per call (no NaN here, see :func:`_plain_table`)."""
    n, m = values.shape
    order = np.argsort(values.T, axis=-1, kind="stable")
    ranks = np.empty((m, n), dtype=np.int64)
    np.put_along_axis(ranks, order, np.arange(1, n + 1, dtype=np.int64), axis=-1)
    return ranks.T


def _copula_inputs(data: np.ndarray, categorical: Sequence[bool], cards: Sequence[int],
                   ties: str = "max") -> list[np.ndarray]:
    """Per column, the ECDF-transformed inputs to the random projection, with a bias column."""
    n = data.shape[0]
    cont = [j for j in range(data.shape[1]) if not categorical[j]]
    out: list[np.ndarray | None] = [None] * data.shape[1]
    if cont:
        u = ecdf(data[:, cont], ties)
        for pos, j in enumerate(cont):
            out[j] = np.column_stack([u[:, pos], np.ones(n)])
    for j in range(data.shape[1]):
        if categorical[j]:
            c = max(int(cards[j]), 1)
            onehot = np.zeros((n, c))
            onehot[np.arange(n), data[:, j].astype(np.int64).clip(0, c - 1)] = 1.0
            out[j] = np.column_stack([ecdf(onehot), np.ones(n)])
    return out  # type: ignore[return-value]


def _projection_inputs(data: np.ndarray, categorical: Sequence[bool], cards: Sequence[int],
                       ties: str) -> tuple[np.ndarray, list[int]]:
    """:func:`_copula_inputs` laid out for the batched projection: a ``(d, n, width)`` work
    array holding column ``j``'s inputs in ``[j, :, :w_j]`` and zeros after, and the widths
    ``w_j`` (2 for a continuous column, ``cards[j] + 1`` for a one-hot one). The same values,
    copied straight into place (no per-column stacking and no transposing copy)."""
    n, d = data.shape
    cont = [j for j in range(d) if not categorical[j]]
    onehot_ecdf = {}
    for j in range(d):
        if categorical[j]:
            c = max(int(cards[j]), 1)
            onehot = np.zeros((n, c))
            onehot[np.arange(n), data[:, j].astype(np.int64).clip(0, c - 1)] = 1.0
            onehot_ecdf[j] = ecdf(onehot)
    widths = [onehot_ecdf[j].shape[1] + 1 if categorical[j] else 2 for j in range(d)]
    width = max(widths)
    xt = _work("xt", (d, n, width))
    if min(widths) < width:
        xt.fill(0.0)
    if cont:
        xt[cont, :, 0] = ecdf(data[:, cont], ties).T
        xt[cont, :, 1] = 1.0
    for j, u in onehot_ecdf.items():
        xt[j, :, : u.shape[1]] = u
        xt[j, :, u.shape[1]] = 1.0
    return xt, widths


_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pairs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(d, 1)``, computed once per ``d`` (read-only arrays)."""
    pairs = _PAIRS.get(d)
    if pairs is None:
        iu, ju = np.triu_indices(d, 1)
        iu.flags.writeable = False
        ju.flags.writeable = False
        pairs = _PAIRS[d] = (iu, ju)
    return pairs


def rdc_matrix(
    data: np.ndarray,
    categorical: Sequence[bool] | None = None,
    cards: Sequence[int] | None = None,
    *,
    k: int = RDC_K,
    s: float = RDC_S,
    rng: np.random.Generator,
    ties: str = "max",
) -> np.ndarray:
    """Randomised dependence coefficient of every pair of columns.

    Args:
        data: ``(n, d)`` float slice, no NaN.
        categorical: per column, whether it is one-hot encoded first (default: none).
        cards: per column, the number of categories (used for categorical columns only).
        k: random features per column; categorical columns get at least ``cards[j]``.
        s: projection scale.
        rng: source of the random projections.
        ties: copula convention for tied values, ``"max"`` (a faithful RDC; on two-valued
            columns it is exactly ``|Pearson|``) or ``"ordinal"`` (SPFlow 1.1.0's, row-order
            tie-breaking; see :func:`ecdf`).

    Returns:
        ``(d, d)`` symmetric float64 matrix in ``[0, 1]`` with ones on the diagonal; a constant
        column has RDC 0 with every other column.
    """
    n, d = data.shape
    categorical = [False] * d if categorical is None else list(categorical)
    cards = [2] * d if cards is None else list(cards)
    if d == 0:
        return np.zeros((0, 0))
    if d == 1 or n < 2:
        return np.eye(d)
    data = np.asarray(data, dtype=np.float64)
    if ties not in TIES:
        raise ValueError(f"rdc_matrix: ties must be one of {TIES}, got {ties!r}")
    if ties == "max" and _all_two_valued(data):
        return _binary_rdc(data)
    return _random_feature_rdc(data, categorical, cards, k, s, rng, ties)


def _random_feature_rdc(
    data: np.ndarray,
    categorical: Sequence[bool],
    cards: Sequence[int],
    k: int,
    s: float,
    rng: np.random.Generator,
    ties: str = "max",
) -> np.ndarray:
    """The general RDC computation behind :func:`rdc_matrix` (same arguments).

    The large intermediates (the ``(d k, d k)`` moment matrices, the ``(d (d-1) / 2, k, k)``
    stacks of cross blocks) are written into :func:`_work` arrays with ``out=``: the same
    operations on the same operands, so the same bits, but inside :func:`reuse_work_arrays`
    no fresh pages per call (see there).
    """
    n, d = data.shape
    kk = max([k] + [int(cards[j]) for j in range(d) if categorical[j]])
    m = d * kk
    # Same-shaped projections for every column (zero-padded rows for narrower inputs) let one
    # batched matmul build all features at once.
    xt, widths = _projection_inputs(data, categorical, cards, ties)  # (d, n, width)
    width = xt.shape[2]
    proj = np.zeros((d, width, kk))
    gauss = rng.standard_normal((d, width, kk))
    cont = [j for j in range(d) if not categorical[j]]
    if cont:  # continuous columns: inputs (u, 1), width 2
        proj[cont, :2] = gauss[cont, :2] * (s / 2)
    for j in range(d):
        if categorical[j]:
            proj[j, : widths[j]] = gauss[j, : widths[j]] * (s / widths[j])

    # Mean and raw second moments of the (n, d*kk) feature matrix, accumulated in row blocks.
    total = np.zeros(m)
    gram = _work("gram", (m, m))
    for lo in range(0, n, _ROW_CHUNK):
        rows = min(n, lo + _ROW_CHUNK) - lo
        lin = np.matmul(xt[:, lo : lo + rows], proj, out=_work("lin", (d, rows, kk)))
        f3 = np.sin(lin, out=_work("f3", (d, rows, kk)))  # (d, rows, kk)
        feats = _work("feats", (rows, m))
        np.copyto(feats.reshape(rows, d, kk), f3.transpose(1, 0, 2))
        total += feats.sum(0)
        if lo == 0:  # gram = 0.0 + the first block's products (0.0 + x, bit for bit)
            np.matmul(feats.T, feats, out=gram)
            gram += 0.0
        else:  # later blocks: products into pair stack a's buffer (unused until the pairs below)
            gram += np.matmul(feats.T, feats, out=_work("pairs_a", (m, m)))
    mean = total / n
    # Covariance blocks, cov = gram / n - outer(mean, mean), element by element: only the
    # blocks used below are formed (the diagonal ones and those above it), each written once
    # into place. raw[i, :, j, :] is the (i, j) block of raw moments.
    raw = gram.reshape(d, kk, d, kk)
    mean_blocks = mean.reshape(d, kk)
    columns = np.arange(d)

    # Whitening per column: W_j = V diag(lam^-1/2) on the directions that exist.
    diag = np.divide(raw[columns, :, columns, :], n)  # (d, kk, kk): the (j, j) blocks
    diag -= mean_blocks[:, :, None] * mean_blocks[:, None, :]
    diag = 0.5 * (diag + diag.transpose(0, 2, 1))
    lam, vec = np.linalg.eigh(diag)
    lam_max = np.maximum(lam.max(axis=1, keepdims=True), 0.0)
    # Features are bounded by 1, so variances below _ABS_TOL are rounding noise of E[f^2]-E[f]^2.
    keep = (lam > _RANK_TOL * lam_max) & (lam > _ABS_TOL)
    keep &= ~(np.ptp(data, axis=0) == 0)[:, None]
    inv_sqrt = np.where(keep, 1.0 / np.sqrt(np.maximum(lam, 1e-300)), 0.0)
    white = vec * inv_sqrt[:, None, :]  # (d, kk, kk)

    # Whitened cross-covariances, then their spectral norms = largest canonical correlations.
    # One eigenproblem per unordered pair (i < j): the (j, i) block is the transpose of the
    # (i, j) one and has the same singular values, and the diagonal is 1 by definition. The
    # batched (k, k) eigensolves are the fixed cost of a split, which dominates on small slices.
    iu, ju = _pairs(d)
    shape = (len(iu), kk, kk)
    # Three stacks of pair blocks serve seven intermediates, each written once its previous
    # occupant is dead: a = cov blocks (i, j > i) -> cross, b = outer blocks -> white[iu] ->
    # white[ju], c = left -> sym.
    a, b, c = (_work(f"pairs_{name}", shape) for name in "abc")
    start = 0
    for i in range(d - 1):  # a = gram blocks (i, j > i) / n, a row of blocks at a time (iu is sorted)
        np.divide(raw[i, :, i + 1 :, :].transpose(1, 0, 2), n, out=a[start : start + d - 1 - i])
        start += d - 1 - i
    a -= np.multiply(mean_blocks[iu][:, :, None], mean_blocks[ju][:, None, :], out=b)
    np.take(white, iu, axis=0, out=b)
    left = np.matmul(b.transpose(0, 2, 1), a, out=c)
    np.take(white, ju, axis=0, out=b)
    cross = np.matmul(left, b, out=a)
    sym = np.matmul(cross, cross.transpose(0, 2, 1), out=c)
    top = np.sqrt(np.clip(np.linalg.eigvalsh(sym)[:, -1], 0.0, 1.0))
    out = np.eye(d)
    out[iu, ju] = top
    out[ju, iu] = top
    return out


def _all_two_valued(data: np.ndarray) -> bool:
    """Whether every column takes at most two distinct values (e.g. binary data)."""
    lo, hi = data.min(0), data.max(0)
    return bool(np.all((data == lo) | (data == hi)))


def _binary_rdc(data: np.ndarray) -> np.ndarray:
    """Exact RDC when every column is two-valued: ``|Pearson correlation|``.

    Every function of a two-valued variable is affine in it, so its random features span a single
    centred direction and the largest canonical correlation of two such columns is their absolute
    correlation. This is the limit :func:`rdc_matrix` computes, at ``O(n d^2)`` instead of
    ``O(n d^2 k^2)``.
    """
    centred = data - data.mean(0)
    std = np.sqrt((centred**2).mean(0))
    alive = std > 1e-12 * np.maximum(np.abs(data).max(0), 1.0)
    z = np.where(alive, centred / np.where(alive, std, 1.0), 0.0)
    out = np.abs(z.T @ z) / data.shape[0]
    out = np.clip(0.5 * (out + out.T), 0.0, 1.0)
    np.fill_diagonal(out, 1.0)
    return out


def gtest_statistics(data: np.ndarray, cards: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """G statistics and degrees of freedom of the pairwise G-test of independence.

    Args:
        data: ``(n, d)`` slice with integer-valued entries ``0 .. cards[j]-1``.
        cards: per column, its number of values.

    Returns:
        ``(g, dof)``: ``(d, d)`` symmetric float64 arrays. Degrees of freedom count the values
        present in this slice, as a contingency table would (0 for a pair with a column that
        takes a single value).
    """
    n, d = data.shape
    cards = [max(int(c), 1) for c in cards]
    if all(c == 2 for c in cards):
        return _gtest_binary(data)
    offsets = np.concatenate([[0], np.cumsum(cards)])
    onehot = np.zeros((n, int(offsets[-1])))
    ints = data.astype(np.int64)
    for j in range(d):
        onehot[np.arange(n), offsets[j] + np.clip(ints[:, j], 0, cards[j] - 1)] = 1.0
    counts = onehot.T @ onehot  # joint counts of every value pair, (K, K)
    marg = onehot.sum(0)
    expected = np.outer(marg, marg) / max(n, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(counts > 0, counts * np.log(counts / expected), 0.0)
    starts = offsets[:-1]
    g = 2.0 * np.add.reduceat(np.add.reduceat(terms, starts, axis=0), starts, axis=1)
    present = np.add.reduceat((marg > 0).astype(np.float64), starts)
    return g, np.outer(present - 1, present - 1)


def _gtest_binary(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gtest_statistics` of 0/1 columns from one ``(d, d)`` product: the four cells of
    every 2x2 table follow from the co-occurrence counts ``X^T X`` and the column counts (a
    quarter of the one-hot product's work)."""
    n = data.shape[0]
    x = np.clip(data, 0.0, 1.0)
    c11 = x.T @ x
    n1 = np.diag(c11).copy()
    n0 = n - n1
    cells = ((c11, n1[:, None] * n1[None, :]), (n1[:, None] - c11, n1[:, None] * n0[None, :]),
             (n1[None, :] - c11, n0[:, None] * n1[None, :]),
             (n - n1[:, None] - n1[None, :] + c11, n0[:, None] * n0[None, :]))
    g = np.zeros_like(c11)
    with np.errstate(divide="ignore", invalid="ignore"):
        for count, outer in cells:
            g += np.where(count > 0, count * np.log(count * max(n, 1) / outer), 0.0)
    present = (n1 > 0).astype(np.float64) + (n0 > 0)
    return 2.0 * g, np.outer(present - 1, present - 1)


def gtest_pvalues(data: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """p-values of the pairwise G-test of independence for discrete columns.

    Args:
        data: ``(n, d)`` slice with integer-valued entries ``0 .. cards[j]-1``.
        cards: per column, its number of values.

    Returns:
        ``(d, d)`` symmetric matrix of p-values (diagonal 0); a pair involving a column that takes
        a single value in the slice has p-value 1 (no evidence of dependence).
    """
    g, dof = gtest_statistics(data, cards)
    with np.errstate(invalid="ignore"):
        p = np.where(dof > 0, chi2.sf(np.maximum(g, 0.0), np.maximum(dof, 1)), 1.0)
    np.fill_diagonal(p, 0.0)
    return p


def gtest_dependent(data: np.ndarray, cards: Sequence[int], pvalue: float) -> np.ndarray:
    """``gtest_pvalues(data, cards) < pvalue`` (diagonal True) without a p-value per pair: the
    statistic is compared with the chi-squared critical value of each distinct dof (the
    survival function is decreasing), which is what costs in a G-test column split."""
    g, dof = gtest_statistics(data, cards)
    out = np.zeros(g.shape, dtype=bool)
    for k in np.unique(dof[dof > 0]):
        at = dof == k
        out[at] = np.maximum(g[at], 0.0) > chi2.isf(pvalue, k)
    np.fill_diagonal(out, True)
    return out
