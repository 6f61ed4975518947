"""Recycled receive buffers for large messages.

A freshly allocated array costs page faults (the kernel zeroes every page) the first time it is
written: for a 64 MB receive that is several times the copy itself. The pool keeps a few large
buffers and hands one out again only when no array refers to it any more (its reference count
says so), so callers still own the arrays they get and never see them change.
"""
from __future__ import annotations

import math
import sys

import numpy as np


class RecvBufferPool:
    """Arrays for large receives, backed by reusable ``bytearray`` buffers.

    Args:
        min_bytes: smaller arrays are plain ``np.empty`` (page faults matter only for big ones).
        max_buffers: buffers kept for reuse (memory bound: about ``max_buffers`` x the largest
            message size received recently).
    """

    def __init__(self, min_bytes: int = 1 << 20, max_buffers: int = 4) -> None:
        self.min_bytes = int(min_bytes)
        self.max_buffers = int(max_buffers)
        self._buffers: list[bytearray] = []
        self.reused = 0  # how many arrays came from a recycled buffer (for tests and tuning)
        # What a buffer nobody else holds counts, measured through the very code path used
        # later (interpreters differ in the temporary references they take).
        self._free_refs = self._ref_counts([bytearray(1)])[0]

    @staticmethod
    def _ref_counts(buffers: list[bytearray]) -> list[int]:
        return [sys.getrefcount(b) for b in buffers]

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous writable array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        # math.prod, not np.prod: this runs between a header's arrival and the posting of the
        # payload's receive, where np.prod's ~10 us (more under load) shows in the bandwidth.
        nbytes = int(math.prod(shape)) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dtype)
        best = None
        free = [r <= self._free_refs for r in self._ref_counts(self._buffers)]
        for buf, is_free in zip(self._buffers, free):
            # Best fit, and at most twice the size so a small array does not pin a huge buffer.
            if is_free and nbytes <= len(buf) <= 2 * nbytes:
                if best is None or len(buf) < len(best):
                    best = buf
        if best is not None:
            self.reused += 1
        else:
            best = bytearray(nbytes)
            self._buffers.append(best)
            if len(self._buffers) > self.max_buffers:
                # Drop a free buffer if there is one, else stop tracking the oldest (its owner
                # keeps it alive; it is simply not recycled).
                i = next((i for i, f in enumerate(free) if f), 0)
                del self._buffers[i]
        return np.ndarray(shape, dtype=dtype, buffer=best)
