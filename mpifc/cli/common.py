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


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """``--audit DIR`` and ``--audit-findings``: the privacy audit of every message a rank sends
    (:mod:`mpifc.fedpc.audit`)."""
    p.add_argument("--audit", default=None, metavar="DIR",
                   help="check every message a client sends for raw rows and columns and for values that fewer "
                        "than 5 of its rows hold, and write per-rank records and audit-summary.json here "
                        "(default: no audit)")
    p.add_argument("--audit-findings", default="fail", choices=("fail", "record"),
                   help="what an audit finding does: fail = the message is not sent and the job ends with exit "
                        "code 3, writing no model (default); record = it is sent and recorded, and the model's "
                        "meta says so")


def add_output_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` (``what`` as one JSON line instead of text) or ``--quiet`` (nothing)."""
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=f"print {what} as one JSON line instead of text")
    out.add_argument("--quiet", action="store_true", help="print nothing (errors still go to stderr)")


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Flags every MPI job has: ``--deadline``, ``--liveness`` and ``--device``."""
    p.add_argument("--deadline", type=float, default=300.0, metavar="S",
                   help="seconds any single send or receive may wait before the job aborts (> 0, default 300)")
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
