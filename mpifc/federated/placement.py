"""Which leaf PCs of a federated circuit compute on torch, and putting them on a rank's device.

A leaf PC fitted by a learner that takes a device (EiNet, RAT-SPN:
:func:`~mpifc.federated.learners.takes_device`) computes on torch; every other leaf (LearnSPN's
SPNs, FC[DT]'s trees, factorised leaves) computes on the CPU with numpy. A rank asks for its
device only when :func:`needs_device` says one of the leaves it evaluates is a torch one, so a
rank that holds none never imports torch. The device arrives as a plain string.
"""
from __future__ import annotations

from typing import Iterable

from mpifc.federated.structure import LEAF, FederatedCircuit


def _leaf_ids(fc: FederatedCircuit, ranks: Iterable[int] | None) -> list[int]:
    keep = None if ranks is None else set(ranks)
    return [n.id for n in fc.nodes if n.op == LEAF and n.leaf is not None
            and (keep is None or n.rank in keep)]


def needs_device(fc: FederatedCircuit, ranks: Iterable[int] | None = None) -> bool:
    """Whether a leaf (of ``ranks``, or any) was fitted by a learner that computes on torch
    (read from the learner names: no model is loaded, nothing imported)."""
    from mpifc.federated.learners import takes_device

    return any(takes_device(fc.nodes[nid].leaf.learner) for nid in _leaf_ids(fc, ranks))


def place_models(fc: FederatedCircuit, device: str | None, ranks: Iterable[int] | None = None) -> int:
    """Move every loaded torch leaf model (of ``ranks``, or all) to ``device`` in place; returns
    how many moved. ``device`` None: nothing moves. Leaf models still in their wire form are
    rebuilt first (they are about to be evaluated)."""
    if device is None:
        return 0
    from mpifc.circuit.device import to_device
    from mpifc.federated.learners import takes_device

    moved = 0
    for nid in _leaf_ids(fc, ranks):
        leaf = fc.nodes[nid].leaf
        if leaf.model is None or not takes_device(leaf.learner):
            continue
        model = leaf.model.materialize() if callable(getattr(type(leaf.model), "materialize", None)) else leaf.model
        leaf.model = to_device(model, device)
        moved += 1
    return moved
