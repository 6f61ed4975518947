"""The typed message header and the dtype codes that travel in it.

Wire layout of one logical message of kind K from rank S to rank D (all MPI messages use tag
``K.kind_id``; MPI's non-overtaking rule keeps a header and its payload chunks in order):

* header message: ``HEADER_FIXED`` (32 bytes) + ``8 * ndim`` bytes of shape, followed by the
  payload itself when it is small (``flags & INLINE``), so a small message is one MPI message;
* otherwise ``n_chunks`` payload messages of at most ``chunk_bytes`` each (big arrays are chunked
  so no single MPI count exceeds 2**31 - 1).

Byte order is the host's: mpifc assumes a homogeneous cluster.
"""
from __future__ import annotations

import struct

import numpy as np

MAGIC = 0xFC
VERSION = 1

FLAG_INLINE = 1   # payload follows the header in the same MPI message
FLAG_PICKLE = 2   # payload is a pickle (uint8), not an array
FLAG_BF16 = 4     # payload is torch.bfloat16 bits carried as uint16

# magic u8, version u8, dtype code u8, ndim u8, flags u8, pad u8, kind id u16,
# n_chunks u32, reserved u32, t_send f64, nbytes i64  -> 32 bytes, keeps the payload 8-aligned.
_FIXED = struct.Struct("<BBBBBBHIIdq")
MAX_NDIM = 32
HEADER_FIXED = _FIXED.size

DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.bool_): 1, np.dtype(np.int8): 2, np.dtype(np.uint8): 3, np.dtype(np.int16): 4,
    np.dtype(np.uint16): 5, np.dtype(np.int32): 6, np.dtype(np.uint32): 7, np.dtype(np.int64): 8,
    np.dtype(np.uint64): 9, np.dtype(np.float16): 10, np.dtype(np.float32): 11,
    np.dtype(np.float64): 12, np.dtype(np.complex64): 13, np.dtype(np.complex128): 14,
}
CODE_DTYPES: dict[int, np.dtype] = {c: d for d, c in DTYPE_CODES.items()}


class WireError(RuntimeError):
    """A received header is not an mpifc header (version skew or a foreign message on our tag)."""


def header_size(ndim: int) -> int:
    """Bytes of a header for an array of ``ndim`` dimensions (without inline payload)."""
    return HEADER_FIXED + 8 * ndim


# One compiled Struct per ndim: packing or parsing a header is then a single call (hot path).
_FULL = [struct.Struct(_FIXED.format + "q" * n) for n in range(MAX_NDIM + 1)]
HEADER_STRUCTS = _FULL  # the transport's small-send fast path packs with these directly


def pack_header(buf: bytearray | memoryview, dtype_code: int, shape: tuple[int, ...], flags: int,
                kind_id: int, n_chunks: int, t_send: float, nbytes: int) -> int:
    """Write a header into ``buf``; returns its length in bytes."""
    full = _FULL[len(shape)]
    full.pack_into(buf, 0, MAGIC, VERSION, dtype_code, len(shape), flags, 0, kind_id, n_chunks, 0,
                   t_send, nbytes, *shape)
    return full.size


def unpack_header(buf: bytes | bytearray | memoryview, count: int) -> tuple[int, tuple[int, ...], int, int, int, float, int, int]:
    """Parse a header of a message of ``count`` bytes (one ``struct`` call: this is on every receive).

    Returns:
        ``(dtype_code, shape, flags, kind_id, n_chunks, t_send, nbytes, header_len)``.
    """
    if count < HEADER_FIXED:
        raise WireError(f"message of {count} bytes is shorter than an mpifc header")
    if buf[0] != MAGIC or buf[1] != VERSION:
        raise WireError(f"not an mpifc v{VERSION} header (magic {buf[0]:#x}, version {buf[1]})")
    ndim = buf[3]
    hlen = HEADER_FIXED + 8 * ndim
    if ndim > MAX_NDIM or count < hlen:
        raise WireError(f"truncated header: {count} bytes for {ndim} dimensions")
    h = _FULL[ndim].unpack_from(buf, 0)
    return h[2], h[11:], h[4], h[6], h[7], h[9], h[10], hlen
