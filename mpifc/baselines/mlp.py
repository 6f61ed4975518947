"""MLP building blocks shared by the baselines: construction, flat parameter vectors, SGD epochs.

Pure torch, no MPI: FedAvg, SplitNN and the centralized MLP all train through
:func:`sgd_epochs`, which is what makes "FedAvg with one client == centralized SGD" and "SplitNN
== the concatenated network" exact statements rather than approximate ones.

Shapes: features ``x`` are ``(n, d)`` float32, labels ``y`` are ``(n,)`` int64 class codes.
Plain SGD (no momentum, no weight decay) is used on purpose: an optimizer with state would be
reset at every FedAvg round and the equivalence with centralized training would no longer hold.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from mpifc.errors import UserError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"``/``"float64"`` as a torch dtype; UserError naming ``--dtype`` otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, not {name!r}") from None


def limit_threads(ranks_on_node: int) -> None:
    """Give each rank its share of the node's cores for torch, unless OMP_NUM_THREADS says.

    These MLPs are small: ranks that each spawn a full thread pool only fight over the cores
    (on a loaded 2-core machine, SGD ran 50x slower that way).
    """
    import os

    if os.environ.get("OMP_NUM_THREADS"):
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, ranks_on_node)))


def parse_hidden(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"64,32"`` -> ``(64, 32)``; an empty string means no hidden layer."""
    if not isinstance(text, str):
        sizes = tuple(int(h) for h in text)
    else:
        try:
            sizes = tuple(int(h) for h in text.split(",") if h.strip())
        except ValueError:
            raise UserError(f"--hidden must be comma-separated positive integers, not {text!r}") from None
    if any(h < 1 for h in sizes):
        raise UserError(f"--hidden sizes must be >= 1, got {list(sizes)}")
    return sizes


def make_mlp(n_in: int, hidden: Sequence[int], n_out: int, seed: int,
             dtype: torch.dtype = torch.float32, out_activation: bool = False) -> nn.Sequential:
    """A ReLU MLP ``n_in -> hidden... -> n_out`` initialised from ``seed`` alone.

    Args:
        out_activation: end with a ReLU too (SplitNN bottom models: the cut layer is an
            activation, not logits).
    """
    if n_in < 1 or n_out < 1:
        raise UserError(f"an MLP needs >= 1 input and output unit, got {n_in} -> {n_out}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = []
        width = n_in
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_out))
        if out_activation:
            layers.append(nn.ReLU())
        model = nn.Sequential(*layers).to(dtype)
    finally:
        # Leave the global generator as we found it: callers' randomness stays theirs.
        torch.random.set_rng_state(gen_state)
    return model


def on_device(obj: Any, device: Any) -> Any:
    """A module or tensor moved to ``device`` (the rank's ``--device``); None: unchanged. Models
    are built and seeded on the CPU, so the same seed gives the same initial network on every
    device."""
    return obj if device is None else obj.to(device)


def n_parameters(model: nn.Module) -> int:
    """Number of scalar parameters ``M``."""
    return sum(p.numel() for p in model.parameters())


def get_flat(model: nn.Module) -> np.ndarray:
    """All parameters as one contiguous ``(M,)`` array of the model's dtype (a copy)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy().copy()


def set_flat(model: nn.Module, flat: np.ndarray) -> None:
    """Load a ``(M,)`` vector written by :func:`get_flat` into ``model`` in place."""
    m = n_parameters(model)
    if flat.shape != (m,):
        raise ValueError(f"parameter vector has shape {flat.shape}, the model needs ({m},)")
    ref = next(model.parameters())
    vec = torch.from_numpy(np.ascontiguousarray(flat)).to(dtype=ref.dtype, device=ref.device)
    torch.nn.utils.vector_to_parameters(vec, model.parameters())


def batch_indices(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """One epoch of shuffled minibatch index tensors; ``batch_size <= 0`` means full batch.

    The full batch is not shuffled, so it draws nothing from ``generator``.
    """
    if batch_size <= 0 or batch_size >= n:
        yield torch.arange(n)
        return
    perm = torch.randperm(n, generator=generator)
    for lo in range(0, n, batch_size):
        yield perm[lo: lo + batch_size]


def sgd_epochs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
               lr: float, generator: torch.Generator) -> float:
    """Train ``model`` in place with plain SGD on mean cross-entropy.

    Args:
        x: ``(n, d)`` features; y: ``(n,)`` int64 labels.
        epochs: passes over the data; batch_size: rows per step (<= 0: full batch).
        generator: drives the shuffling; keep one per party across calls for reproducibility.

    Returns:
        Mean training loss of the last epoch, nats per sample.
    """
    loss_fn = nn.CrossEntropyLoss()
    last = float("nan")
    for _ in range(epochs):
        total, seen = 0.0, 0
        for idx in batch_indices(len(y), batch_size, generator):
            idx = idx.to(x.device)  # drawn on the CPU (the same order on every device)
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-lr)
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
        last = total / max(seen, 1)
    return last


def predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Class codes ``(n,)`` int64 of the argmax logit."""
    with torch.no_grad():
        return model(x).argmax(dim=1).cpu().numpy().astype(np.int64)
