#!/usr/bin/env bash
# A one-node Slurm cluster on localhost: try launch/slurm/ on a workstation before a real cluster.
# The test suite (tests/slurm/) brings up the same cluster.
#
#   sudo launch/slurm/local-cluster.sh install   # Debian/Ubuntu: slurm-wlm and munge via apt-get
#   launch/slurm/local-cluster.sh up DIR         # munged, slurmctld, slurmd; config, logs, state in DIR
#   export SLURM_CONF=DIR/slurm.conf             # srun, sbatch, squeue and scancel talk to it
#   srun -n 4 .venv/bin/python -c 'from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())'
#   sbatch --ntasks=4 --export=ALL,RANKS=4,OUT=results/local launch/slurm/fedpc.sbatch
#   launch/slurm/local-cluster.sh down DIR       # cancels every job, stops the daemons by their PIDs
#
# Nothing system-wide is used or changed: the munge key and socket, the ports, the config, the
# logs and the state all live in DIR, so it runs beside a site's own munge or Slurm. `up` runs
# the daemons as the calling user, and jobs run as that user: once installed, no root is needed.
# The node has one partition, `local`, and no GPUs (no GRES).
#
# Environment for `up`:
#   SLURM_LOCAL_CPUS   CPUs the node announces (default 8). More than the machine's cores on
#                      purpose: a 4-rank job then runs on a 2-core laptop, as mpiexec -n 4 does.
#   SLURMCTLD_PORT     slurmctld's port (default 6817)
#   SLURMD_PORT        slurmd's port (default 6818); change both to run a second local cluster.
#   SLURM_LOCAL_WAIT   seconds to wait for the node to come up (default 30)
#
# Exit codes: 0 done, 1 a daemon did not come up (its log tail is printed), 2 bad usage or
# Slurm/munge missing.
set -euo pipefail

PROG="launch/slurm/local-cluster.sh"
# The daemons live in sbin, which a user's PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

die() { echo "$PROG: $*" >&2; exit 2; }

usage() {
  echo "usage: $PROG install | up DIR | down DIR | status DIR" >&2
  exit 2
}

missing_tools() {
  local t out=()
  for t in munged slurmctld slurmd srun sbatch squeue scancel scontrol sinfo; do
    command -v "$t" >/dev/null 2>&1 || out+=("$t")
  done
  echo "${out[*]}"
}

cmd_install() {
  if [ -z "$(missing_tools)" ]; then
    echo "slurm and munge already installed"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "installing slurm-wlm and munge needs root (apt-get)"
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install Slurm and munge with this system's package manager"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing (fresh container) or stale; the install alone would 404.
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  local still
  still="$(missing_tools)"
  [ -z "$still" ] || die "apt-get installed slurm-wlm and munge, yet these are still missing: $still"
  echo "installed slurm-wlm and munge"
}

# The PID in DIR/NAME.pid when that process is alive and is NAME (a reused PID is not ours).
live_pid() {
  local dir="$1" name="$2" pid
  [ -s "$dir/$name.pid" ] || return 1
  pid="$(tr -dc 0-9 < "$dir/$name.pid")"
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
  echo "$pid"
}

# SIGTERM to the named daemons at once (each takes ~2 s to shut down), SIGKILL to any still there
# after 5 s.
stop_daemons() {
  local dir="$1" name pid i pids=() left
  shift
  for name in "$@"; do
    if pid="$(live_pid "$dir" "$name")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$name:$pid")
    fi
  done
  for i in $(seq 50); do
    left=0
    for name in "${pids[@]}"; do [ -d "/proc/${name#*:}" ] && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for name in "${pids[@]}"; do
    if [ -d "/proc/${name#*:}" ]; then
      echo "$PROG: ${name%%:*} (${name#*:}) ignored SIGTERM for 5 s: SIGKILL" >&2
      kill -KILL "${name#*:}" 2>/dev/null || true
    fi
  done
  for name in "$@"; do rm -f "$dir/$name.pid"; done
}

slurm_env() { SLURM_CONF="$1/slurm.conf" "${@:2}"; }

cmd_down() {
  local dir="$1" i
  [ -d "$dir" ] || die "down: $dir is not a directory"
  dir="$(cd "$dir" && pwd)"
  if live_pid "$dir" slurmctld >/dev/null && [ -f "$dir/slurm.conf" ]; then
    # Cancel first: slurmd leaves running job steps (slurmstepd) behind when it stops.
    slurm_env "$dir" scancel --quiet --user="$(id -un)" 2>/dev/null || true
    for i in $(seq 100); do
      [ -z "$(slurm_env "$dir" squeue --noheader --format=%i 2>/dev/null || true)" ] && break
      sleep 0.2
    done
  fi
  # slurmd and slurmctld still authenticate through munged while they shut down.
  stop_daemons "$dir" slurmd slurmctld
  stop_daemons "$dir" munged
}

cmd_status() {
  local dir="$1" name pid
  [ -d "$dir" ] || die "status: $dir is not a directory"
  for name in munged slurmctld slurmd; do
    if pid="$(live_pid "$dir" "$name")"; then echo "$name $pid"; else echo "$name down"; fi
  done
}

free_check_port() {
  # A port already bound would make the daemon exit with a line in its log; say so up front.
  local port="$1"
  if command -v ss >/dev/null 2>&1 && ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    die "up: port $port is in use (set SLURMCTLD_PORT / SLURMD_PORT)"
  fi
}

log_tail() {
  local f
  for f in "$@"; do
    [ -f "$f" ] && { echo "--- $f (tail) ---" >&2; tail -n 15 "$f" >&2; }
  done
  return 0
}

cmd_up() {
  local dir="$1" missing
  missing="$(missing_tools)"
  [ -z "$missing" ] || die "Slurm/munge missing ($missing): run '$PROG install' as root"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  local name
  for name in munged slurmctld slurmd; do
    if live_pid "$dir" "$name" >/dev/null; then
      die "up: $name already runs for $dir (run '$PROG down $dir' first)"
    fi
  done
  local cpus="${SLURM_LOCAL_CPUS:-8}" ctld_port="${SLURMCTLD_PORT:-6817}" d_port="${SLURMD_PORT:-6818}"
  local wait_s="${SLURM_LOCAL_WAIT:-30}" user host
  [[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "up: SLURM_LOCAL_CPUS=$cpus is not a positive integer"
  [[ "$ctld_port" =~ ^[1-9][0-9]*$ && "$d_port" =~ ^[1-9][0-9]*$ ]] || die "up: ports must be integers"
  free_check_port "$ctld_port"
  free_check_port "$d_port"
  user="$(id -un)"
  # Job IDs start at a random number, not 1: the mpich wheel names its shared-memory segment after
  # the job step (<job>.<step>), and a segment that a killed job left in /dev/shm would be reused
  # by the next cluster's job of the same number, whose ranks then hang in MPI_Init.
  local first_job=$(( ((RANDOM << 15) | RANDOM) % 60000000 + 1000 ))
  host="$(hostname -s 2>/dev/null || hostname)"
  # munged wants its socket's folder searchable by all and writable by none but the owner.
  chmod 755 "$dir"
  mkdir -p "$dir/state" "$dir/spool"
  if [ ! -s "$dir/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none)
  fi
  cat > "$dir/slurm.conf" <<EOF
# One-node cluster written by $PROG; every path is inside this folder.
ClusterName=mpifc-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups: a workstation or a container need not delegate them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# The mpich wheel's ranks find each other through Slurm's PMI-2 server in slurmstepd.
MpiDefault=pmi2
# Schedule on every submission (no backfill interval to wait for).
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node may announce more CPUs than it has (SLURM_LOCAL_CPUS).
SlurmdParameters=config_overrides
ReturnToService=2
FirstJobId=$first_job
# A cancelled job's processes get SIGKILL 2 s after SIGTERM (default 30 s).
KillWait=2
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1024 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  rm -f "$dir"/{munged,slurmctld,slurmd}.pid
  # --force: munged would refuse a socket under a private parent (a 0700 temporary folder);
  # here only the calling user talks to it.
  munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" \
    || { log_tail "$dir/munged.log"; cmd_down "$dir"; echo "$PROG: munged did not start" >&2; exit 1; }
  slurmctld -f "$dir/slurm.conf" \
    || { log_tail "$dir/slurmctld.log"; cmd_down "$dir"; echo "$PROG: slurmctld did not start" >&2; exit 1; }
  slurmd -f "$dir/slurm.conf" -N "$host" \
    || { log_tail "$dir/slurmd.log"; cmd_down "$dir"; echo "$PROG: slurmd did not start" >&2; exit 1; }
  local t0=$SECONDS state=""
  while [ $((SECONDS - t0)) -lt "$wait_s" ]; do
    state="$(slurm_env "$dir" sinfo --noheader --format=%T 2>/dev/null || true)"
    [ "$state" = idle ] && break
    sleep 0.2
  done
  if [ "$state" != idle ]; then
    log_tail "$dir/slurmctld.log" "$dir/slurmd.log"
    cmd_down "$dir"
    echo "$PROG: node not idle after ${wait_s} s (state: ${state:-none})" >&2
    exit 1
  fi
  echo "export SLURM_CONF=$dir/slurm.conf"
}

[ $# -ge 1 ] || usage
case "$1" in
  install) [ $# -eq 1 ] || usage; cmd_install ;;
  up) [ $# -eq 2 ] || usage; cmd_up "$2" ;;
  down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
  status) [ $# -eq 2 ] || usage; cmd_status "$2" ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) usage ;;
esac
