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
import subprocess
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


def test_named_in_reads_the_lines():
    assert bench.named_in("x\nmpifc: rank 2 stopped answering in phase 'learn' (...)\n", "rank 2")[0]
    assert bench.named_in("mpifc: rank 2: RuntimeError: boom", "rank 2")[0]
    assert bench.named_in("mpifc: ranks 0, 2 ended without a word", "rank 2")[0]
    assert not bench.named_in("mpifc: rank 0 stopped answering (seen by rank 2)", "rank 2")[0]
    assert not bench.named_in("mpifc: rank 12 stopped answering", "rank 2")[0]
    assert bench.named_in("mpifc: the launcher's mpiexec (pid 7) ended while the job ran", "mpiexec")[0]
    assert bench.named_in("mpifc: interrupted (SIGINT to the whole job, e.g. Ctrl-C); ending the job", "mpiexec")[0]
    assert not bench.named_in("mpifc: rank 1 received SIGINT; ending the job", "mpiexec")[0]
