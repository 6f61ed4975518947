#!/usr/bin/env bash
# Idempotent set-up shared by demo.sh, test.sh and the benchmarks: creates .venv if missing and
# installs mpifc with its extras. Quick when nothing changed (a stamp holds the hash of the
# packaging files).
#
#   bash launch/setup.sh [extra,extra]     set up, change nothing in this shell
#   source launch/setup.sh [extra,extra]   set up, then put the venv's bin/ first on PATH
#
# Sourced, it changes nothing in the calling shell but PATH, MPIFC_ROOT and MPIFC_VENV: the
# set-up itself runs in a child bash (with its own `set -euo pipefail`), so no shell option,
# variable, function, trap or working directory of the caller is touched, and a failed set-up
# returns a non-zero status instead of ending the shell.
#
# Environment:
#   MPIFC_VENV       where the venv lives (default: <repo>/.venv)
#   MPIFC_PYTHON     interpreter used to create it (default: python3.11, else python3)
#   MPIFC_SITE_MPI=1 use the cluster's MPI: builds mpi4py from source against the mpicc on PATH
#                    and does not install the embedded mpich wheel.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # Sourced: only the names below are set, and only after the child bash succeeded.
  MPIFC_ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  MPIFC_VENV="${MPIFC_VENV:-$MPIFC_ROOT/.venv}"
  export MPIFC_ROOT MPIFC_VENV
  bash "$MPIFC_ROOT/launch/setup.sh" "$@" || return $?
  case ":$PATH:" in
    *":$MPIFC_VENV/bin:"*) ;;
    *) export PATH="$MPIFC_VENV/bin:$PATH" ;;
  esac
  return 0
fi

set -euo pipefail
MPIFC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MPIFC_VENV="${MPIFC_VENV:-$MPIFC_ROOT/.venv}"
extras="${1:-test,plots,progress}"

if [ ! -x "$MPIFC_VENV/bin/python" ]; then
  py="${MPIFC_PYTHON:-$(command -v python3.11 || command -v python3)}"
  echo "[setup] creating $MPIFC_VENV with $py" >&2
  "$py" -m venv "$MPIFC_VENV"
fi
PY="$MPIFC_VENV/bin/python"

mpi_extra="mpich"
[ "${MPIFC_SITE_MPI:-0}" = "1" ] && mpi_extra=""
all_extras="$extras${mpi_extra:+,$mpi_extra}"
stamp_file="$MPIFC_VENV/.mpifc-stamp"
stamp="$(cat "$MPIFC_ROOT/setup.cfg" "$MPIFC_ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)-$all_extras-${MPIFC_SITE_MPI:-0}"

if [ ! -f "$stamp_file" ] || [ "$(cat "$stamp_file")" != "$stamp" ]; then
  echo "[setup] installing mpifc[$all_extras] into $MPIFC_VENV" >&2
  "$PY" -m pip install -q --upgrade pip >&2 || true
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      "$PY" -m pip install -q "torch>=2.2" >&2
    else
      # No CUDA GPU: the CPU build avoids a multi-GB CUDA download.
      "$PY" -m pip install -q "torch==2.13.0" >&2 \
        || "$PY" -m pip install -q "torch>=2.2" --index-url https://download.pytorch.org/whl/cpu >&2
    fi
  fi
  if [ "${MPIFC_SITE_MPI:-0}" = "1" ]; then
    "$PY" -m pip install -q --no-binary=mpi4py "mpi4py>=4.1" >&2
  fi
  "$PY" -m pip install -q -e "$MPIFC_ROOT[$all_extras]" >&2
  echo "$stamp" > "$stamp_file"
fi
