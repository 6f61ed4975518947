"""A sample of the fault matrix of launch/bench/faults.py (which runs every job, process, signal
and moment): signals from outside to a rank, to ``mpiexec`` and to its daemon, and faults
injected inside a rank.

For each cell: the job ends within ``--liveness`` + 5 s of the fault with one ``mpifc:`` line
naming the right process (a rank, or the launcher, or the whole job for a Ctrl-C), a non-zero
exit code (130 for SIGINT to mpiexec); no output at its final path nor partial file beside it,
no shared-memory file of the job's MPI, no node folder and no process of the job is left.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.mpi_util import REPO
from tests.script_util import load_script

pytestmark = pytest.mark.mpi
bench = load_script("launch/bench/faults.py", "faults_bench")
LIVENESS = 3.0
# The sample's moments are events of the job (MPI up, a phase, outputs in place), not fractions
# of its time: no clean runs are needed to place them.
DURATIONS = {"train": 4.0, "evaluate": 4.0, "query": 4.0}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def matrix(work):
    cells = bench.run_cells(bench.sample_specs(), work, LIVENESS, parallel=3, durations=DURATIONS)
    return {(c.job, c.target, c.fault, c.moment): c for c in cells}


@pytest.mark.parametrize("spec", bench.sample_specs(), ids=lambda s: "-".join(s).replace(" ", ""))
def test_fault_ends_the_job_naming_the_process_and_leaves_nothing(matrix, spec):
    c = matrix[spec]
    assert c.injected and not c.missed, f"the fault was never injected: {c}"
    assert c.seconds <= LIVENESS + 5.0, c
    if c.unwatched:  # a rank ended before the node sentinel's first look: nobody saw it go first
        assert c.ok, c
        return
    assert c.exit not in (0, None), c
    assert c.named, f"the line does not name {c.target}: {c.line!r}"
    assert c.lines == 1, f"{c.lines} lines start with 'mpifc:'"
    assert not c.leftovers, c.leftovers
    # One exit code for the whole job, the line's: never the signal of a rank the launcher
    # killed because another left first (9).
    expected = {"INT": 130, "TERM": 143}.get(c.fault, 1 if c.fault.endswith("raise") else None)
    if expected is not None:
        assert c.exit == expected, c


def test_a_killed_sentinel_leaves_no_node_folder(work):
    """The job goes on without its node sentinel (its heartbeats still watch it); its ranks
    remove the node folder as they end."""
    files = bench.prepare(work, LIVENESS)
    out = work / "no-sentinel"
    out.mkdir()
    cmd, finals = bench.job_command("evaluate", files, out, LIVENESS)
    log = out / "log"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=bench._env({"MPIFC_FAULT_LOG": str(log)}), start_new_session=True)
    procs = bench.JobProcesses(proc.pid)
    until = time.monotonic() + 60
    while not list(log.glob("sentinel-*.pid")) and proc.poll() is None and time.monotonic() < until:
        procs.refresh()
        time.sleep(0.01)
    os.kill(int(next(log.glob("sentinel-*.pid")).read_text()), signal.SIGKILL)
    procs.refresh()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert all(p.exists() for p in finals), err
    folder = procs.folder()
    assert folder is not None, "the job's daemon was not found"
    until = time.monotonic() + 60  # the last rank removes it as it exits (seconds; load may slow it)
    while folder.exists() and time.monotonic() < until:
        time.sleep(0.05)
    assert not folder.exists(), sorted(p.name for p in folder.iterdir())


def _rank_env(pmi: socket.socket, control: socket.socket | None = None, size: int = 1) -> dict[str, str]:
    """The environment hydra gives a rank of a one-node job: its rank, the node's rank count, its
    PMI socket and (leaked) the daemon's own control socket."""
    env = bench._env({"PMI_RANK": "0", "PMI_SIZE": str(size), "MPI_LOCALNRANKS": str(size),
                      "PMI_FD": str(pmi.fileno())})
    if control is not None:
        env["HYDI_CONTROL_FD"] = str(control.fileno())
    return env


def test_a_rank_lets_go_of_the_daemons_control_socket_as_it_starts():
    """hydra leaves its daemon's control socket open in every rank; ``mpiexec`` sees the daemon
    die only once no process holds it. The command's first line closes the rank's copy."""
    daemon_end, mpiexec_end = socket.socketpair()
    pmi_rank, pmi_daemon = socket.socketpair()
    script = ("import os, sys; from mpifc.runtime import early; early.take(sys.argv[1:], 10.0); "
              "print(os.environ.get('HYDI_CONTROL_FD')); sys.stdout.flush(); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=REPO, env=_rank_env(pmi_rank, daemon_end),
                            pass_fds=(pmi_rank.fileno(), daemon_end.fileno()))
    daemon_end.close()
    pmi_rank.close()
    try:
        assert proc.stdout.readline().strip() == "None"  # the variable is gone with the socket
        mpiexec_end.settimeout(60)
        assert mpiexec_end.recv(1) == b"" and proc.poll() is None  # closed by the live rank
    finally:
        proc.communicate(timeout=60)
        mpiexec_end.close()
        pmi_daemon.close()
    assert proc.returncode == 0


def test_a_rank_whose_daemon_is_gone_ends_at_once_without_a_word():
    """A rank that starts after its launcher daemon was killed (its PMI socket has hung up) ends
    before its imports, quietly: ``mpiexec`` has reported the failure, and nobody reads the rank."""
    pmi_rank, pmi_daemon = socket.socketpair()
    pmi_daemon.close()
    proc = subprocess.run([sys.executable, "-m", "mpifc", "info"], capture_output=True, text=True, cwd=REPO,
                          env=_rank_env(pmi_rank, size=3), pass_fds=(pmi_rank.fileno(),), timeout=120)
    pmi_rank.close()
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "")


def test_named_in_reads_the_lines():
    assert bench.named_in("x\nmpifc: rank 2 stopped answering in phase 'learn' (...)\n", "rank 2")[0]
    assert bench.named_in("mpifc: rank 2: RuntimeError: boom", "rank 2")[0]
    assert bench.named_in("mpifc: ranks 0, 2 ended without a word", "rank 2")[0]
    assert not bench.named_in("mpifc: rank 0 stopped answering (seen by rank 2)", "rank 2")[0]
    assert not bench.named_in("mpifc: rank 12 stopped answering", "rank 2")[0]
    assert bench.named_in("mpifc: the launcher's mpiexec (pid 7) ended while the job ran", "mpiexec")[0]
    assert bench.named_in("mpifc: interrupted (SIGINT to the whole job, e.g. Ctrl-C); ending the job", "mpiexec")[0]
    assert not bench.named_in("mpifc: rank 1 received SIGINT; ending the job", "mpiexec")[0]
