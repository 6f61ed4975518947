"""Every config in examples/ is read by ``--config`` and its job runs and writes its outputs.

Each experiment config runs with ``--quick`` (its smoke-test counterpart); the own-table config
runs as it is, on the small ``examples/patients.csv``. Jobs run in a fresh folder with a copy of
``examples/`` and real ``mpiexec``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TIMEOUT_S = 900

# config -> the commands of its quick counterpart, and the files they must write.
QUICK = {
    "own-table.toml": (
        [["python", "-m", "data_prep", "--dataset", "csv", "--path", "examples/patients.csv", "--target",
          "readmitted", "--setting", "vertical", "--clients", "2", "--out", "results/patients/shards"],
         ["mpiexec", "-n", "3", "mpifc", "train", "results/patients/shards", "--config", "examples/own-table.toml"],
         ["mpifc", "query", "results/patients/fc.h5", "--config", "examples/own-table.toml"]],
        ["results/patients/fc.h5", "results/patients/ledger.csv", "results/patients/answers.csv",
         "results/patients/shards/schema.json"]),
    "commcost.toml": (
        [["mpifc", "experiment", "commcost", "--config", "examples/commcost.toml", "--quick"]],
        ["results/commcost/commcost.md", "results/commcost/commcost.png", "results/commcost/summary.csv"]),
    "table7.toml": (
        [["mpifc", "experiment", "table7", "--config", "examples/table7.toml", "--quick"]],
        ["results/table7/table7.md", "results/table7/table7.png", "results/table7/summary.csv"]),
    "scaling.toml": (
        [["mpifc", "experiment", "scaling", "--config", "examples/scaling.toml", "--quick", "--ranks", "2,3",
          "--out", "results/scaling"]],
        ["results/scaling/scaling.md", "results/scaling/scaling.png"]),
}


def test_every_example_config_has_a_quick_run():
    assert sorted(p.name for p in EXAMPLES.glob("*.toml")) == sorted(QUICK)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_example_config_is_valid(name: str) -> None:
    from mpifc.cli import build_parser
    from mpifc.cli.config import config_defaults

    _, subs = build_parser()
    data = tomllib.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    commands = [k for k, v in data.items() if isinstance(v, dict)] or ["train"]
    for command in commands:
        config_defaults(EXAMPLES / name, {k: v for k, v in subs.items() if k not in ("bench", "baseline")}, command)


def test_schema_example_in_usercsv_parses():
    import data_prep.usercsv as usercsv

    doc = usercsv.__doc__
    start = doc.index('{"columns"')
    end = doc.index("}", doc.index('"missing"')) + 1
    schema = json.loads(doc[start:end])
    assert schema["target"] == "label"


def _run(cmd: list[str], cwd: Path) -> str:
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)}: timed out after {TIMEOUT_S} s\n{out[-3000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}\n{out[-3000:]}"
    return out


@pytest.mark.parametrize("name", ["own-table.toml"])
def test_example_runs_quick(name: str, tmp_path: Path) -> None:
    """The user's own-table config, run as the README runs it. The experiment configs are
    checked against the commands' flags above (``test_example_config_is_valid``), and their
    experiments run quick in ``tests/experiments`` (table7, commcost, scaling)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    commands, outputs = QUICK[name]
    for cmd in commands:
        _run([c.replace("{tmp}", str(tmp_path)) for c in cmd], tmp_path)
    for rel in outputs:
        path = tmp_path / rel
        assert path.is_file() and path.stat().st_size > 0, f"{name}: {rel} not written"
