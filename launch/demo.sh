#!/usr/bin/env bash
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MPIFC_ROOT"
mpiexec -n 3 "$MPIFC_VENV/bin/python" -m mpifc info
