"""``torch``, imported on first use.

Importing torch costs over a second and ~250 MB per process. Leaf classes and circuits are
built, fitted, saved, sent and evaluated with numpy alone (:mod:`mpifc.circuit.numpy_eval`), so
the leaf modules, which also offer torch maths (the batched methods the compiled evaluator
calls), hold this stand-in instead of the module: ``torch.where(...)`` imports torch at its first
call only. The compiled evaluator itself imports torch, and is imported only where it is used.
"""
from __future__ import annotations

from typing import Any


class _LazyTorch:
    """Attribute access forwards to the real ``torch`` module (imported then), cached per name."""

    def __getattr__(self, name: str) -> Any:
        import torch as _torch

        value = getattr(_torch, name)
        setattr(self, name, value)  # the next access skips __getattr__
        return value

    def __repr__(self) -> str:
        return "<torch, imported on first use>"


torch: Any = _LazyTorch()
