"""Detect an ``mpiexec`` that does not match the MPI library mpi4py loaded.

Such a launcher starts N independent singleton jobs of size 1 instead of one job of N ranks: every
process then believes it is rank 0 of 1. Launchers leave their job size in the environment, so a
size there above 1 while ``COMM_WORLD`` has size 1 gives the mismatch away.
"""
from __future__ import annotations

import os
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
