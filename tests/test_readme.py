"""README's quickstart and "your own table" run as written.

Every fenced block right after a ``<!-- tested -->`` line of README.md runs with bash in a fresh
folder holding a copy of ``examples/``, with the venv's binaries (``mpifc``, ``mpiexec``,
``python``) first on PATH and real ``mpiexec`` jobs.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- tested -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*\n```(?:bash|sh)?\n(.*?)\n```", re.DOTALL)
TIMEOUT_S = 600


def tested_blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))


def test_readme_marks_its_tested_blocks():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert text.count(MARK) == len(tested_blocks()) >= 2, "every <!-- tested --> mark must precede a fenced block"


def _first_words(block: str) -> str:
    return block.strip().splitlines()[0][:60]


@pytest.mark.parametrize("block", tested_blocks(), ids=_first_words)
def test_readme_block_runs(block: str, tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"README block timed out after {TIMEOUT_S} s:\n{block}\n--- output ---\n{out[-3000:]}")
    assert proc.returncode == 0, f"README block failed (exit {proc.returncode}):\n{block}\n--- output ---\n{out[-3000:]}"
    # Every file the block names after --out, --model, --ledger exists and is not empty.
    for flag, name in re.findall(r"--(out|model|ledger) (\S+)", block):
        path = tmp_path / name
        assert path.exists(), f"{flag} {name}: not written"
        if path.is_file():
            assert path.stat().st_size > 0, f"{flag} {name}: empty"
