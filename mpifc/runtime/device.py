"""Which torch device a rank computes on: ``cuda:(local_rank % n_gpus)`` or the CPU."""
from __future__ import annotations

from typing import Any

from mpifc.errors import UserError


LOCAL_RANK_VARIABLES = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),                       # MPICH hydra
                        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))  # Open MPI


def local_rank_of(comm: Any) -> tuple[int, int]:
    """``(local rank, ranks on this node)``: from the launcher's environment where it says, else
    from MPI's shared-memory split (a collective)."""
    import os

    for rank_var, size_var in LOCAL_RANK_VARIABLES:
        r, n = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
        if r.isdigit() and n.isdigit() and int(r) < int(n) and comm.Get_size() > 1:
            return int(r), int(n)
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def select_device(local_rank: int, override: str | None = None) -> Any:
    """The ``torch.device`` for a rank.

    Args:
        local_rank: the rank's index among the ranks on its node.
        override: ``--device`` value: ``"auto"``/``None`` (pick), ``"cpu"``, ``"cuda"`` (this rank's
            GPU by local rank) or ``"cuda:N"``.

    Raises:
        UserError: the override names a device that is not there.
    """
    import torch

    if override in (None, "", "auto"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return torch.device(f"cuda:{local_rank % n}") if n else torch.device("cpu")
    try:
        dev = torch.device(override)
    except (RuntimeError, TypeError) as e:
        raise UserError(f"--device {override!r}: not a device ({e})") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UserError(f"--device {override!r}: CUDA is not available on this node")
        index = local_rank % n if dev.index is None else dev.index
        if index >= n:
            raise UserError(f"--device {override!r}: this node has {n} CUDA device(s)")
        return torch.device(f"cuda:{index}")
    if dev.type != "cpu":
        raise UserError(f"--device {override!r}: only cpu, cuda and cuda:N are supported")
    return dev
