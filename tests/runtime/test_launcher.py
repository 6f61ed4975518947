"""Launcher/MPI mismatch detection from the environment (pure function, no MPI job)."""
from __future__ import annotations

import pytest

from mpifc.errors import UserError
from mpifc.runtime.launcher import check_launcher_matches, launcher_size


@pytest.mark.parametrize("var", ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"])
def test_size_above_one_with_world_of_one_is_an_error(var):
    with pytest.raises(UserError, match=f"{var}=4.*MPI sees 1"):
        check_launcher_matches(1, {var: "4"})


def test_matching_or_absent_launcher_is_fine():
    check_launcher_matches(4, {"PMI_SIZE": "4"})
    check_launcher_matches(1, {"PMI_SIZE": "1"})
    check_launcher_matches(1, {})
    assert launcher_size({"PMI_SIZE": "junk", "OMPI_COMM_WORLD_SIZE": "2"}) == ("OMPI_COMM_WORLD_SIZE", 2)


def test_a_one_node_job_under_the_bundled_mpich_gets_the_one_node_settings(tmp_path):
    from mpifc.runtime.launcher import BUNDLED_LIBFABRIC, ONE_NODE_MPICH, tune_one_node_mpich

    venv = tmp_path / "venv"
    (venv / BUNDLED_LIBFABRIC).parent.mkdir(parents=True)
    (venv / BUNDLED_LIBFABRIC).touch()
    one_node = {"PMI_SIZE": "8", "MPI_LOCALNRANKS": "8"}
    env = dict(one_node)
    assert tune_one_node_mpich(env, str(venv)) == ONE_NODE_MPICH and env == {**one_node, **ONE_NODE_MPICH}
    cells = "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS"
    env = {**one_node, cells: "64"}  # the user's own choice stays
    assert cells not in tune_one_node_mpich(env, str(venv)) and env[cells] == "64"
    # Left alone: another MPI library, several nodes, one rank, no launcher, a site MPI.
    for env, prefix in (({**one_node, "MPI4PY_LIBMPI": "/opt/mpi/lib/libmpi.so"}, venv),
                        ({"PMI_SIZE": "16", "MPI_LOCALNRANKS": "8"}, venv),
                        ({"PMI_SIZE": "1", "MPI_LOCALNRANKS": "1"}, venv),
                        ({}, venv),
                        (dict(one_node), tmp_path / "site")):
        before = dict(env)
        assert tune_one_node_mpich(env, str(prefix)) == {} and env == before
