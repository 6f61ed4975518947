"""``torch``, imported on first use.

Importing torch costs over a second and ~250 MB per process. Leaf classes and circuits are
built, fitted, saved, sent and evaluated with numpy alone (:mod:`mpifc.circuit.numpy_eval`), so
the modules that also offer torch maths (the batched leaf methods, the compiled evaluator) hold
this stand-in instead of the module: ``torch.where(...)`` imports torch at its first call only.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


def torch_loaded() -> bool:
    """Whether this process has imported torch already (then tensors may be around)."""
    return "torch" in sys.modules


def is_tensor(x: Any) -> bool:
    """``isinstance(x, torch.Tensor)`` without importing torch (no tensor exists before it is)."""
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def no_grad(fn: F) -> F:
    """``torch.no_grad()`` as a decorator that imports torch at the first call, not at definition."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
