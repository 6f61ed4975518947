"""Models on a device: moving a model there, and CUDA out of memory as one clear line.

A device arrives here as a plain string (``"cpu"``, ``"cuda:0"``), chosen by the layer that
runs the rank (:mod:`mpifc.runtime.device`). Torch models (EiNet, RAT-SPN) offer
``to_device(device)``; every other model (LearnSPN's SPNs, FC[DT]'s trees, factorised leaves)
computes on the CPU with numpy and is left where it is. Models are saved as CPU arrays whatever
their device, so a model trained on a GPU loads and answers on a machine without one.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from mpifc.errors import DeviceOutOfMemory

F = TypeVar("F", bound=Callable[..., Any])


def to_device(model: Any, device: str | None) -> Any:
    """``model`` on ``device``: ``model.to_device(device)`` for a model that computes on torch,
    ``model`` itself otherwise (and for ``device`` None)."""
    move = getattr(type(model), "to_device", None)
    if device is None or move is None:
        return model
    return model.to_device(device)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device running out of memory (``torch.OutOfMemoryError``, or a
    CUDA/cuBLAS allocation failure reported as a RuntimeError)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def out_of_memory_error(device: Any, what: str, n_parameters: int | None) -> DeviceOutOfMemory:
    """The one-line error: the device (its name and memory where known), the model and its size."""
    where = str(device)
    try:
        import torch

        if where.startswith("cuda") and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.device(where))
            where += f" ({props.name}, {props.total_memory / 2**30:.1f} GiB)"
    except Exception:  # noqa: BLE001 - the message must come out whatever the device's state
        pass
    size = f" of {n_parameters:,} parameters" if n_parameters is not None else ""
    return DeviceOutOfMemory(f"out of memory on {where} in {what}{size}; use a smaller model (e.g. a lower "
                             f"num_sums), smaller batches (batch_size, eval_batch_size) or --device cpu")


@contextmanager
def memory_guard(device: Any, what: str, n_parameters: Callable[[], int | None]) -> Iterator[None]:
    """Turn a device's out-of-memory error inside the block into :class:`DeviceOutOfMemory`
    (``n_parameters`` is called only then)."""
    err = None
    try:
        yield
    except RuntimeError as exc:
        if not is_out_of_memory(exc):
            raise
        try:
            n = n_parameters()
        except Exception:  # noqa: BLE001
            n = None
        err = out_of_memory_error(device, what, n)
    if err is not None:
        # Raised outside the handler: the CUDA error (and the tensors its frames hold) is let go.
        raise err


def guarded(step: str, model: str) -> Callable[[F], F]:
    """Decorate a model method: a device out-of-memory error in it becomes
    :class:`DeviceOutOfMemory` naming ``self.device``, the ``step`` (e.g. ``"the E-step"``), the
    ``model`` (e.g. ``"an EiNet"``) and its size, ``self.num_parameters()``."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            with memory_guard(getattr(self, "device", "?"), f"{step} of {model}", lambda: int(self.num_parameters())):
                return method(self, *args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap
