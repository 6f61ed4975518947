"""Flags and flag parsing that several subcommands share."""
from __future__ import annotations

import argparse
from typing import Any

from mpifc.errors import UserError


def add_liveness_argument(p: argparse.ArgumentParser) -> None:
    """``--liveness S``: how long a rank may show no sign of life (every MPI job)."""
    p.add_argument("--liveness", type=float, default=10.0, metavar="S",
                   help="seconds a rank may show no sign of life (frozen, killed, ended early, stuck with the "
                        "GIL held) before the job ends naming it (> 0, default 10)")


def add_deadline_argument(p: argparse.ArgumentParser) -> None:
    """``--deadline S``: the job's wall-clock limit (every MPI job)."""
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="end the job if it runs longer than S seconds of wall-clock time, saying what each rank was "
                        "doing (> 0; default: no limit: a frozen, killed or ended rank, and ranks that all wait for "
                        "one another, end the job within --liveness)")


def add_output_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` (``what`` as one JSON line instead of text) or ``--quiet`` (nothing)."""
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=f"print {what} as one JSON line instead of text")
    out.add_argument("--quiet", action="store_true", help="print nothing (errors still go to stderr)")


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Flags every MPI job has: ``--deadline``, ``--liveness`` and ``--device``."""
    add_deadline_argument(p)
    add_liveness_argument(p)
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (cuda:(local_rank %% n_gpus) if CUDA, else cpu), cpu, cuda or cuda:N")


def parse_kv(items: list[str] | None, what: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``; values become int, else float, else str.

    Raises:
        UserError: an item without ``=``, naming the flag ``what``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{what} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                out[k] = cast(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out


def comma_ints(text: str, flag: str) -> tuple[int, ...]:
    """``"64,32"`` -> ``(64, 32)``: positive integers (an argparse ``type``)."""
    try:
        widths = tuple(int(t) for t in str(text).split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} expects comma-separated widths like 32,32, got {text!r}")
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{flag} expects positive widths, got {text!r}")
    return widths
