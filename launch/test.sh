#!/usr/bin/env bash
# README's test command: set-up (idempotent) then the whole pytest suite.
# Extra arguments go to pytest, e.g. `bash launch/test.sh -k ledger -x`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" ""
cd "$MPIFC_ROOT"
# pytest's own exit code is kept: 5 (no tests ran) is a failure, not a success.
exec "$MPIFC_VENV/bin/python" -m pytest "$@"
