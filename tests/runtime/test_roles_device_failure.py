"""Roles, device choice and error reporting, in one process."""
from __future__ import annotations

import pytest

from mpifc.errors import UserError
from mpifc.runtime.failure import error_line, exit_code_for
from mpifc.runtime.roles import Roles


def test_default_roles_rank0_server():
    r = Roles.build(4)
    assert r.servers == (0,) and r.clients == (1, 2, 3) and r.coordinator == 0
    assert r.role_of(0) == "server" and r.role_of(3) == "client"


def test_several_servers_and_too_few_ranks():
    r = Roles.build(5, servers=2, min_clients=3)
    assert r.servers == (0, 1) and r.clients == (2, 3, 4)
    assert Roles.build(4, servers=[3, 0]).servers == (0, 3)
    with pytest.raises(UserError, match=r"too few ranks: this job needs 5 \(2 server\(s\) \+ 3 client\(s\)\) "
                                        r"but mpiexec started 4; run with mpiexec -n 5"):
        Roles.build(4, servers=2, min_clients=3)
    with pytest.raises(UserError, match=r"server rank\(s\) \[7\] outside this job's ranks 0..3"):
        Roles.build(4, servers=(0, 7))


def test_device_choice_and_bad_override():
    torch = pytest.importorskip("torch")
    from mpifc.runtime.device import select_device

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert select_device(5, None) == (torch.device(f"cuda:{5 % n}") if n else torch.device("cpu"))
    assert select_device(1, "cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="--device 'tpu'"):
        select_device(0, "tpu")
    if n == 0:
        with pytest.raises(UserError, match="CUDA is not available"):
            select_device(0, "cuda:0")


def test_error_lines_and_exit_codes():
    assert error_line(UserError("config file a.toml: key x:\n unknown"), 3) == \
        "mpifc: rank 3: UserError: config file a.toml: key x: unknown"
    assert error_line(ValueError("boom"), None) == "mpifc: ValueError: boom"
    assert exit_code_for(UserError("x")) == 2
    assert exit_code_for(ValueError("x")) == 1
    assert exit_code_for(KeyboardInterrupt()) == 130
    assert exit_code_for(SystemExit(4)) == 4
