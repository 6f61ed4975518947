"""RecvBufferPool: big buffers are reused only once no array refers to them."""
from __future__ import annotations

import numpy as np

from mpifc.runtime.bufpool import RecvBufferPool


def test_buffer_is_reused_only_when_free():
    pool = RecvBufferPool(min_bytes=1000, max_buffers=4)
    a = pool.empty((100, 10), np.float64)
    b = pool.empty((100, 10), np.float64)
    assert a.ctypes.data != b.ctypes.data and pool.reused == 0
    a[:] = 1.0
    a_addr = a.ctypes.data
    del a
    c = pool.empty((50, 20), np.float64)
    assert pool.reused == 1 and c.ctypes.data == a_addr
    assert c.flags.writeable and c.flags.c_contiguous and c.shape == (50, 20)
    view = c[::2]  # a view keeps the buffer in use
    del c
    d = pool.empty((1000,), np.float64)
    assert d.ctypes.data not in (a_addr, b.ctypes.data)
    b[:] = 2.0
    assert np.all(view.base is not None) and float(b.sum()) == 2000.0  # nobody else wrote into b


def test_small_requests_and_size_fit():
    pool = RecvBufferPool(min_bytes=1 << 16)
    small = pool.empty((10,), np.int32)
    assert small.dtype == np.int32 and pool._buffers == []
    big = pool.empty((1 << 20,), np.uint8)
    addr = big.ctypes.data
    del big
    # Much smaller than the free buffer (< half): not pinned to it.
    half = pool.empty(((1 << 20) // 4,), np.uint8)
    assert half.ctypes.data != addr
    assert len(pool._buffers) == 2


def test_pool_does_not_grow_past_max_buffers():
    pool = RecvBufferPool(min_bytes=1, max_buffers=2)
    held = [pool.empty((100,), np.uint8) for _ in range(5)]
    assert len(pool._buffers) <= 2
    assert len({h.ctypes.data for h in held}) == 5


def test_large_buffers_start_on_a_huge_page_boundary_and_outlive_the_pool():
    import gc

    from mpifc.runtime import bufpool

    pool = RecvBufferPool(min_bytes=1 << 16, max_buffers=1, huge_min_bytes=1 << 20)
    a = pool.empty((3, 1 << 17), np.float32)  # 1.5 MiB: a huge-page buffer where the platform has them
    b = pool.empty((1 << 16,), np.uint8)      # 64 KiB: below huge_min_bytes, a bytearray
    if bufpool._CAN_MAP_HUGE:
        assert a.ctypes.data % (2 << 20) == 0
    assert isinstance(b.base, bytearray)
    assert a.flags.writeable and a.flags.c_contiguous and a.shape == (3, 1 << 17)
    a[:] = np.arange(3, dtype=np.float32)[:, None]
    b[:] = 5
    # max_buffers=1: the pool stopped tracking a's buffer when b's came; then the pool goes away.
    del pool
    gc.collect()
    assert float(a.sum()) == float((0 + 1 + 2) * (1 << 17)) and int(b.sum()) == 5 * (1 << 16)
    # The same sizes again: a buffer is reused once its arrays are gone, at the same place.
    pool = RecvBufferPool(min_bytes=1 << 16, huge_min_bytes=1 << 20)
    c = pool.empty((1 << 20,), np.uint16)
    addr = c.ctypes.data
    view = c[1:]  # a view keeps the buffer in use
    del c
    e = pool.empty((1 << 20,), np.uint16)
    assert e.ctypes.data != addr and pool.reused == 0
    del view, e
    d = pool.empty((1 << 19,), np.float32)  # 2 MiB: fits either free 2 MiB buffer
    assert pool.reused == 1 and d.dtype == np.float32
    if bufpool._CAN_MAP_HUGE:
        assert d.ctypes.data % (2 << 20) == 0
