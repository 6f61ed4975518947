"""Fault injection for tests: one fault, at a named phase of one rank, chosen by the environment.

A testing hook, read only by the job runner (:func:`mpifc.runtime.job.run_job`)::

    MPIFC_FAULT=RANK:PHASE:KIND        e.g. MPIFC_FAULT=1:learn:sigstop
    MPIFC_FAULT_LOG=DIR                optional: where ranks note their process ids and the fault

``PHASE`` is a name a job announces with :meth:`mpifc.runtime.job.JobContext.enter`
(``startup`` is the runner's own: before MPI starts); the FedPC jobs use ``read``, ``learn``,
``gather``, ``write`` and ``query`` (see :mod:`mpifc.fedpc.train` and
:mod:`mpifc.fedpc.evaluate`). ``KIND`` is one of:

* ``sigkill``: the rank kills itself with SIGKILL;
* ``sigstop``: the rank stops itself with SIGSTOP (a frozen process);
* ``raise``: the rank raises ``RuntimeError`` (a bug);
* ``return``: the rank's job function returns at once (a rank that ends early).

With ``MPIFC_FAULT_LOG``, every rank writes ``DIR/rank-R.pid`` when the runner starts, the rank
that starts the node sentinel writes ``DIR/sentinel-R.pid``, and the faulting rank writes
``DIR/fault`` (``rank phase kind unix-time pid``) just before the fault.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from mpifc.errors import UserError

ENV = "MPIFC_FAULT"
LOG_ENV = "MPIFC_FAULT_LOG"
KINDS = ("sigkill", "sigstop", "raise", "return")


class ReturnEarly(BaseException):
    """Unwinds a job function as if it returned (``return`` faults); BaseException so that no
    ``except Exception`` on the way catches it."""


@dataclass(frozen=True)
class Fault:
    rank: int
    phase: str
    kind: str


def parse(text: str) -> Fault:
    """``"RANK:PHASE:KIND"`` -> :class:`Fault`; UserError naming the variable otherwise."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].strip().isdigit() or not parts[1].strip() or parts[2].strip() not in KINDS:
        raise UserError(f"{ENV}={text!r}: expected RANK:PHASE:KIND with KIND one of {', '.join(KINDS)}")
    return Fault(int(parts[0]), parts[1].strip(), parts[2].strip())


_planned: Fault | None = None
_loaded = False


def load() -> Fault | None:
    """The fault the environment asks for (read once per process), or None."""
    global _planned, _loaded
    if not _loaded:
        text = os.environ.get(ENV, "").strip()
        _planned = parse(text) if text else None
        _loaded = True
    return _planned


def note(name: str, text: str) -> None:
    """Write ``MPIFC_FAULT_LOG/name`` (nothing without the variable)."""
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text(text, encoding="utf-8")
    except OSError:
        pass


def at(rank: int | None, phase: str) -> None:
    """A fault point: inject the planned fault if it names this rank and phase."""
    fault = _planned if _loaded else load()
    if fault is None or fault.rank != rank or fault.phase != phase:
        return
    note("fault", f"{rank} {phase} {fault.kind} {time.time():.6f} {os.getpid()}\n")
    if fault.kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.kind == "raise":
        raise RuntimeError(f"fault injected by {ENV} at phase {phase!r}")
    else:
        raise ReturnEarly()
