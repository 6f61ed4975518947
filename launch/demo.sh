#!/usr/bin/env bash
# README's demo command: set-up (idempotent), then a 3-rank MPI job. Until federated training
# lands this runs the runtime's own demo: `mpifc info` and arrays around a ring with the
# communication ledger's per-link / per-phase byte table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MPIFC_ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mpiexec -n 3 "$MPIFC_VENV/bin/python" -m mpifc info
mpiexec -n 3 "$MPIFC_VENV/bin/python" -m mpifc.runtime.ring_demo
