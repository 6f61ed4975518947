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
