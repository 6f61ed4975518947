"""Every phase of a FedPC job crossed with every fault (launch/bench/faults.py runs the jobs).

For each cell: the job ends within ``--liveness`` + 5 s of the fault, with a non-zero exit code
and one ``mpifc:`` line, naming the faulting rank; no model or ledger sits at its final path, no partial file
beside it, and no process of the job (ranks, stopped ones included, and the node sentinel,
checked by their process ids) is left. The cells run three jobs at a time on tiny shards.
"""
from __future__ import annotations

import pytest

from tests.script_util import load_script

pytestmark = pytest.mark.mpi
bench = load_script("launch/bench/faults.py", "faults_bench")
LIVENESS = 3.0


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    cells = bench.run_matrix(tmp_path_factory.mktemp("faults"), LIVENESS, parallel=3)
    return {(c.phase, c.fault): c for c in cells}


@pytest.mark.parametrize("fault", list(bench.FAULTS))
@pytest.mark.parametrize("phase", bench.PHASES)
def test_fault_ends_the_job_naming_the_rank_and_leaves_nothing(matrix, phase, fault):
    c = matrix[(phase, fault)]
    assert c.injected, f"the fault was never injected: {c}"
    assert c.exit not in (0, None), c
    assert c.seconds <= LIVENESS + 5.0, c
    assert c.named, f"no line names rank {c.rank}: {c.line!r}"
    assert c.lines == 1, f"{c.lines} lines start with 'mpifc:'"
    assert not c.leftovers, c.leftovers


def test_named_in_reads_the_rank_lines():
    assert bench.named_in("x\nmpifc: rank 2 stopped answering in phase 'learn' (...)\n", 2)[0]
    assert bench.named_in("mpifc: rank 2: RuntimeError: boom", 2)[0]
    assert bench.named_in("mpifc: ranks 0, 2 ended without a word", 2)[0]
    assert not bench.named_in("mpifc: rank 0 stopped answering (seen by rank 2)", 2)[0]
    assert not bench.named_in("mpifc: rank 12 stopped answering", 2)[0]
