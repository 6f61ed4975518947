"""Flags and flag parsing that several subcommands share."""
from __future__ import annotations

import argparse
import os
from typing import Any

from mpifc.errors import UserError


def add_liveness_argument(p: argparse.ArgumentParser) -> None:
    """``--liveness S``: how long a rank may show no sign of life (every MPI job)."""
    p.add_argument("--liveness", type=float, default=10.0, metavar="S",
                   help="seconds a rank may show no sign of life (frozen, killed, ended early, stuck with the "
                        "GIL held) before the job ends naming it (> 0)")


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    """``--overwrite``: outputs may replace existing files that are not earlier outputs of their kind."""
    p.add_argument("--overwrite", action="store_true",
                   help="let an output replace an existing file that is not an earlier output of its kind "
                        "(without it such a file is refused); never an input of the job or a file its data "
                        "was made from")


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """``--audit DIR`` and ``--audit-findings``: the privacy audit of every message a rank sends
    (:mod:`mpifc.fedpc.audit`)."""
    p.add_argument("--audit", default=None, metavar="DIR",
                   help="check every message a client sends for raw rows and columns and for values that fewer "
                        "than 5 of its rows hold, and write per-rank records and audit-summary.json here "
                        "(default: no audit)")
    p.add_argument("--audit-findings", default="fail", choices=("fail", "record"),
                   help="what an audit finding does: fail = the message is not sent and the job ends with exit "
                        "code 3, writing no model; record = it is sent and recorded, and the model's "
                        "meta says so")


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


DEVICE_ENV = "MPIFC_DEVICE"
"""The ``--device`` default when set (how ``mpifc experiment --device`` reaches the jobs it starts)."""


def device_value(text: str) -> str:
    """An argparse ``type``: ``--device`` checked for its form (auto, cpu, cuda, cuda:N)."""
    from mpifc.runtime.device import DEVICE_CHOICES, parse_device

    try:
        return parse_device(text)
    except UserError:
        raise argparse.ArgumentTypeError(f"expected {DEVICE_CHOICES}, got {text!r}") from None


def add_device_argument(p: argparse.ArgumentParser, what: str = "EiNet and RAT-SPN leaf PCs") -> None:
    """``--device``: where a rank's torch computations run (:mod:`mpifc.runtime.device`)."""
    p.add_argument("--device", type=device_value, default=os.environ.get(DEVICE_ENV) or "auto", metavar="DEV",
                   help=f"where each rank computes its {what}: auto = cuda:(local rank %% GPUs of its node) "
                        "where CUDA is there, else cpu; cpu; cuda = the rank's GPU by local rank; or cuda:N. cuda "
                        "without CUDA, or cuda:N beyond the node's GPUs, stops the job before any work. LearnSPN, "
                        "FC[DT] trees (CART), factorised leaves and the numpy evaluator always compute on the CPU "
                        f"(a rank holding only those never loads torch). ${DEVICE_ENV} sets the default")


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Flags every MPI job has: ``--deadline``, ``--liveness`` and ``--device``."""
    add_deadline_argument(p)
    add_liveness_argument(p)
    add_device_argument(p, "torch work")


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
