"""Payloads: what an array, a tensor or a pickled object becomes on the wire, and back.

A payload is the raw bytes of a C-contiguous numpy array; its dtype code and flags travel in the
header (:mod:`mpifc.runtime.wire`). Torch tensors are sent from their CPU copy (bfloat16 as its
uint16 bits), so importing this module never imports torch.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from mpifc.runtime import wire
from mpifc.runtime.kinds import MessageKind, as_kind

_BF16_CODE = 15                 # dtype code of torch.bfloat16 (carried as uint16 bits)

CODE_DTYPES_BF16 = {_BF16_CODE: np.dtype(np.uint16)}
"""Dtype a bfloat16 payload is received as (its bits), before :func:`as_array` widens it."""


def _is_torch(x: Any) -> bool:
    # Checking the type's module avoids importing torch (seconds) in jobs that never use it.
    return type(x).__module__.startswith("torch")


def to_wire_array(x: Any) -> tuple[np.ndarray, int, int]:
    """A C-contiguous numpy view/copy of ``x``, its dtype code and extra flags.

    Accepts numpy arrays and scalars, anything ``np.asarray`` turns into a numeric array, and
    torch tensors (any device; bfloat16 travels as its uint16 bits).
    """
    flags = 0
    if type(x) is np.ndarray and x.flags.c_contiguous:
        code = wire.DTYPE_CODES.get(x.dtype)
        if code is not None and x.ndim <= wire.MAX_NDIM:
            return x, code, 0
    if _is_torch(x):
        import torch

        t = x.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if t.dtype == torch.bfloat16:
            arr = t.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
            return _contiguous(arr), _BF16_CODE, wire.FLAG_BF16
        arr = t.cpu().contiguous().numpy()
    else:
        arr = np.asarray(x)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    code = wire.DTYPE_CODES.get(arr.dtype)
    if code is None:
        raise TypeError(f"cannot send an array of dtype {arr.dtype}: use send_obj for Python objects")
    if arr.ndim > wire.MAX_NDIM:
        raise ValueError(f"cannot send an array of {arr.ndim} dimensions (max {wire.MAX_NDIM})")
    return _contiguous(arr), code, flags


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray turns 0-d arrays into 1-d ones, so copy only when needed.
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, writable when the array is (0-d and empty work too)."""
    if arr.size == 0:
        return memoryview(b"")
    return memoryview(arr).cast("B")


def as_array(value: np.ndarray, flags: int, kind: MessageKind | str) -> np.ndarray:
    """A received payload as the array that was sent (bfloat16 widened to float32)."""
    if flags & wire.FLAG_PICKLE:
        raise TypeError(f"{as_kind(kind).name!r}: expected an array, got a pickled object (use recv_obj)")
    if flags & wire.FLAG_BF16:
        # bfloat16 bits are the top half of a float32.
        return (value.astype(np.uint32) << 16).view(np.float32)
    return value


def decode(value: np.ndarray, flags: int) -> Any:
    """A received payload as what was sent: a pickled object, or an array (:func:`as_array`)."""
    if flags & wire.FLAG_PICKLE:
        return pickle.loads(value.tobytes() if not value.flags.c_contiguous else memoryview(value))
    return as_array(value, flags, "")
