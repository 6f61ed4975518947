"""The Slurm template and the sweep driver's generated scripts, as text (tests/slurm/ runs them)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.script_util import load_script

SLURM = Path(__file__).resolve().parents[2] / "launch" / "slurm"


@pytest.fixture(scope="module")
def submit():
    return load_script("launch/slurm/submit_sweep.py", "submit_sweep")


def bash_n(path: Path) -> None:
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_template_is_valid_bash_with_one_task_per_rank_and_no_gpu_request():
    bash_n(SLURM / "fedpc.sbatch")
    text = (SLURM / "fedpc.sbatch").read_text()
    assert "#SBATCH --ntasks=" in text and "launch/sweep.py" in text
    # CPU-only partitions (no GRES) reject a GPU request: GPUs are asked for on the command line.
    assert not any(line.startswith(("#SBATCH --gpus", "#SBATCH --gres")) for line in text.splitlines())
    assert "--gpus-per-task=1" in text  # documented in the header


def test_rendered_script(submit, tmp_path):
    text = submit.render((SLURM / "fedpc.sbatch").read_text(), 16, out="res/sc", partition="gpu",
                         gpus_per_task=1, extra_args="--assign tree --servers 2")
    lines = text.splitlines()
    assert "#SBATCH --ntasks=16" in lines and "#SBATCH --gpus-per-task=1" in lines
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --job-name=mpifc-fedpc-r16" in lines
    assert sum(line.startswith("#SBATCH --ntasks=") for line in lines) == 1
    assert "RANKS=16" in lines and "EXTRA_ARGS='--assign tree --servers 2'" in lines
    # every #SBATCH line precedes the first command, or sbatch ignores it
    first_cmd = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) < first_cmd
    p = tmp_path / "r16.sbatch"
    p.write_text(text)
    bash_n(p)
    cpu = submit.render((SLURM / "fedpc.sbatch").read_text(), 4, out="x")
    assert not any(line.startswith("#SBATCH --gpus-per-task") for line in cpu.splitlines())
    with pytest.raises(ValueError):
        submit.render("", 1, out="x")


def test_dry_run_writes_one_script_per_rank_count(submit, tmp_path, capsys):
    assert submit.main(["--ranks", "2,4,8", "--out", str(tmp_path), "--dry-run"]) == 0
    written = sorted(p.name for p in (tmp_path / "slurm").glob("*.sbatch"))
    assert written == ["fedpc-r2.sbatch", "fedpc-r4.sbatch", "fedpc-r8.sbatch"]
    for p in (tmp_path / "slurm").glob("*.sbatch"):
        bash_n(p)
    assert submit.main(["--ranks", "1,4", "--out", str(tmp_path), "--dry-run"]) == 2
    assert submit.main(["--ranks", "2", "--gpus-per-task", "-1", "--out", str(tmp_path), "--dry-run"]) == 2


def test_missing_sbatch_is_one_line_exit_2(submit, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH, so no sbatch
    assert submit.main(["--ranks", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("submit_sweep: no sbatch on PATH") and "\n" not in err


def test_local_cluster_script_usage_is_one_line_exit_2(tmp_path):
    script = SLURM / "local-cluster.sh"
    bash_n(script)
    for args in ([], ["start"], ["up"], ["down", str(tmp_path / "none")]):
        r = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, (args, r.stderr)


def test_slurm_tests_skip_with_one_reason_where_slurm_cannot_be_installed(monkeypatch):
    from tests.slurm import conftest as local

    apt = {"apt-get": "/usr/bin/apt-get"}
    monkeypatch.setattr(local.shutil, "which", lambda name, **kw: None)  # no Slurm, no munge, no apt-get
    monkeypatch.setattr(local.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match=r"\(munged, .* missing\); installing them needs root"):
        local._install_or_skip()
    monkeypatch.setattr(local.os, "geteuid", lambda: 0)
    with pytest.raises(pytest.skip.Exception, match="no apt-get to install them"):
        local._install_or_skip()
    monkeypatch.setattr(local.shutil, "which", lambda name, **kw: apt.get(name))
    failed = subprocess.CompletedProcess([], 100, "", "E: Unable to locate package slurm-wlm\n")
    monkeypatch.setattr(local, "run_cmd", lambda *a, **kw: failed)
    with pytest.raises(pytest.skip.Exception, match="could not install .*: E: Unable to locate package slurm-wlm$"):
        local._install_or_skip()
