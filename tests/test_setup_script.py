"""``source launch/setup.sh`` in a user's interactive shell changes nothing there but PATH,
``MPIFC_ROOT`` and ``MPIFC_VENV``: no shell option (``set -e`` would close the terminal at the
next failing command), variable, function, trap or working directory, whether the set-up works
or fails.

The shells run the real script against a stand-in venv whose ``python`` accepts every call (or
fails every call), so no package is installed and no network is needed.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "launch" / "setup.sh"

# What the shell itself changes between two looks (counters, the last command, call stacks).
VOLATILE = {"_", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "BASH_COMMAND", "BASH_LINENO", "BASH_SOURCE",
            "BASH_SUBSHELL", "BASHPID", "EPOCHREALTIME", "EPOCHSECONDS", "FUNCNAME", "HISTCMD", "LINENO",
            "PIPESTATUS", "RANDOM", "SECONDS", "SRANDOM", "BASH_REMATCH"}
ALLOWED = {"PATH", "MPIFC_ROOT", "MPIFC_VENV"}
LOOK = ("{ set -o; shopt; trap -p; declare -F; pwd; umask; echo \"status=$?\"; declare -p; } > %s 2>&1")


def fake_venv(tmp: Path, works: bool) -> Path:
    venv = tmp / ("venv-ok" if works else "venv-broken")
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\nexit %d\n" % (0 if works else 1))
    py.chmod(0o755)
    return venv


def shell_state(path: Path) -> dict[str, str]:
    """The saved look, as ``{key: line}``: options, traps, functions, cwd, umask, and one entry
    per variable (volatile ones left out)."""
    out = {}
    for i, line in enumerate(path.read_text().splitlines()):
        if line.startswith("declare "):
            name = line.split(" ", 2)[2].split("=", 1)[0]
            if name in VOLATILE:
                continue
            out[f"var {name}"] = line
        else:
            out[f"line {i}"] = line
    return out


def run_interactive(script: str, venv: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPIFC_")}
    env.update(MPIFC_VENV=str(venv), HOME=str(cwd))  # no user's ~/.bashrc
    return subprocess.run(["bash", "-ic", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("works", [True, False], ids=["set-up works", "set-up fails"])
def test_sourcing_changes_only_path_and_the_venv_variables(tmp_path, works):
    venv = fake_venv(tmp_path, works)
    before, after = tmp_path / "before", tmp_path / "after"
    script = (f"{LOOK % before}; source {SETUP}; echo \"sourced=$?\"; false; echo alive; "
              f"{LOOK % after}; echo \"PATH=$PATH\"")
    r = run_interactive(script, venv, tmp_path)
    assert "alive" in r.stdout.splitlines(), r.stdout + r.stderr  # a failing command did not end the shell
    assert ("sourced=0" in r.stdout.splitlines()) == works, r.stdout + r.stderr
    a, b = shell_state(before), shell_state(after)
    changed = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert changed <= {f"var {n}" for n in ALLOWED} | {"var before", "var after"}, \
        {k: (a.get(k), b.get(k)) for k in changed}
    path = next(line for line in r.stdout.splitlines() if line.startswith("PATH="))[5:].split(":")
    if works:
        assert path[0] == str(venv / "bin") and (venv / ".mpifc-stamp").is_file()
    else:
        assert str(venv / "bin") not in path  # a failed set-up puts nothing on PATH


def test_sourcing_twice_puts_the_venv_on_path_once(tmp_path):
    venv = fake_venv(tmp_path, True)
    r = run_interactive(f"source {SETUP}; source {SETUP}; echo \"PATH=$PATH\"", venv, tmp_path)
    path = next(line for line in r.stdout.splitlines() if line.startswith("PATH="))[5:].split(":")
    assert path.count(str(venv / "bin")) == 1, r.stdout + r.stderr


def test_running_it_changes_nothing_and_reports_failure(tmp_path):
    venv = fake_venv(tmp_path, False)
    r = run_interactive(f"bash {SETUP}; echo \"ran=$?\"", venv, tmp_path)
    assert "ran=0" not in r.stdout and "ran=" in r.stdout, r.stdout + r.stderr
