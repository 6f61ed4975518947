"""Atomic file writes (kept for the runtime's importers; the helpers live in :mod:`mpifc.atomic`)."""
from mpifc.atomic import atomic_path, atomic_write_bytes, atomic_write_text

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]
