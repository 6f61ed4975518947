"""The ``mpifc info`` job: MPI library, ranks, devices and package versions."""
from __future__ import annotations

import os
import socket
import sys
from importlib import metadata

from mpifc.runtime.job import JobContext, run_job

PACKAGES = ("mpifc", "mpi4py", "mpich", "torch", "numpy", "scipy", "scikit-learn", "h5py")


def package_versions() -> dict[str, str]:
    """Installed versions (from metadata, so nothing heavy is imported)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    if out["mpifc"] == "not installed":
        import mpifc

        out["mpifc"] = f"{mpifc.__version__} (source tree)"
    return out


def _rank_line(ctx: JobContext) -> str:
    dev = ctx.device
    return (f"rank {ctx.rank}/{ctx.size}  host {socket.gethostname()}  local {ctx.local_rank}/{ctx.local_size}"
            f"  role {ctx.roles.role_of(ctx.rank)}  device {dev}  pid {os.getpid()}")


def info_job(ctx: JobContext) -> int:
    """Rank 0 prints the library summary and one line per rank (gathered, not counted)."""
    from mpi4py import MPI
    import mpi4py

    lines = ctx.transport.gather_obj(_rank_line(ctx), root=0)
    if ctx.rank == 0:
        major, minor = MPI.Get_version()
        library = " ".join(MPI.Get_library_version().split("\n")[0].split())
        out = [f"MPI library:  {library}", f"MPI standard: {major}.{minor}",
               f"mpi4py:       {mpi4py.__version__}", f"python:       {sys.version.split()[0]}"]
        try:
            import torch

            cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
            out.append(f"CUDA devices: {cuda}")
        except ImportError:
            out.append("CUDA devices: torch not installed")
        out.append("packages:     " + ", ".join(f"{k} {v}" for k, v in package_versions().items()))
        out.append(f"ranks:        {ctx.size}")
        out.extend(lines)
        print("\n".join(out), flush=True)
    return 0


def run_info(deadline: float | None = None, device: str | None = None, liveness: float = 10.0) -> int:
    """Run the ``mpifc info`` job on every rank of ``COMM_WORLD``; returns the exit code."""
    return run_job(info_job, deadline=deadline, device=device, liveness=liveness)


__all__ = ["run_info", "info_job", "package_versions"]
