"""mpifc.runtime: the generic byte-counted actor runtime any protocol over MPI builds on.

It knows nothing of circuits: FedPC (:mod:`mpifc.fedpc`), FedAvg, SplitNN and FedNGM all run on it.

Modules (one reason to change each):
  kinds      registry of named message kinds and their payload classes (ids = MPI tags)
  wire       the typed header that precedes every payload
  payload    arrays, tensors and pickled objects as payload bytes, and back
  transport  send/recv of arrays, tensors and small objects, with optional deadlines
  watchdog   the thread that ends waits done inside MPI (soft limits, deadlines); polling back-off
  bufpool    recycled buffers for large receives (2 MiB-aligned huge pages where the OS has them)
  ledger     one row per message; gathered to rank 0; CSV and per-link/phase summaries
  job        run_job(main): communicator, ledger, transport, roles, device, fail-fast, liveness
  liveness   heartbeats on a side communicator: a silent or early-ended rank, or a deadlock, ends the job
  early      the mpifc command's first lines under a launcher: signals held, node met, sentinel started
  node       the node folder the ranks share before and beside MPI, and its sentinel process
  sentinel   the per-node process that watches the ranks and the launcher from outside MPI (stdlib only)
  signals    SIGINT/SIGTERM/SIGUSR1 on a thread of their own; a rank's normal end
  outputs    output files renamed into place only when the whole job succeeded
  faults     MPIFC_FAULT: fault injection at a named phase, for tests
  jsonout    strict JSON lines (non-finite numbers become null with a reason)
  actor      dispatch loop: handlers per message kind, clean shutdown
  roles      server and client ranks
  device     cuda:(local_rank % n_gpus) or cpu
  launcher   detects an mpiexec that does not match mpi4py's MPI
  failure    error reporting: one line per job, every rank of a node exiting with one code
  info       the `mpifc info` job (library, ranks, devices)

Names below are imported lazily so ``import mpifc.runtime`` does not start MPI.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "MessageKind": "kinds", "register_kind": "kinds", "kind_by_id": "kinds", "kind_by_name": "kinds",
    "PAYLOAD_CLASSES": "kinds",
    "CommLedger": "ledger", "LedgerTable": "ledger", "LedgerSummary": "ledger",
    "Transport": "transport", "DeadlineExceeded": "transport",
    "JobContext": "job", "run_job": "job",
    "Actor": "actor", "actor_stop": "actor",
    "Roles": "roles",
}


def __getattr__(name: str) -> object:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'mpifc.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mpifc.runtime.{mod}"), name)


__all__ = sorted(_EXPORTS)
