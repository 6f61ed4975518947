#!/usr/bin/env bash
# README's test command: set-up (idempotent) then the whole pytest suite.
# Extra arguments go to pytest, e.g. `bash launch/test.sh -k ledger -x`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" ""
cd "$MPIFC_ROOT"
# Test files run on $MPIFC_TEST_WORKERS workers (default 2; 0 runs them in this process), each
# file whole on one worker, so a module's fixtures are built once. The files are handed out in
# collection order, which tests/conftest.py sets longest first from tests/file_seconds.json.
# pytest's own exit code is kept: 5 (no tests ran) is a failure, not a success.
exec "$MPIFC_VENV/bin/python" -m pytest -n "${MPIFC_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
