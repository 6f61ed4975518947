"""README's quickstart and "your own table" run as written, leave the repository clean, and
every figure the README quotes is checked.

Every fenced block right after a ``<!-- tested NAME -->`` line of README.md runs with bash, in
README order, in a scratch git repository holding the project's ``.gitignore`` and a copy of
``examples/``, with the venv's binaries (``mpifc``, ``mpiexec``, ``python``) first on PATH and real
``mpiexec`` jobs. Afterwards ``git status`` must show the tree clean: the blocks write only under
``results/``. Figures tagged ``test:KEY`` (``launch/figures.py``) are measured here from the
blocks' own outputs; ``bench:KEY`` figures (times) belong to ``launch/bench/readme.py``, and
this test checks that the benchmark knows each of them.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.script_util import load_script

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
MARK = re.compile(r"<!-- tested ([\w-]+) -->")
BLOCK = re.compile(r"<!-- tested ([\w-]+) -->\s*\n```(?:bash|sh)?\n(.*?)\n```", re.DOTALL)
TIMEOUT_S = 600

figures = load_script("launch/figures.py", "readme_figures")


def readme_blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(README)


def test_readme_marks_its_readme_blocks():
    names = [n for n, _ in readme_blocks()]
    assert len(MARK.findall(README)) == len(names) >= 2, "every <!-- tested NAME --> mark must precede a fenced block"
    assert len(set(names)) == len(names), "block names must be unique"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Any]:
    """Every tested block run in order in one scratch repository: ``{"dir", "outputs": {name: text},
    "codes": {name: exit code}, "status": git status after all blocks}``."""
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "examples", d / "examples")
    shutil.copy(REPO / ".gitignore", d / ".gitignore")
    _git(d, "init", "-q")
    _git(d, "add", "-A")
    _git(d, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "examples")
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1")
    outputs, codes = {}, {}
    for name, block in readme_blocks():
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], cwd=d, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n[timed out after {TIMEOUT_S} s]"
        outputs[name], codes[name] = out, proc.returncode
    return {"dir": d, "outputs": outputs, "codes": codes, "status": _git(d, "status", "--porcelain", "--untracked-files=all")}


@pytest.mark.mpi
@pytest.mark.parametrize("name, block", readme_blocks(), ids=[n for n, _ in readme_blocks()])
def test_readme_block_runs(ran, name: str, block: str) -> None:
    assert ran["codes"][name] == 0, f"README block {name} failed (exit {ran['codes'][name]}):\n{block}\n" \
                                    f"--- output ---\n{ran['outputs'][name][-3000:]}"
    # Every file the block names after --out, --model, --ledger exists and is not empty.
    for flag, path in re.findall(r"--(out|model|ledger) (\S+)", block):
        p = ran["dir"] / path
        assert p.exists(), f"{flag} {path}: not written"
        if p.is_file():
            assert p.stat().st_size > 0, f"{flag} {path}: empty"


@pytest.mark.mpi
def test_readme_blocks_leave_the_tree_clean(ran):
    assert all(code == 0 for code in ran["codes"].values())
    assert ran["status"] == "", f"README blocks left files git would add:\n{ran['status']}"


# -- figures -------------------------------------------------------------------------------------
def _ledger(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _evaluate_line(out: str, what: str) -> float:
    m = re.search(r"accuracy\s+([\d.]+)\s+macro F1\s+([\d.]+)", out)
    assert m, f"no accuracy line in:\n{out[-2000:]}"
    return float(m[1] if what == "accuracy" else m[2])


def _payload_kb(path: Path, phases: set[str] | None = None) -> float:
    return sum(int(r["payload_bytes"]) for r in _ledger(path) if phases is None or r["phase"] in phases) / 1e3


MEASURED: dict[str, Callable[[dict[str, Any]], float]] = {
    "quickstart.train_kB": lambda r: sum(int(x["payload_bytes"]) + int(x["header_bytes"])
                                         for x in _ledger(r["dir"] / "results/quickstart/train.csv")) / 1e3,
    "quickstart.train_messages": lambda r: float(len(_ledger(r["dir"] / "results/quickstart/train.csv"))),
    "quickstart.accuracy": lambda r: _evaluate_line(r["outputs"]["quickstart"], "accuracy"),
    "quickstart.f1_macro": lambda r: _evaluate_line(r["outputs"]["quickstart"], "f1"),
    "patients.rows": lambda r: float(len(_ledger(r["dir"] / "examples/patients.csv"))),
    "patients.payload_kB": lambda r: _payload_kb(r["dir"] / "results/patients/ledger.csv"),
    "patients.one_pass_kB": lambda r: _payload_kb(r["dir"] / "results/patients/ledger.csv",
                                                  {"declare", "learn", "gather"}),
    "patients.em_kB": lambda r: _payload_kb(r["dir"] / "results/patients/ledger.csv", {"em"}),
}
"""How this test measures each ``test:KEY`` figure of the README from the blocks' outputs."""


def test_every_measured_figure_of_the_readme_is_tagged():
    assert figures.untagged(README) == []


def test_every_tag_has_its_checker():
    bench = load_script("launch/bench/readme.py", "readme_bench")
    for fig in figures.figures(README):
        known = MEASURED if fig.checker == "test" else bench.MEASURED
        assert fig.key in known, f"{fig.checker}:{fig.key} (README line {fig.line}) is measured by nobody"


@pytest.mark.mpi
@pytest.mark.parametrize("fig", [f for f in figures.figures(README) if f.checker == "test"],
                         ids=lambda f: f.key)
def test_readme_figure_holds(ran, fig):
    assert all(code == 0 for code in ran["codes"].values())
    measured = MEASURED[fig.key](ran)
    assert fig.allows(measured), fig.describe(measured)


def test_own_table_config_holds_the_blocks_flags():
    """``examples/own-table.toml`` gives the train and query flags of the "your own table" block."""
    cfg = tomllib.loads((REPO / "examples" / "own-table.toml").read_text())
    block = dict(readme_blocks())["patients"]
    train = next(line for line in block.splitlines() if " mpifc train " in line)
    query = next(line for line in block.splitlines() if "mpifc query" in line and "--distributed" not in line)
    for key, value in cfg["train"].items():
        assert f"--{key} {value}" in train, (key, value)
    for key, value in cfg["query"].items():
        assert f"--{key} {value}" in query, (key, value)


def test_the_checker_reads_tags_and_finds_untagged_figures():
    text = "takes 75 s<!-- fig bench:x_s ±20% --> and 0.96 accuracy, 12 messages (default 300 s)"
    [fig] = figures.figures(text)
    assert (fig.value, fig.key, fig.checker, fig.tol, fig.relative) == (75.0, "x_s", "bench", 20.0, True)
    assert fig.allows(89.9) and not fig.allows(90.1)
    assert [u.split(": ", 1)[1].split(" in ")[0] for u in figures.untagged(text)] == ["'0.96'", "'12 messages'"]
    [bound] = figures.figures("at least ≥ 900 s<!-- fig bench:y_s ±10% -->")
    assert bound.bound == "≥" and bound.allows(5000) and bound.allows(811) and not bound.allows(809)
