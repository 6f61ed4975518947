"""Leaf PCs on the rank's device for the query passes (``mpifc evaluate``, ``mpifc query``).

A rank puts the torch leaf PCs it evaluates (EiNet, RAT-SPN) on its device (``ctx.device``:
``--device``, by default ``cuda:(local_rank % n_gpus)`` where CUDA is there). A rank whose leaves
all compute with numpy (LearnSPN, FC[DT], factorised), or that holds no leaf, never resolves a
device and never imports torch. What crosses ranks is unchanged: every pass sends float64 CPU
arrays whatever the device.
"""
from __future__ import annotations

from typing import Any

from mpifc.federated.placement import needs_device, place_models
from mpifc.federated.structure import FederatedCircuit


def device_for(ctx: Any, fc: FederatedCircuit, gathered: bool = False) -> str | None:
    """This rank's device as a string when a leaf it evaluates (every leaf, ``gathered``)
    computes on torch; None otherwise (nothing resolved)."""
    return str(ctx.device) if needs_device(fc, None if gathered else [ctx.rank]) else None


def place_for_rank(ctx: Any, fc: FederatedCircuit) -> None:
    """Move the torch leaf PCs of this rank (those it loaded) to its device."""
    place_models(fc, device_for(ctx, fc), [ctx.rank])
