"""What the launcher tells a rank before MPI starts: its rank and job size, an ``mpiexec`` that
does not match the MPI library mpi4py loaded, and MPICH settings for a job on one node
(:func:`tune_one_node_mpich`).

A mismatched launcher starts N independent singleton jobs of size 1 instead of one job of N ranks: every
process then believes it is rank 0 of 1. Launchers leave their job size in the environment, so a
size there above 1 while ``COMM_WORLD`` has size 1 gives the mismatch away.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from mpifc.errors import UserError
from mpifc.runtime.early import RANK_VARIABLES, env_rank  # noqa: F401 - this process's rank, for callers

# Variables that launchers set to the number of ranks in the job.
SIZE_VARIABLES: tuple[str, ...] = (
    "PMI_SIZE",               # MPICH hydra, Intel MPI, Slurm PMI-1/2
    "OMPI_COMM_WORLD_SIZE",   # Open MPI mpirun/prterun
    "MV2_COMM_WORLD_SIZE",    # MVAPICH2
    "PMIX_SIZE",              # some PMIx launchers
    "SLURM_STEP_NUM_TASKS",   # srun step (not set by sbatch in the batch script itself)
    "MPI_LOCALNRANKS",        # MPICH hydra: ranks on this node
)


def launcher_size(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """``(variable, size)`` of the first launcher variable that says the job has more than 1 rank."""
    env = os.environ if environ is None else environ
    for name in SIZE_VARIABLES:
        value = env.get(name, "")
        try:
            n = int(value)
        except ValueError:
            continue
        if n > 1:
            return name, n
    return None


ONE_NODE_MPICH = {"MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS": "16"}
"""MPICH settings for a job whose ranks all share one node (see :func:`tune_one_node_mpich`)."""
BUNDLED_LIBFABRIC = Path("lib", "mpich", "libfabric.so.1")
"""Where the ``mpich`` wheel keeps the libfabric of its ``ofi`` network module, under the venv."""


def tune_one_node_mpich(environ: dict[str, str] | None = None, prefix: str = sys.exec_prefix) -> dict[str, str]:
    """Before ``MPI_Init``, in a job whose ranks all run on this node under the ``mpich`` wheel's
    own ``mpiexec``: set :data:`ONE_NODE_MPICH` where the user has not; returns what it set.

    * 16 shared-memory cells per sender instead of 64: a rank that hears from many peers (the
      server of a FedPC job, the heartbeats of rank 0) maps a page of every cell each peer
      cycles through, and keeps it mapped (measured: rank 0 receiving 40 small messages from
      each of 63 peers grows by 39 MB with 64 cells, 17 MB with 16).

    The ``ofi`` network module would halve each rank's ``MPI_Init`` (0.04 against 0.09-0.10 CPU-s
    on 64 ranks sharing 2 cores, 8 MB less memory) but is not chosen: under it a failing job's
    ranks, which exit together with one code, were more often killed by the launcher before
    their own exit (exit 9 instead of the line's code in about 1 job in 30-50, against none in
    about 90 under ``ucx``); ``MPIR_CVAR_CH4_NETMOD=ofi`` asks for it.

    Nothing is set where mpi4py is pointed at another MPI library, where the job spans several
    nodes, or where the venv holds no bundled libfabric (a site MPI, tuned by its own site)."""
    env = os.environ if environ is None else environ
    if env.get("MPI4PY_LIBMPI"):
        return {}
    size, local = env.get("PMI_SIZE", ""), env.get("MPI_LOCALNRANKS", "")
    if not (size.isdigit() and size == local and int(size) > 1):
        return {}
    if not (Path(prefix) / BUNDLED_LIBFABRIC).is_file():
        return {}
    chosen = {k: v for k, v in ONE_NODE_MPICH.items() if k not in env}
    env.update(chosen)
    return chosen


def check_launcher_matches(world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`UserError` when the launcher's job size disagrees with ``world_size``.

    Args:
        world_size: ``MPI.COMM_WORLD.Get_size()``.
        environ: the environment to inspect (default ``os.environ``).
    """
    found = launcher_size(environ)
    if found is None or world_size != 1:
        return
    name, n = found
    import shutil

    from mpi4py import MPI
    import mpi4py

    library = MPI.Get_library_version().strip().splitlines()[0]
    raise UserError(
        f"the launcher says this job has {n} ranks ({name}={n}) but MPI sees 1: the mpiexec that "
        f"launched it does not match the MPI that mpi4py {mpi4py.__version__} loaded ({library}); "
        f"mpiexec on PATH: {shutil.which('mpiexec') or 'none'}. Launch with that MPI's own mpiexec "
        f"(with the embedded mpich wheel: <venv>/bin/mpiexec), or rebuild mpi4py against the "
        f"site MPI: pip install --no-binary=mpi4py mpi4py")
