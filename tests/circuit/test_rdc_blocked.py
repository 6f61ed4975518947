"""The RDC in column blocks (bounded memory on wide slices) against the computation in one piece.

``rdc._random_feature_rdc`` processes a wide slice in blocks of columns: per block its columns'
moments, whitening and within-block pairs, then the cross pairs of every two blocks from the
moments of their columns together. Its result must equal, bit for bit, the computation over all
columns at once (``_unblocked_rdc`` below: the formula as it stood before blocks, with fresh
temporaries), for every copula convention, feature count, block size and row blocking; so the
column splits of LearnSPN, and its models, do not depend on the blocking.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit import rdc
from mpifc.circuit.learnspn import learn_spn
from mpifc.circuit.splitting import split_columns_rdc

from .test_fixed_cost_fast_paths import _random_table


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


def _unblocked_rdc(data: np.ndarray, categorical: list[bool], cards: list[int], k: int,
                   rng: np.random.Generator, ties: str) -> np.ndarray:
    """The general RDC over all columns at once: one ``(d k, d k)`` moment matrix and one stack
    of all ``d (d - 1) / 2`` pair blocks (the operations of the implementation before blocks)."""
    n, d = data.shape
    s = rdc.RDC_S
    kk = max([k] + [int(cards[j]) for j in range(d) if categorical[j]])
    m = d * kk
    xt, widths = rdc._projection_inputs(data, categorical, cards, ties)
    width = xt.shape[2]
    proj = np.zeros((d, width, kk))
    gauss = rng.standard_normal((d, width, kk))
    cont = [j for j in range(d) if not categorical[j]]
    if cont:
        proj[cont, :2] = gauss[cont, :2] * (s / 2)
    for j in range(d):
        if categorical[j]:
            proj[j, : widths[j]] = gauss[j, : widths[j]] * (s / widths[j])
    total = np.zeros(m)
    gram = np.empty((m, m))
    for lo in range(0, n, rdc._ROW_CHUNK):
        rows = min(n, lo + rdc._ROW_CHUNK) - lo
        f3 = np.sin(np.matmul(xt[:, lo : lo + rows], proj))
        feats = np.empty((rows, m))
        np.copyto(feats.reshape(rows, d, kk), f3.transpose(1, 0, 2))
        total += feats.sum(0)
        if lo == 0:
            np.matmul(feats.T, feats, out=gram)
            gram += 0.0
        else:
            gram += np.matmul(feats.T, feats)
    mean_blocks = (total / n).reshape(d, kk)
    raw = gram.reshape(d, kk, d, kk)
    columns = np.arange(d)
    diag = np.divide(raw[columns, :, columns, :], n)
    diag -= mean_blocks[:, :, None] * mean_blocks[:, None, :]
    diag = 0.5 * (diag + diag.transpose(0, 2, 1))
    lam, vec = np.linalg.eigh(diag)
    lam_max = np.maximum(lam.max(axis=1, keepdims=True), 0.0)
    keep = (lam > rdc._RANK_TOL * lam_max) & (lam > rdc._ABS_TOL) & ~(np.ptp(data, axis=0) == 0)[:, None]
    white = vec * np.where(keep, 1.0 / np.sqrt(np.maximum(lam, 1e-300)), 0.0)[:, None, :]
    iu, ju = np.triu_indices(d, 1)
    a = np.empty((len(iu), kk, kk))
    start = 0
    for i in range(d - 1):
        np.divide(raw[i, :, i + 1 :, :].transpose(1, 0, 2), n, out=a[start : start + d - 1 - i])
        start += d - 1 - i
    a -= mean_blocks[iu][:, :, None] * mean_blocks[ju][:, None, :]
    b = white[iu]
    left = np.matmul(b.transpose(0, 2, 1), a)
    cross = np.matmul(left, white[ju])
    sym = np.matmul(cross, cross.transpose(0, 2, 1))
    top = np.sqrt(np.clip(np.linalg.eigvalsh(sym)[:, -1], 0.0, 1.0))
    out = np.eye(d)
    out[iu, ju] = top
    out[ju, iu] = top
    return out


def _case(rng: np.random.Generator, t: int, n: int, d: int) -> tuple[np.ndarray, list[bool], list[int]]:
    """A random slice: reals with ties, few-valued, constant and heavy-tailed columns, binary
    columns, and (every third case) some one-hot categorical ones."""
    x = _random_table(rng, n, d)
    for j in range(d):
        if rng.random() < 0.3:
            x[:, j] = (rng.random(n) < rng.uniform(0.02, 0.5)).astype(float)
    categorical = [bool(rng.random() < 0.25) for _ in range(d)] if t % 3 == 0 else [False] * d
    cards = [int(rng.integers(2, 6)) for _ in range(d)]
    for j in range(d):
        if categorical[j]:
            x[:, j] = rng.integers(0, cards[j], n)
    return x, categorical, cards


def test_syrk_entries_do_not_depend_on_the_other_columns() -> None:
    """What the blocks rest on: an entry of ``A.T @ A`` (BLAS syrk) is the same bits whichever
    other columns ``A`` has, for row counts on either side of BLAS's inner blocking."""
    rng = np.random.default_rng(0)
    for n in (2, 3, 37, 300, 700, 2500):
        f = np.sin(rng.normal(size=(n, 90)) * 3)
        whole = f.T @ f
        for cols in ([0, 1], [5, 6, 7], list(range(3, 40)), [1, 2, 60, 61, 62], list(range(30, 90)),
                     list(range(0, 90, 7))):
            sub = np.ascontiguousarray(f[:, cols])
            assert _bits(sub.T @ sub) == _bits(whole[np.ix_(cols, cols)]), (n, cols)


@pytest.mark.parametrize("ties", rdc.TIES)
@pytest.mark.parametrize("k", [1, 2, 5, 10, 20])
def test_blocked_rdc_equals_unblocked_bit_for_bit(ties: str, k: int) -> None:
    rng = np.random.default_rng(100 * k + len(ties))
    for t in range(6):
        n, d = int(rng.integers(2, 250)), int(rng.integers(2, 12))
        if t == 0:
            d = 2  # a single pair: one block whatever the block size
        x, categorical, cards = _case(rng, t, n, d)
        seed = int(rng.integers(1 << 30))
        want = _unblocked_rdc(x, categorical, cards, k, np.random.default_rng(seed), ties)
        # Every block size: 1 and 2 (blocks of two or three), sizes that do not divide d (uneven
        # blocks and pair counts per pair of blocks), and d and more (one block).
        for block in range(1, d + 2):
            got = rdc._random_feature_rdc(x, categorical, cards, k, rdc.RDC_S, np.random.default_rng(seed), ties,
                                          block=block)
            assert _bits(got) == _bits(want), (t, n, d, block)
        # The public function (one block at these sizes) and the reused work arrays agree too.
        with rdc.reuse_work_arrays():
            got = rdc._random_feature_rdc(x, categorical, cards, k, rdc.RDC_S, np.random.default_rng(seed), ties,
                                          block=2)
            again = rdc._random_feature_rdc(x, categorical, cards, k, rdc.RDC_S, np.random.default_rng(seed), ties,
                                            block=3)
        assert _bits(got) == _bits(want) and _bits(again) == _bits(want)


@pytest.mark.parametrize("ties", rdc.TIES)
def test_blocked_rdc_equals_unblocked_in_row_blocks(monkeypatch: pytest.MonkeyPatch, ties: str) -> None:
    """Slices longer than the row block: the moments accumulate block by block, in both paths."""
    monkeypatch.setattr(rdc, "_ROW_CHUNK", 41)
    rng = np.random.default_rng(7)
    for t in range(5):
        n, d = int(rng.integers(42, 200)), int(rng.integers(3, 9))
        x, categorical, cards = _case(rng, t, n, d)
        k, seed = int(rng.choice([2, 10, 20])), int(rng.integers(1 << 30))
        want = _unblocked_rdc(x, categorical, cards, k, np.random.default_rng(seed), ties)
        for block in (2, 3, d):
            got = rdc._random_feature_rdc(x, categorical, cards, k, rdc.RDC_S, np.random.default_rng(seed), ties,
                                          block=block)
            assert _bits(got) == _bits(want), (t, n, d, block)


def test_column_blocks_cover_the_columns_in_even_blocks_of_two_or_more() -> None:
    for d in range(1, 40):
        for block in (None, 1, 2, 3, 5, 7, d - 1, d, d + 3):
            blocks = rdc._column_blocks(d, 10, 100, block)
            assert blocks[0][0] == 0 and blocks[-1][1] == d
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            sizes = [hi - lo for lo, hi in blocks]
            assert max(sizes) - min(sizes) <= 1
            assert min(sizes) >= min(2, d)
            if block is not None:
                assert max(sizes) <= max(block, 3)
    # Under the budget a slice is one block; past it, blocks whose pairs fit the budget.
    assert rdc._column_blocks(50, 20, 2500) == [(0, 50)]
    for d, kk, rows in ((1600, 20, 2500), (1600, 10, 2500), (301, 10, 600), (900, 20, 8192), (5000, 1, 100)):
        blocks = rdc._column_blocks(d, kk, rows)
        widest = max(hi - lo for lo, hi in blocks)
        assert len(blocks) > 1
        assert (2 * widest * kk) ** 2 * 8 <= rdc._GRAM_BYTES
        assert rows * 2 * widest * kk * 8 <= rdc._FEATURE_BYTES


def test_wide_rdc_keeps_its_work_arrays_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a small budget the public function takes the blocked path by itself: same result,
    and no work array grows with the square of the column count."""
    rng = np.random.default_rng(3)
    n, d, k = 120, 40, 10
    x = (rng.random((n, d)) < rng.uniform(0.05, 0.5, d)).astype(float)
    x[:, 1] = x[:, 0]  # a dependent pair
    want = rdc.rdc_matrix(x, k=k, rng=np.random.default_rng(5), ties="ordinal")
    groups = split_columns_rdc(x, [False] * d, [2] * d, 0.3, np.random.default_rng(5), k=k, ties="ordinal")
    monkeypatch.setattr(rdc, "_GRAM_BYTES", 8 * (4 * k) ** 2)  # two columns' features per block pair
    assert len(rdc._column_blocks(d, k, n)) == d // 2
    with rdc.reuse_work_arrays():
        got = rdc.rdc_matrix(x, k=k, rng=np.random.default_rng(5), ties="ordinal")
        largest = max(a.size for a in rdc._WORK.arrays.values())
    assert _bits(got) == _bits(want)
    assert largest * 8 <= max(rdc._GRAM_BYTES, 8 * n * d * 2)  # the (d, n, 2) inputs are the largest
    assert largest < (d * k) ** 2 // 4
    assert [list(g) for g in split_columns_rdc(x, [False] * d, [2] * d, 0.3, np.random.default_rng(5), k=k,
                                               ties="ordinal")] == [list(g) for g in groups]


def test_learnspn_models_do_not_depend_on_the_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    n, d = 400, 12
    z = rng.integers(0, 2, n)
    x = (rng.random((n, d)) < np.where(z[:, None] == 1, 0.7, 0.2)).astype(float)
    x[:, :4] = np.round(rng.normal(size=(n, 4)) + z[:, None], 1)
    meta = ["real"] * 4 + ["discrete"] * (d - 4)

    def fit() -> list:
        spn = learn_spn(x, meta, threshold=0.2, min_instances_slice=40, rdc_ties="ordinal", rdc_k=20, seed=3)
        return [float(v) for v in spn.log_likelihood(x[:50])] + [spn.circuit.n_nodes]

    want = fit()
    monkeypatch.setattr(rdc, "_GRAM_BYTES", 8 * 80**2)  # blocks of two columns at k = 20
    assert len(rdc._column_blocks(d, 20, n)) == d // 2
    assert fit() == want
