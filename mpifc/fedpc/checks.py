"""Checks every rank makes on a model file before a distributed query sends any message."""
from __future__ import annotations

from typing import Any

from mpifc.errors import UserError
from mpifc.federated.structure import FederatedCircuit


def check_model_matches(fc: FederatedCircuit, manifest: Any, model: str) -> None:
    """The model's clients must be the manifest's clients with the same features."""
    for c in fc.clients.values():
        if not 0 <= c.index < manifest.n_clients:
            raise UserError(f"{model}: client {c.index} is not in the shard manifest ({manifest.n_clients} clients)")
        want = tuple(manifest.clients[c.index]["features"])
        if set(c.features) != set(want):
            raise UserError(f"{model}: client {c.index} was trained on features {list(c.features)}, "
                            f"but the shards give it {list(want)}")


def check_root_on_querier(fc: Any, model: str) -> None:
    """Every rank, before any message: the root must be on rank 0, the querier that receives the
    answers (training puts it there, :func:`mpifc.federated.assign.root_on_rank`). A root elsewhere
    (an edited file, or one written before that rule) would leave rank 0 out of the pass while the
    clients wait for its evidence; every rank raises the same UserError instead."""
    rank = fc.nodes[fc.root].rank
    if rank != 0:
        raise UserError(f"{model}: the root (node {fc.root}) is on rank {rank}; the distributed passes need it "
                        f"on rank 0, the querier (retrain, or evaluate without --distributed)")
