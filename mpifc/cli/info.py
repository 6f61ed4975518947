"""``mpifc info``: the MPI library, every rank with its host and device, and package versions."""
from __future__ import annotations

import argparse

from mpifc.cli.common import add_job_arguments


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc info``."""
    add_job_arguments(p)


def info_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc info``."""
    from mpifc.runtime.info import run_info

    return run_info(deadline=args.deadline, device=args.device, liveness=args.liveness)
