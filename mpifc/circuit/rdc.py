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
A slice too wide for its ``(d k, d k)`` moment matrix to fit :data:`_GRAM_BYTES` is computed in
blocks of columns, with the same result to the bit (see :func:`_random_feature_rdc`).
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

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

_GRAM_BYTES = 64 << 20
"""Largest moment matrix of random features formed at once (bytes): up to this the RDC of all
columns is one block; a wider slice is computed in column blocks (:func:`_column_blocks`), so that
memory no longer grows with the square of the column count."""

_FEATURE_BYTES = 256 << 20
"""Largest feature matrix of one row block formed at once (bytes); see :data:`_GRAM_BYTES`."""


_WORK = threading.local()


@contextmanager
def reuse_work_arrays() -> Iterator[None]:
    """Within this block (per thread; re-entrant), :func:`rdc_matrix` keeps its large work arrays
    between calls instead of allocating them afresh.

    One RDC over ``d`` columns with ``k`` features allocates several ``(d k, d k)`` and
    ``(d (d-1) / 2, k, k)`` float64 temporaries (~15 MB at d = 31, k = 20; on wider slices,
    those of its column blocks, bounded by :data:`_GRAM_BYTES` and :data:`_FEATURE_BYTES`). Freed after every
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
    if not _real_table(values):
        from scipy.stats import rankdata  # other inputs: SciPy's ranks and errors

        return rankdata(values, method=ties, axis=0) / float(n)
    ranks = _ordinal_ranks(values) if ties == "ordinal" else _max_ranks(values)
    if values.dtype.kind == "f":
        missing = np.isnan(values).any(axis=0)
        if missing.any():  # SciPy's policy: a column holding NaN is NaN throughout
            ranks = ranks.astype(np.float64)
            ranks[:, missing] = np.nan
    return ranks / float(n)


def _real_table(values: np.ndarray) -> bool:
    """Whether ``values`` is a non-empty 2-D boolean, integer or real array (NaN allowed)."""
    return (isinstance(values, np.ndarray) and values.ndim == 2 and values.size > 0
            and values.dtype.kind in "biuf")


def _ordinal_ranks(values: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(values, method="ordinal", axis=0)`` of a NaN-free column: the same
    int64 ranks (ties in row order, i.e. the inverse of the stable sort, which is unique),
    computed as SciPy does (stable argsort of the transposed columns, ranks scattered back)
    without its ~50 us of array-API dispatch and NaN handling per call."""
    n, m = values.shape
    columns = np.ascontiguousarray(values.T)
    lo, hi = columns.min(axis=1, keepdims=True), columns.max(axis=1, keepdims=True)
    upper = columns == hi
    if ((columns == lo) | upper).all():
        # Every column two-valued (or constant): the stable sort puts a column's low rows first,
        # in row order, then its high rows, so the ranks are running counts -- no sort needed.
        high_count = np.cumsum(upper, axis=1, dtype=np.int64)
        low_count = np.arange(1, n + 1, dtype=np.int64) - high_count
        return np.where(upper, low_count[:, -1:] + high_count, low_count).T
    order = np.argsort(columns, axis=-1, kind="stable")
    ranks = np.empty((m, n), dtype=np.int64)
    np.put_along_axis(ranks, order, np.arange(1, n + 1, dtype=np.int64), axis=-1)
    return ranks.T


def _max_ranks(values: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(values, method="max", axis=0)`` of a NaN-free column: int64
    ``#{i: x_i <= x}`` per entry (the last sorted position of its tie block), without importing
    ``scipy.stats`` (~45 MB and ~0.5 s per process)."""
    n, m = values.shape
    columns = values.T
    order = np.argsort(columns, axis=-1, kind="stable")
    ordered = np.take_along_axis(columns, order, axis=-1)
    # position p ends its tie block when the next sorted value differs (or p is the last)
    ends = np.full((m, n), n, dtype=np.int64)
    last = ordered[:, 1:] != ordered[:, :-1]
    ends[:, :-1] = np.where(last, np.arange(1, n, dtype=np.int64), n)
    ends = np.minimum.accumulate(ends[:, ::-1], axis=-1)[:, ::-1]
    ranks = np.empty((m, n), dtype=np.int64)
    np.put_along_axis(ranks, order, ends, axis=-1)
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


def _column_blocks(d: int, kk: int, rows: int, block: int | None = None) -> list[tuple[int, int]]:
    """Contiguous column ranges ``[(lo, hi), ...]`` covering ``0 .. d-1`` for
    :func:`_random_feature_rdc`.

    ``block`` is the most columns per range (``None``: from :data:`_GRAM_BYTES` and
    :data:`_FEATURE_BYTES`, so that two ranges' features and their moment matrix fit; one range
    whenever all columns' do). Ranges differ in size by at most one and hold at least two
    columns (so that a range's own feature matrix is never a single column, which numpy would
    reduce and multiply by other routines), even where that exceeds ``block``.
    """
    if block is None:
        m = d * kk
        if m * m * 8 <= _GRAM_BYTES and rows * m * 8 <= _FEATURE_BYTES:
            return [(0, d)]
        pair_features = min(math.isqrt(_GRAM_BYTES // 8), _FEATURE_BYTES // (8 * max(rows, 1)))
        block = pair_features // (2 * kk)
    block = max(1, int(block))
    n_blocks = max(1, min(-(-d // block), d // 2))
    edges = [d * b // n_blocks for b in range(n_blocks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _fill_features(feats: np.ndarray, xt: np.ndarray, proj: np.ndarray,
                   ranges: Sequence[tuple[int, int]], lo: int, kk: int) -> None:
    """Random features of the columns in ``ranges`` (concatenated in that order) for the rows
    ``lo .. lo + rows - 1`` into ``feats`` ``(rows, sum(hi - lo) * kk)``: column ``j``'s ``kk``
    features side by side. Every column's projection is its own matrix product and ``sin`` is
    element-wise, so a column's features do not depend on which other columns are computed
    with it."""
    rows = feats.shape[0]
    at = 0
    for c0, c1 in ranges:
        c = c1 - c0
        lin = np.matmul(xt[c0:c1, lo : lo + rows], proj[c0:c1], out=_work("lin", (c, rows, kk)))
        f3 = np.sin(lin, out=_work("f3", (c, rows, kk)))  # (c, rows, kk)
        np.copyto(feats[:, at : at + c * kk].reshape(rows, c, kk), f3.transpose(1, 0, 2))
        at += c * kk


def _moments(xt: np.ndarray, proj: np.ndarray, ranges: Sequence[tuple[int, int]], kk: int,
             total: np.ndarray | None = None, first: np.ndarray | None = None) -> np.ndarray:
    """Raw second moments (sums over rows, not yet divided by ``n``) ``(w, w)`` of the features of
    the columns in ``ranges``, ``w = kk * (number of columns)``, accumulated in row blocks of
    :data:`_ROW_CHUNK`; with ``total`` ``(w,)`` (zeros on entry), also the feature sums.
    ``first``: the features ``(n, kk * c)`` of the first range, already computed (one row block
    only).

    Each row block's products come from one ``A.T @ A`` (numpy calls BLAS ``syrk``): an entry
    of that product depends only on its two feature columns, not on the other columns of ``A``
    (checked bit for bit in ``tests/circuit/test_rdc_blocked.py``), so the moments of any set of
    columns equal the same entries of the moment matrix of all of them. The column sums reduce
    over rows in row order for any width of at least two, which :func:`_column_blocks` ensures.
    """
    n = xt.shape[1]
    w = kk * sum(c1 - c0 for c0, c1 in ranges)
    gram = _work("gram", (w, w))
    for lo in range(0, n, _ROW_CHUNK):
        rows = min(n, lo + _ROW_CHUNK) - lo
        feats = _work("feats", (rows, w))
        if first is None:
            _fill_features(feats, xt, proj, ranges, lo, kk)
        else:
            np.copyto(feats[:, : first.shape[1]], first)
            _fill_features(feats[:, first.shape[1] :], xt, proj, ranges[1:], lo, kk)
        if total is not None:
            total += feats.sum(0)
        if lo == 0:  # gram = 0.0 + the first block's products (0.0 + x, bit for bit)
            np.matmul(feats.T, feats, out=gram)
            gram += 0.0
        else:  # later blocks: products into pair stack a's buffer (unused until the pairs below)
            gram += np.matmul(feats.T, feats, out=_work("pairs_a", (w, w)))
    return gram


def _pair_tops(a: np.ndarray, mean_blocks: np.ndarray, white: np.ndarray, iu: np.ndarray,
               ju: np.ndarray) -> np.ndarray:
    """Largest canonical correlation ``(p,)`` of each column pair ``(iu[q], ju[q])``, given in
    ``a`` ``(p, kk, kk)`` their raw moment blocks divided by ``n`` (overwritten).

    ``mean_blocks`` ``(d, kk)`` and ``white`` ``(d, kk, kk)`` are per column. Every step is
    element-wise or one small matrix product / eigensolve per pair, so a pair's value does not
    depend on which pairs share the stack.
    """
    kk = a.shape[1]
    # Three stacks serve seven intermediates, each written once its previous occupant is dead:
    # a = cov blocks -> cross, b = outer blocks -> white[iu] -> white[ju], c = left -> sym.
    b, c = (_work(f"pairs_{name}", (len(iu), kk, kk)) for name in "bc")
    a -= np.multiply(mean_blocks[iu][:, :, None], mean_blocks[ju][:, None, :], out=b)
    np.take(white, iu, axis=0, out=b)
    left = np.matmul(b.transpose(0, 2, 1), a, out=c)
    np.take(white, ju, axis=0, out=b)
    cross = np.matmul(left, b, out=a)
    sym = np.matmul(cross, cross.transpose(0, 2, 1), out=c)
    return np.sqrt(np.clip(np.linalg.eigvalsh(sym)[:, -1], 0.0, 1.0))


def _random_feature_rdc(
    data: np.ndarray,
    categorical: Sequence[bool],
    cards: Sequence[int],
    k: int,
    s: float,
    rng: np.random.Generator,
    ties: str = "max",
    block: int | None = None,
) -> np.ndarray:
    """The general RDC computation behind :func:`rdc_matrix` (same arguments).

    Columns are processed in contiguous blocks (:func:`_column_blocks`; ``block``: most columns
    per block, ``None`` for the memory budget). Usually there is one block, the whole slice.
    With several, each block first gives its columns' means, whitening and within-block pairs;
    then every pair of blocks gives its cross pairs from the moments of the two blocks' columns
    together. Peak memory is then bounded by the budget (plus the ``(d, n, width)`` inputs and
    the ``(d, d)`` result) instead of growing with ``(d k)**2``, at about twice the multiply
    work of one moment matrix, and the result is the same to the bit: every value is formed by
    the same operations on the same operands (see :func:`_moments` and :func:`_pair_tops`).

    The large intermediates are written into :func:`_work` arrays with ``out=``: inside
    :func:`reuse_work_arrays` no fresh pages per call (see there).
    """
    n, d = data.shape
    kk = max([k] + [int(cards[j]) for j in range(d) if categorical[j]])
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

    blocks = _column_blocks(d, kk, min(n, _ROW_CHUNK), block)
    constant = np.ptp(data, axis=0) == 0
    mean_blocks = np.empty((d, kk))
    white = np.empty((d, kk, kk))
    out = np.eye(d)
    for lo, hi in blocks:
        c = hi - lo
        # Mean and raw second moments of this block's (n, c*kk) features, in row blocks.
        total = np.zeros(c * kk)
        gram = _moments(xt, proj, [(lo, hi)], kk, total)
        mean_blocks[lo:hi] = (total / n).reshape(c, kk)
        # Covariance blocks, cov = gram / n - outer(mean, mean), element by element: only the
        # blocks used below are formed (the diagonal ones and those above it), each written once
        # into place. raw[i, :, j, :] is the (i, j) block of raw moments.
        raw = gram.reshape(c, kk, c, kk)
        mb = mean_blocks[lo:hi]
        local = np.arange(c)

        # Whitening per column: W_j = V diag(lam^-1/2) on the directions that exist.
        diag = np.divide(raw[local, :, local, :], n)  # (c, kk, kk): the (j, j) blocks
        diag -= mb[:, :, None] * mb[:, None, :]
        diag = 0.5 * (diag + diag.transpose(0, 2, 1))
        lam, vec = np.linalg.eigh(diag)
        lam_max = np.maximum(lam.max(axis=1, keepdims=True), 0.0)
        # Features are bounded by 1, so variances below _ABS_TOL are rounding noise of E[f^2]-E[f]^2.
        keep = (lam > _RANK_TOL * lam_max) & (lam > _ABS_TOL)
        keep &= ~constant[lo:hi, None]
        inv_sqrt = np.where(keep, 1.0 / np.sqrt(np.maximum(lam, 1e-300)), 0.0)
        white[lo:hi] = vec * inv_sqrt[:, None, :]  # (c, kk, kk)

        # Whitened cross-covariances, then their spectral norms = largest canonical correlations.
        # One eigenproblem per unordered pair (i < j): the (j, i) block is the transpose of the
        # (i, j) one and has the same singular values, and the diagonal is 1 by definition. The
        # batched (k, k) eigensolves are the fixed cost of a split, which dominates on small slices.
        if c < 2:
            continue
        iu, ju = _pairs(c)
        a = _work("pairs_a", (len(iu), kk, kk))
        start = 0
        for i in range(c - 1):  # a = gram blocks (i, j > i) / n, a row of blocks at a time (iu is sorted)
            np.divide(raw[i, :, i + 1 :, :].transpose(1, 0, 2), n, out=a[start : start + c - 1 - i])
            start += c - 1 - i
        if lo:
            iu, ju = iu + lo, ju + lo
        top = _pair_tops(a, mean_blocks, white, iu, ju)
        out[iu, ju] = top
        out[ju, iu] = top

    # Pairs across blocks: the moments of two blocks' columns together, whose off-diagonal part
    # holds the cross blocks (those of the same block come again and are not used).
    for bi, (lo, hi) in enumerate(blocks[:-1]):
        ci = hi - lo
        first = None
        if n <= _ROW_CHUNK:  # one row block: this block's features serve all its pairs of blocks
            first = _work("feats_first", (n, ci * kk))
            _fill_features(first, xt, proj, [(lo, hi)], 0, kk)
        for lo2, hi2 in blocks[bi + 1 :]:
            cj = hi2 - lo2
            gram = _moments(xt, proj, [(lo, hi), (lo2, hi2)], kk, first=first)
            raw = gram.reshape(ci + cj, kk, ci + cj, kk)
            a = _work("pairs_a", (ci * cj, kk, kk))
            np.divide(raw[:ci, :, ci:, :].transpose(0, 2, 1, 3), n, out=a.reshape(ci, cj, kk, kk))
            iu = np.repeat(np.arange(lo, hi), cj)
            ju = np.tile(np.arange(lo2, hi2), ci)
            top = _pair_tops(a, mean_blocks, white, iu, ju).reshape(ci, cj)
            out[lo:hi, lo2:hi2] = top
            out[lo2:hi2, lo:hi] = top.T
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
    c11 = _cooccurrences(x)
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


_FLOAT32_EXACT_ROWS = 2**24
"""Below this many rows, counts of 0/1 entries are exact in float32 (every partial sum is an
integer under 2^24)."""


def _cooccurrences(x: np.ndarray) -> np.ndarray:
    """``x.T @ x`` (float64) of a slice with entries in ``[0, 1]``. Entries all 0 or 1: the
    product is made in float32, exact (integer counts below 2^24) and so the same to the bit,
    at half the memory traffic of float64."""
    if x.shape[0] < _FLOAT32_EXACT_ROWS and bool(((x == 0.0) | (x == 1.0)).all()):
        x32 = x.astype(np.float32)
        return (x32.T @ x32).astype(np.float64)
    return x.T @ x


def gtest_pvalues(data: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """p-values of the pairwise G-test of independence for discrete columns.

    Args:
        data: ``(n, d)`` slice with integer-valued entries ``0 .. cards[j]-1``.
        cards: per column, its number of values.

    Returns:
        ``(d, d)`` symmetric matrix of p-values (diagonal 0); a pair involving a column that takes
        a single value in the slice has p-value 1 (no evidence of dependence).
    """
    from scipy.special import chdtrc  # chi2.sf(x, dof); imported here: RDC splits do without SciPy

    g, dof = gtest_statistics(data, cards)
    with np.errstate(invalid="ignore"):
        p = np.where(dof > 0, chdtrc(np.maximum(dof, 1), np.maximum(g, 0.0)), 1.0)
    np.fill_diagonal(p, 0.0)
    return p


def gtest_dependent(data: np.ndarray, cards: Sequence[int], pvalue: float) -> np.ndarray:
    """``gtest_pvalues(data, cards) < pvalue`` (diagonal True) without a p-value per pair: the
    statistic is compared with the chi-squared critical value of each distinct dof (the
    survival function is decreasing), which is what costs in a G-test column split."""
    from scipy.special import chdtri  # chi2.isf(p, dof); imported here: RDC splits do without SciPy

    g, dof = gtest_statistics(data, cards)
    out = np.zeros(g.shape, dtype=bool)
    for k in np.unique(dof[dof > 0]):
        at = dof == k
        out[at] = np.maximum(g[at], 0.0) > chdtri(k, pvalue)
    np.fill_diagonal(out, True)
    return out


_BOUND_MARGIN = 1e-9
"""Relative margin of the bounds in :func:`rdc_groups`: a pair is decided by a bound only when it
clears the threshold by this much, far beyond the rounding of the eigenvalue it stands for."""


def rdc_groups(
    data: np.ndarray,
    categorical: Sequence[bool],
    cards: Sequence[int],
    threshold: float,
    *,
    k: int = RDC_K,
    s: float = RDC_S,
    rng: np.random.Generator,
    ties: str = "max",
    widths: str = "shared",
) -> list[np.ndarray] | None:
    """The connected components of the graph ``rdc_matrix(...) >= threshold`` (same arguments
    and random draws), found without the RDC of every pair; ``None`` where that search does not
    apply (a two-valued table under ``ties="max"``, whose exact RDC is cheap; one column or row;
    features over :data:`_FEATURE_BYTES`): the caller then thresholds :func:`rdc_matrix`.

    ``widths`` (one of :data:`WIDTHS`): ``"shared"`` gives every column ``max(k, largest
    categorical cardinality)`` random features, as :func:`rdc_matrix` does; ``"own"`` gives a
    categorical column ``max(k, values it takes in the slice)`` of them and any other column
    ``k`` (:func:`_own_width_groups`), so that one column of many values (a target of hundreds
    of classes) does not widen every other column's features to its own width.

    Components are grown breadth-first from their smallest column: only the pairs of a newly
    joined column with the columns not yet placed are measured, so a slice whose columns hang
    together (the usual outcome of a column split) costs about ``d`` pairs instead of
    ``d (d - 1) / 2``. Each measured pair is the same canonical correlation as in
    :func:`rdc_matrix`, and most of them are decided without an eigensolve: the largest
    singular value of the whitened cross-covariance lies between its largest column norm and
    its Frobenius norm (:func:`_pair_decisions`).

    Returns:
        Arrays of column indices (ascending), ordered by their smallest member, as
        :func:`mpifc.circuit.splitting.dependency_components` orders them.
    """
    n, d = data.shape
    if d < 2 or n < 2:
        return None
    data = np.asarray(data, dtype=np.float64)
    if ties not in TIES:
        raise ValueError(f"rdc_groups: ties must be one of {TIES}, got {ties!r}")
    if widths not in WIDTHS:
        raise ValueError(f"rdc_groups: widths must be one of {WIDTHS}, got {widths!r}")
    if widths == "own":
        return _own_width_groups(data, list(categorical), threshold, k, s, rng, ties)
    if ties == "max" and _all_two_valued(data):
        return None
    categorical = list(categorical)
    cards = list(cards)
    kk = max([k] + [int(cards[j]) for j in range(d) if categorical[j]])
    if d * n * kk * 8 > _FEATURE_BYTES:
        return None
    feats, mean_blocks, white = _column_features(data, categorical, cards, k, s, rng, ties, kk)
    return _grow_components(d, lambda frontier, rest: _pair_decisions(feats, mean_blocks, white, frontier, rest, n,
                                                                       threshold))


def _column_features(data: np.ndarray, categorical: Sequence[bool], cards: Sequence[int], k: int, s: float,
                     rng: np.random.Generator, ties: str, kk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column, its random features ``(d, n, kk)``, their means ``(d, kk)`` and whitening
    ``(d, kk, kk)``, from the same inputs, draws and formulas as :func:`_random_feature_rdc`."""
    n, d = data.shape
    if any(categorical):
        xt, widths = _projection_inputs(data, categorical, cards, ties)  # (d, n, width)
        u = None
    else:
        # Every input is (u, 1): the copula values alone, (d, n), no (d, n, 2) layout.
        xt, widths, u = None, [2] * d, ecdf(data, ties).T
    width = max(widths)
    proj = np.zeros((d, width, kk))
    gauss = rng.standard_normal((d, width, kk))
    cont = [j for j in range(d) if not categorical[j]]
    if cont:
        proj[cont, :2] = gauss[cont, :2] * (s / 2)
    for j in range(d):
        if categorical[j]:
            proj[j, : widths[j]] = gauss[j, : widths[j]] * (s / widths[j])
    feats = _work("lin", (d, n, kk))
    sums = np.empty((d, kk))
    diag = _work("diag", (d, kk, kk))
    # Columns in groups of about _FUSED_BYTES of features, each group's projection, sine, sums
    # and products formed while its features are still in cache; every step is per column, so
    # the values do not depend on the grouping.
    step = max(1, _FUSED_BYTES // (8 * kk * max(n, 1)))
    for c0 in range(0, d, step):
        c1 = min(d, c0 + step)
        if u is None:
            f = np.matmul(xt[c0:c1], proj[c0:c1], out=feats[c0:c1])
        else:
            # u * p0 + p1: the two-term product the matmul of (u, 1) forms; the unit term's
            # product is exact, and OpenBLAS's K = 2 kernel rounds the sum as numpy does (equal
            # bit for bit; the pinned model fingerprints of launch/bench/circuit_learnspn.py
            # show it), without the (d, n, 2) inputs
            f = np.multiply(u[c0:c1, :, None], proj[c0:c1, :1], out=feats[c0:c1])
            f += proj[c0:c1, 1:2]
        np.sin(f, out=f)
        np.add.reduce(f, axis=1, out=sums[c0:c1])
        np.matmul(f.transpose(0, 2, 1), f, out=diag[c0:c1])
    mean_blocks, white = _whitening(sums, diag, n, np.ptp(data, axis=0) == 0)
    return feats, mean_blocks, white


def _whitening(sums: np.ndarray, diag: np.ndarray, n: int, constant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column, from its features' sums ``(d, kk)`` and raw second moments ``(d, kk, kk)``
    (the latter overwritten), their means and whitening ``(d, kk, kk)``, numerically absent
    directions and ``constant`` columns given zero weight."""
    mean_blocks = sums / n  # (d, kk)
    diag /= n
    diag -= mean_blocks[:, :, None] * mean_blocks[:, None, :]
    diag = 0.5 * (diag + diag.transpose(0, 2, 1))
    lam, vec = np.linalg.eigh(diag)
    lam_max = np.maximum(lam.max(axis=1, keepdims=True), 0.0)
    keep = (lam > _RANK_TOL * lam_max) & (lam > _ABS_TOL)
    keep &= ~constant[:, None]
    white = vec * np.where(keep, 1.0 / np.sqrt(np.maximum(lam, 1e-300)), 0.0)[:, None, :]
    return mean_blocks, white


WIDTHS = ("shared", "own")
"""How :func:`rdc_groups` sizes the columns' random features."""


def _own_width_groups(data: np.ndarray, categorical: list[bool], threshold: float, k: int, s: float,
                      rng: np.random.Generator, ties: str) -> list[np.ndarray]:
    """:func:`rdc_groups` with ``widths="own"``: a categorical column's inputs are the copula
    values of its one-hot encoding over the values it takes in the slice (plus the unit term),
    projected to ``max(k, those values)`` features; any other column's are ``(u, 1)``, projected
    to ``k`` (scales and formulas as in :func:`_column_features`; one draw per column, in column
    order). Columns of one width are whitened and compared in batches (:func:`_pair_decisions`)."""
    n, d = data.shape
    cont = [j for j in range(d) if not categorical[j]]
    u = ecdf(data[:, cont], ties) if cont else None
    ones = np.ones((n, 1))
    kks, proj_feats = [], []
    for j in range(d):
        if categorical[j]:
            _, codes = np.unique(data[:, j], return_inverse=True)
            onehot = np.zeros((n, int(codes.max()) + 1))
            onehot[np.arange(n), codes.reshape(-1)] = 1.0
            x = np.hstack([ecdf(onehot), ones])
            kk = max(k, x.shape[1] - 1)
        else:
            x = np.hstack([u[:, cont.index(j) : cont.index(j) + 1], ones])
            kk = k
        proj = rng.standard_normal((x.shape[1], kk)) * (s / x.shape[1])
        kks.append(kk)
        proj_feats.append(np.sin(x @ proj))
    constant = np.ptp(data, axis=0) == 0
    gid = np.empty(d, dtype=np.int64)
    loc = np.empty(d, dtype=np.int64)
    blocks = []
    for g, kk in enumerate(sorted(set(kks))):
        cols = [j for j in range(d) if kks[j] == kk]
        gid[cols], loc[cols] = g, np.arange(len(cols))
        feats = np.stack([proj_feats[j] for j in cols])  # (d_g, n, kk)
        sums = np.add.reduce(feats, axis=1)
        diag = np.matmul(feats.transpose(0, 2, 1), feats)
        blocks.append((feats, *_whitening(sums, diag, n, constant[cols])))

    def decide(frontier: np.ndarray, rest: np.ndarray) -> np.ndarray:
        out = np.zeros((len(frontier), len(rest)), dtype=bool)
        for gl in np.unique(gid[frontier]):
            at_l = gid[frontier] == gl
            for gr in np.unique(gid[rest]):
                at_r = gid[rest] == gr
                out[np.ix_(at_l, at_r)] = _pair_decisions(*blocks[gl], loc[frontier[at_l]], loc[rest[at_r]], n,
                                                          threshold, right=blocks[gr])
        return out

    return _grow_components(d, decide)


def _grow_components(d: int, decide) -> list[np.ndarray]:
    """Connected components of ``d`` columns grown breadth-first from their smallest column;
    ``decide(frontier, rest)`` says which pairs are dependent ``(len(frontier), len(rest))``."""
    placed = np.zeros(d, dtype=bool)
    groups = []
    for seed in range(d):
        if placed[seed]:
            continue
        placed[seed] = True
        members = [seed]
        frontier = np.array([seed])
        while frontier.size and not placed.all():
            rest = np.flatnonzero(~placed)
            joined = rest[decide(frontier, rest).any(axis=0)]
            placed[joined] = True
            members.extend(joined.tolist())
            frontier = joined
        groups.append(np.array(sorted(members), dtype=np.int64))
    return groups


_FUSED_BYTES = 2 << 20
"""Feature bytes of one group of columns in :func:`_column_features` (a share of a cache)."""

_GATHER_BYTES = 32 << 20
"""Most feature bytes of one group of columns gathered at once in :func:`_pair_decisions`."""

_PAIR_CHUNK = 4096
"""Most pairs whose ``(kk, kk)`` blocks :func:`_pair_decisions` forms at once."""


def _runs(cols: np.ndarray, size: int) -> list[np.ndarray]:
    """``cols`` (ascending) cut into consecutive pieces of at most ``size`` entries."""
    return [cols[i : i + size] for i in range(0, len(cols), size)]


def _gather(feats: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``feats[cols]``, a view when ``cols`` is a range."""
    if cols[-1] - cols[0] + 1 == len(cols):
        return feats[cols[0] : cols[-1] + 1]
    return feats[cols]


def _pair_decisions(feats: np.ndarray, mean_blocks: np.ndarray, white: np.ndarray, left: np.ndarray,
                    right_cols: np.ndarray, n: int, threshold: float,
                    right: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``(len(left), len(right))`` booleans: whether the RDC of columns ``left[a]`` and
    ``right[b]`` is at least ``threshold``.

    The whitened cross-covariance ``M`` of a pair is formed as in :func:`_pair_tops`; its
    largest singular value (the RDC) is at most its Frobenius norm and at least its largest
    row or column norm, so a pair whose Frobenius norm falls below the threshold, or one of
    whose rows or columns reaches it, is decided (each by :data:`_BOUND_MARGIN`, so rounding
    cannot cross); the rest take the eigensolve of :func:`_pair_tops`. Columns are taken in
    groups (:data:`_GATHER_BYTES`, :data:`_PAIR_CHUNK`), so memory stays bounded.

    ``right``: the features, means and whitening ``right_cols`` index (default: the left's), of
    their own width ``kr``; the blocks are then ``(kk, kr)`` and the eigensolve takes the
    smaller side."""
    kk = feats.shape[2]
    rfeats, rmeans, rwhite = right if right is not None else (feats, mean_blocks, white)
    kr = rfeats.shape[2]
    right = right_cols
    t2 = float(threshold) ** 2
    per_col = max(1, _GATHER_BYTES // (8 * max(kk, kr) * max(n, 1)))
    out = np.empty((len(left), len(right)), dtype=bool)
    pos_l = 0
    for lc in _runs(left, per_col):
        lf = _gather(feats, lc).transpose(0, 2, 1)[:, None]  # (a, 1, kk, n)
        wl = white[lc].transpose(0, 2, 1)[:, None]  # (a, 1, kk, kk)
        ml = mean_blocks[lc][:, None, :, None]
        pos_r = 0
        for rc in _runs(right, max(1, min(per_col, _PAIR_CHUNK // len(lc)))):
            cov = np.matmul(lf, _gather(rfeats, rc)[None])  # (a, b, kk, kr) raw moments
            cov /= n
            cov -= ml * rmeans[rc][None, :, None, :]
            m = np.matmul(np.matmul(wl, cov), rwhite[rc][None]).reshape(-1, kk, kr)
            sq = m * m
            fro = sq.sum(axis=(1, 2))
            line = np.maximum(sq.sum(axis=1).max(axis=1), sq.sum(axis=2).max(axis=1))
            dep = line >= t2 * (1.0 + _BOUND_MARGIN)
            open_ = ~dep & (fro >= t2 * (1.0 - _BOUND_MARGIN))
            if open_.any():
                mo = m[open_]
                sym = np.matmul(mo, mo.transpose(0, 2, 1)) if kk <= kr else np.matmul(mo.transpose(0, 2, 1), mo)
                dep[open_] = np.sqrt(np.clip(np.linalg.eigvalsh(sym)[:, -1], 0.0, 1.0)) >= threshold
            out[pos_l : pos_l + len(lc), pos_r : pos_r + len(rc)] = dep.reshape(len(lc), len(rc))
            pos_r += len(rc)
        pos_l += len(lc)
    return out
