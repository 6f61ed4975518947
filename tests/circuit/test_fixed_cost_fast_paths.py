"""LearnSPN's per-run and per-split fixed costs, trimmed without changing a single bit.

* ``learnspn._real_breaks`` (one batched percentile for all real columns) must give exactly the
  edges of ``learnspn._global_breaks`` (numpy's ``histogram_bin_edges(bins="auto")`` per column).
* ``rdc.rdc_matrix`` writes its large intermediates into reused work arrays inside
  ``rdc.reuse_work_arrays``; its result must equal, bit for bit, the plain formula with fresh
  temporaries (the reference below), across calls of changing shapes and in the row-chunked path.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from mpifc.circuit import rdc
from mpifc.circuit.learnspn import _global_breaks, _real_breaks, learn_spn


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


def _random_table(rng: np.random.Generator, n: int, c: int) -> np.ndarray:
    x = rng.normal(size=(n, c)) * rng.choice([1e-3, 1.0, 1e3]) + rng.choice([0.0, 5.0, -1e4])
    for j in range(c):
        r = rng.random()
        if r < 0.2:
            x[:, j] = np.round(x[:, j])  # ties
        elif r < 0.3:
            x[:, j] = rng.integers(0, 3, n)  # three values
        elif r < 0.35:
            x[:, j] = 7.0  # constant
        elif r < 0.45:
            x[:, j] = np.exp(rng.normal(size=n) * 3)  # heavy tail
        elif r < 0.5:
            x[:, j] = rng.choice([0.0, 1.0, 2.5], n, p=[0.9, 0.05, 0.05])  # zero IQR
    return x


def test_batched_breaks_equal_numpy_auto_edges_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(150):
        n, c = int(rng.integers(2, 2500)), int(rng.integers(1, 10))
        x = _random_table(rng, n, c)
        fast = _real_breaks(x, list(range(c)))
        for j in range(c):
            constant = x[:, j].min() == x[:, j].max()
            assert (j in fast) != constant  # constant columns are left to the generic path
            if j in fast:
                assert _bits(fast[j]) == _bits(_global_breaks(x[:, j], "real", 0))
                checked += 1
    assert checked > 500
    assert _real_breaks(np.zeros((3, 2)), []) == {}


def _reference_rdc(data: np.ndarray, categorical: list[bool], cards: list[int], k: int,
                   rng: np.random.Generator, ties: str, chunk: int) -> np.ndarray:
    """The general RDC with fresh temporaries (the formula rdc_matrix implements)."""
    n, d = data.shape
    s = rdc.RDC_S
    inputs = rdc._copula_inputs(data, categorical, cards, ties)
    kk = max([k] + [int(cards[j]) for j in range(d) if categorical[j]])
    width = max(x.shape[1] for x in inputs)
    xin = np.zeros((n, d, width))
    proj = np.zeros((d, width, kk))
    gauss = rng.standard_normal((d, width, kk))
    for j, x in enumerate(inputs):
        xin[:, j, : x.shape[1]] = x
        proj[j, : x.shape[1]] = gauss[j, : x.shape[1]] * (s / x.shape[1])
    xin = np.ascontiguousarray(xin.transpose(1, 0, 2))
    total = np.zeros(d * kk)
    gram = np.zeros((d * kk, d * kk))
    for lo in range(0, n, chunk):
        feats = np.sin(np.matmul(xin[:, lo : lo + chunk], proj)).transpose(1, 0, 2).reshape(-1, d * kk)
        total += feats.sum(0)
        gram += feats.T @ feats
    mean = total / n
    blocks = (gram / n - np.outer(mean, mean)).reshape(d, kk, d, kk).transpose(0, 2, 1, 3)
    diag = blocks[np.arange(d), np.arange(d)]
    lam, vec = np.linalg.eigh(0.5 * (diag + diag.transpose(0, 2, 1)))
    lam_max = np.maximum(lam.max(axis=1, keepdims=True), 0.0)
    keep = (lam > rdc._RANK_TOL * lam_max) & (lam > rdc._ABS_TOL) & ~(np.ptp(data, axis=0) == 0)[:, None]
    white = vec * np.where(keep, 1.0 / np.sqrt(np.maximum(lam, 1e-300)), 0.0)[:, None, :]
    iu, ju = np.triu_indices(d, 1)
    cross = np.matmul(np.matmul(white[iu].transpose(0, 2, 1), blocks[iu, ju]), white[ju])
    top = np.sqrt(np.clip(np.linalg.eigvalsh(np.matmul(cross, cross.transpose(0, 2, 1)))[:, -1], 0.0, 1.0))
    out = np.eye(d)
    out[iu, ju] = top
    out[ju, iu] = top
    return out


@pytest.mark.parametrize("chunk", [None, 37])
def test_rdc_with_reused_work_arrays_equals_fresh_formula(monkeypatch: pytest.MonkeyPatch,
                                                          chunk: int | None) -> None:
    if chunk is not None:  # several row blocks (the accumulation path of large slices)
        monkeypatch.setattr(rdc, "_ROW_CHUNK", chunk)
    rng = np.random.default_rng(3)
    with rdc.reuse_work_arrays():  # shapes change from call to call: buffers grow and are re-viewed
        for t in range(40):
            n, d = int(rng.integers(2, 300)), int(rng.integers(2, 14))
            x = _random_table(rng, n, d)
            categorical = [bool(rng.random() < 0.2) for _ in range(d)] if t % 3 == 0 else [False] * d
            cards = [int(rng.integers(2, 6)) for _ in range(d)]
            for j in range(d):
                if categorical[j]:
                    x[:, j] = rng.integers(0, cards[j], n)
            k, ties, seed = int(rng.choice([5, 10, 20])), ("max", "ordinal")[t % 2], int(rng.integers(1 << 30))
            got = rdc.rdc_matrix(x, categorical, cards, k=k, rng=np.random.default_rng(seed), ties=ties)
            if ties == "max" and rdc._all_two_valued(x):
                continue  # exact binary shortcut, not the random-feature path
            want = _reference_rdc(x, categorical, cards, k, np.random.default_rng(seed), ties,
                                  chunk or rdc._ROW_CHUNK)
            assert _bits(got) == _bits(want), (t, n, d, k, ties)
    # Outside the block every call gets fresh arrays: same result.
    x = _random_table(rng, 50, 6)
    a = rdc.rdc_matrix(x, k=10, rng=np.random.default_rng(1), ties="ordinal")
    b = _reference_rdc(x, [False] * 6, [2] * 6, 10, np.random.default_rng(1), "ordinal", chunk or rdc._ROW_CHUNK)
    assert _bits(a) == _bits(b)


def test_work_arrays_are_scoped_per_block_and_thread() -> None:
    assert getattr(rdc._WORK, "arrays", None) is None
    seen: list[object] = []
    with rdc.reuse_work_arrays():
        outer = rdc._WORK.arrays
        with rdc.reuse_work_arrays():  # re-entrant: the same store
            assert rdc._WORK.arrays is outer
        a = rdc._work("t", (4, 5))
        assert rdc._work("t", (2, 3)).base is a.base  # smaller request: a view of the same buffer
        t = threading.Thread(target=lambda: seen.append(getattr(rdc._WORK, "arrays", None)))
        t.start()
        t.join()
    assert seen == [None]  # other threads allocate afresh
    assert rdc._WORK.arrays is None  # released when the block ends
    learn_spn(np.random.default_rng(0).normal(size=(80, 4)), ["real"] * 4, min_instances_slice=20)
    assert rdc._WORK.arrays is None  # learn_spn scopes its reuse to the run
