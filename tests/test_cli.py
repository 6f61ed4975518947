"""The mpifc CLI and its TOML config: keys mirror flags, flags win, bad input is exit code 2."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpifc.cli import COMMANDS, build_parser, parse_args, resolve_handler
from mpifc.errors import UserError
from tests.mpi_util import REPO


def write(tmp_path, text: str):
    p = tmp_path / "mpifc.toml"
    p.write_text(text)
    return p


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "mpifc", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def test_file_values_apply_and_flags_override(tmp_path):
    cfg = write(tmp_path, 'deadline = 7\ndevice = "cpu"\n[train]\nseed = 3\nledger = "l.csv"\n'
                          'model = "m.h5"\ndeadline = 9\n')
    a = parse_args(["train", "DIR", "--config", str(cfg)])
    assert (a.seed, a.ledger, a.model, a.deadline) == (3, "l.csv", "m.h5", 9.0)  # section beats top level
    b = parse_args(["train", "DIR", "--config", str(cfg), "--seed", "5", "--deadline", "1.5"])
    assert (b.seed, b.deadline, b.ledger) == (5, 1.5, "l.csv")
    c = parse_args(["info", "--config", str(cfg)])
    assert (c.deadline, c.device) == (7.0, "cpu")  # top level reaches every subcommand with the flag
    assert parse_args(["train", "DIR", "--model", "m.h5"]).seed == 0  # no file: argparse defaults


@pytest.mark.parametrize("text, message", [
    ("epochz = 3\n", r"key epochz: unknown key"),
    ("[train]\nsed = 3\n", r"key \[train\]\.sed: unknown key \(not a flag of mpifc train\)"),
    ("[trian]\nseed = 3\n", r"unknown section \[trian\]"),
    ('deadline = "soon"\n', r"key deadline: expected a number, got 'soon'"),
    ("[train]\nseed = 2.5\n", r"key \[train\]\.seed: expected an integer, got 2\.5"),
    ("[train]\nseed = true\n", r"key \[train\]\.seed: expected an integer, got True"),
    ("[evaluate]\nmodel = 3\n", r"key \[evaluate\]\.model: expected a string, got 3"),
    ("deadline = [1, 2]\n", r"key deadline: expected a single value"),
    ("seed = = 3\n", r"not valid TOML"),
])
def test_bad_config_is_a_user_error_naming_file_and_key(tmp_path, text, message):
    cfg = write(tmp_path, text)
    with pytest.raises(UserError, match=message) as e:
        parse_args(["train", "--config", str(cfg)])
    assert str(cfg) in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        parse_args(["info", "--config", str(tmp_path / "nope.toml")])


def test_bad_config_from_the_command_line_is_one_line_and_exit_2(tmp_path):
    cfg = write(tmp_path, "[train]\nbatch_sise = 3\n")
    r = run_cli("info", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"mpifc: UserError: config file {cfg}: key [train].batch_sise: unknown key (not a flag of mpifc train)"]


def test_unknown_experiment_is_one_line_and_exit_2():
    r = run_cli("experiment", "no_such_table")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "no_such_table" in r.stderr


def test_unknown_benchmark_is_exit_2_and_lists_the_known_ones():
    r = run_cli("bench", "no_such_bench")
    assert r.returncode == 2
    assert "no benchmark 'no_such_bench'" in r.stderr and "transport" in r.stderr


def test_every_subcommand_has_a_resolvable_handler():
    _, subs = build_parser()
    assert set(subs) == set(COMMANDS) == {"info", "train", "evaluate", "query", "baseline", "bench", "experiment"}
    for name in COMMANDS:
        assert callable(resolve_handler(name))


def test_argparse_errors_keep_exit_code_2():
    r = run_cli("train", "--seed", "abc")
    assert r.returncode == 2 and "invalid int value" in r.stderr


def add_required_model_arguments(p):
    """Flags of a stand-in subcommand with a required flag (as real ones have)."""
    p.add_argument("--model", required=True)
    p.add_argument("--epochs", type=int, default=1)


def test_a_plugged_in_command_takes_required_flags_from_the_file(tmp_path, monkeypatch):
    import mpifc.cli as cli

    monkeypatch.setitem(cli.COMMANDS, "train", cli.Command("t", "mpifc.cli:not_yet_available",
                                                            "tests.test_cli:add_required_model_arguments"))
    cfg = write(tmp_path, '[train]\nmodel = "m.h5"\nepochs = 4\n')
    a = parse_args(["train", "--config", str(cfg)])
    assert (a.model, a.epochs) == ("m.h5", 4)
    assert parse_args(["train", "--config", str(cfg), "--model", "x.h5"]).model == "x.h5"
    with pytest.raises(SystemExit) as e:  # without the file the flag is still required
        parse_args(["train", "--epochs", "2"])
    assert e.value.code == 2


@pytest.mark.mpi
def test_bad_config_under_mpiexec_is_reported_once(tmp_path):
    from tests.mpi_util import run_mpi

    cfg = write(tmp_path, "dedline = 3\n")
    r = run_mpi(3, ["-m", "mpifc", "info", "--config", str(cfg)], timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"mpifc: rank 0: UserError: config file {cfg}: key dedline: unknown key (not a flag of any subcommand)"]
