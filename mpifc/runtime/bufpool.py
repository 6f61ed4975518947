"""Recycled receive buffers for large messages.

A freshly allocated array costs page faults (the kernel zeroes every page) the first time it is
written: for a 64 MB receive that is several times the copy itself. The pool keeps a few large
buffers and hands one out again only when no array refers to it any more (its reference count
says so), so callers still own the arrays they get and never see them change.

Placement. On Linux, buffers of at least ``huge_min_bytes`` are private anonymous mappings that
start on a 2 MiB boundary and are marked ``MADV_HUGEPAGE``, so that (where transparent huge pages
are enabled, even only on request) they sit on 2 MiB pages. Copying a message through MPI's
shared memory touches every page of the buffer, and on a virtual machine every TLB miss is a
two-level page walk: measured with raw mpi4py ping-pong on the project's 2-core KVM guest
(MPICH 5, no single-copy path), a receive-and-send buffer on huge pages moved 1 and 2 MiB
messages about 1.3x faster than an ``np.empty`` one (numpy itself asks for huge pages only from
4 MiB up, and a ``bytearray`` never: at 8 MiB a ``bytearray`` buffer was 0.75x as fast as
``np.empty``). The gain is in reading the array after the receive (here: sending it on); the
receive into it was not measurably faster. Where a buffer starts within its page made no
measurable difference. A 1 MiB buffer then occupies one 2 MiB page; with ``max_buffers``
buffers that bounds the extra memory.
"""
from __future__ import annotations

import math
import mmap
import sys

import numpy as np

_HUGE = 2 << 20  # x86-64 transparent huge page size
# Private anonymous mappings (Python's default anonymous mmap is shared memory, which the kernel
# does not back with transparent huge pages) and the advice to use huge pages (Linux only).
_CAN_MAP_HUGE = hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def huge_page_buffer(nbytes: int) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping with ``nbytes`` usable from a 2 MiB boundary on, advised to use
    transparent huge pages; returns ``(mapping, offset of that boundary)``.

    The mapping is one huge page longer than needed so that an aligned start exists; the unused
    head and tail are never touched and cost no memory.
    """
    span = -(-max(nbytes, 1) // _HUGE) * _HUGE
    m = mmap.mmap(-1, span + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe = np.frombuffer(m, np.uint8, count=1)
    start = -probe.ctypes.data % _HUGE
    del probe
    try:
        m.madvise(mmap.MADV_HUGEPAGE, start, span)
    except OSError:  # a kernel without THP: still a correct (page-aligned) buffer
        pass
    return m, start


class RecvBufferPool:
    """Arrays for large receives, backed by reusable buffers (huge-page mappings where possible).

    Args:
        min_bytes: smaller arrays are plain ``np.empty`` (page faults matter only for big ones).
        max_buffers: buffers kept for reuse (memory bound: about ``max_buffers`` x the largest
            message size received recently, rounded up to 2 MiB for huge-page buffers).
        huge_min_bytes: buffers from this size up are huge-page mappings (see the module
            docstring); smaller ones are ``bytearray``.
    """

    def __init__(self, min_bytes: int = 1 << 20, max_buffers: int = 4, huge_min_bytes: int = 1 << 20) -> None:
        self.min_bytes = int(min_bytes)
        self.max_buffers = int(max_buffers)
        self.huge_min_bytes = int(huge_min_bytes)
        # [buffer object, offset of the array's start in it, capacity in bytes]
        self._buffers: list[list] = []
        self.reused = 0  # how many arrays came from a recycled buffer (for tests and tuning)
        # What a buffer nobody else holds counts, measured through the very code path used
        # later (interpreters differ in the temporary references they take).
        self._free_refs = self._ref_counts([[bytearray(1), 0, 1]])[0]

    @staticmethod
    def _ref_counts(buffers: list[list]) -> list[int]:
        return [sys.getrefcount(b[0]) for b in buffers]

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous writable array of ``shape`` and ``dtype``."""
        if not isinstance(dtype, np.dtype):
            dtype = np.dtype(dtype)
        # math.prod, not np.prod: this runs between a header's arrival and the posting of the
        # payload's receive, where np.prod's ~10 us (more under load) shows in the bandwidth.
        nbytes = int(math.prod(shape)) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dtype)
        best = None
        buffers = self._buffers
        free = [r <= self._free_refs for r in self._ref_counts(buffers)]
        for entry, is_free in zip(buffers, free):
            # Best fit, and at most twice the size so a small array does not pin a huge buffer.
            if is_free and nbytes <= entry[2] <= 2 * nbytes:
                if best is None or entry[2] < best[2]:
                    best = entry
        if best is not None:
            self.reused += 1
        else:
            if _CAN_MAP_HUGE and nbytes >= self.huge_min_bytes:
                m, start = huge_page_buffer(nbytes)
                best = [m, start, nbytes]
            else:
                best = [bytearray(nbytes), 0, nbytes]
            buffers.append(best)
            if len(buffers) > self.max_buffers:
                # Drop a free buffer if there is one, else stop tracking the oldest (its owner
                # keeps it alive; it is simply not recycled).
                i = next((i for i, f in enumerate(free) if f), 0)
                del buffers[i]
        return np.ndarray(shape, dtype=dtype, buffer=best[0], offset=best[1])
