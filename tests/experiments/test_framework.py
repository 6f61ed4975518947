"""The experiments framework without MPI: arguments, registry, launcher errors, cells, resume."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.experiments import registry
from mpifc.experiments.launcher import JobFailed, JobResult, Launcher, under_slurm
from mpifc.cli.experiment import add_experiment_arguments, experiment_main, main
from mpifc.experiments.options import parse_int_list, parse_names
from mpifc.experiments.scaling import fit_alpha_beta, project
from mpifc.experiments.store import FAILED, OK, Cell, ResultStore, aggregate, mean_std, run_cells, write_h5_table


@pytest.mark.parametrize("spec,want", [("0-4", [0, 1, 2, 3, 4]), ("0,2,5", [0, 2, 5]), ("0-2,7", [0, 1, 2, 7]),
                                       ("3", [3]), (" 1 - 2 ", [1, 2]), ("2,2,1", [1, 2])])
def test_seed_specs(spec, want):
    assert parse_int_list(spec, "--seeds") == want


@pytest.mark.parametrize("spec", ["", "a", "4-2", "1-", "-1", "0,,x", "1.5"])
def test_bad_seed_specs_name_the_flag(spec):
    with pytest.raises(UserError, match="--seeds"):
        parse_int_list(spec, "--seeds")


def test_unknown_names_are_user_errors():
    with pytest.raises(UserError, match="tabel1"):
        registry.get("tabel1")
    with pytest.raises(UserError, match="'imagenet'"):
        parse_names("breast-cancer,imagenet", ("breast-cancer", "adult"), "--datasets")
    assert set(registry.names()) >= {"table1", "table7", "commcost", "scaling", "decentralization"}
    for name in registry.names():
        assert callable(registry.get(name).run)


def _args(argv):
    p = argparse.ArgumentParser()
    add_experiment_arguments(p)
    return p.parse_args(argv)


def test_cli_bad_input_exits_2_naming_it(capsys):
    assert main(["nosuch", "--quick"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert main(["table1", "--seeds", "x-y"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["table7", "--settings", "diagonal"]) == 2
    assert "diagonal" in capsys.readouterr().err
    assert main(["scaling", "--ranks", "1,4"]) == 2
    with pytest.raises(UserError, match="name missing"):
        experiment_main(_args([]))
    assert main(["--list"]) == 0
    assert "table7" in capsys.readouterr().out


def test_decentralization_is_registered_with_its_signature(monkeypatch, tmp_path):
    from mpifc.experiments import decentralization

    seen = {}
    monkeypatch.setattr(decentralization, "run", lambda out, quick, parts, seeds, **kw: seen.update(
        out=out, quick=quick, parts=parts, seeds=seeds, **kw) or {})
    registry.get("decentralization").run(tmp_path, [0, 1], True, parts=["exact"], max_rows=500, progress=True)
    # Seeds and the empirical part's options reach the experiment; options it does not use do not.
    assert seen == {"out": tmp_path, "quick": True, "parts": ("exact",), "seeds": [0, 1], "max_rows": 500}


def test_launcher_commands():
    assert under_slurm({"SLURM_JOB_ID": "42"}) and not under_slurm({})
    cmd = Launcher(slurm=True, python="py").command(4, ["-m", "x"])
    assert cmd[:2] == ["srun", "--ntasks=4"] and cmd[-3:] == ["py", "-m", "x"]
    cmd = Launcher(slurm=False, mpiexec="/opt/mpiexec", python="py").command(3, ["a"])
    assert cmd == ["/opt/mpiexec", "-n", "3", "py", "a"]
    with pytest.raises(ValueError):
        Launcher(slurm=False).command(0, [])


def test_failed_job_carries_its_stderr_tail():
    code = "import sys; sys.stderr.write('x' * 5000 + 'BOOM-the-real-reason'); sys.exit(3)"
    with pytest.raises(JobFailed) as e:
        Launcher(slurm=False).run(1, ["-c", code], timeout=120)
    assert e.value.returncode != 0
    assert "BOOM-the-real-reason" in str(e.value) and len(e.value.stderr_tail) <= 3000


def test_job_timeout_kills_and_reports():
    with pytest.raises(JobFailed, match="timed out"):
        Launcher(slurm=False).run(1, ["-c", "import sys, time; sys.stderr.write('slow'); sys.stderr.flush(); "
                                            "time.sleep(600)"], timeout=2)


def test_last_json_line():
    r = JobResult(["x"], 0, 'noise\n{"a": 1}\n{"b": 2}\ntrailer\n', "", 0.1)
    assert r.last_json() == {"b": 2}
    with pytest.raises(JobFailed, match="no JSON"):
        JobResult(["x"], 0, "nothing", "err", 0.1).last_json()


def test_cells_resume_and_record_failures(tmp_path):
    store = ResultStore(tmp_path)
    cells = [Cell("d", "horizontal", 2, m, s) for m in ("good", "bad") for s in (0, 1)]
    calls = []

    def work(cell):
        calls.append(cell)
        if cell.method == "bad":
            raise RuntimeError("method exploded")
        return {"acc": 0.5 + 0.1 * cell.seed}

    recs, counts = run_cells(store, cells, work, "t", progress=False)
    assert counts == {"ran": 4, "skipped": 0, "failed": 2}
    assert {r["status"] for r in recs} == {OK, FAILED}
    assert "method exploded" in json.loads(store.path(cells[2]).read_text())["error"]
    calls.clear()
    recs, counts = run_cells(store, cells, work, "t", progress=False)
    assert counts["skipped"] == 2 and {c.method for c in calls} == {"bad"}  # failures retried only
    agg = {a["method"]: a for a in aggregate(recs, ["acc"])}
    assert agg["good"]["seeds"] == 2 and agg["good"]["acc_mean"] == pytest.approx(0.55)
    assert agg["good"]["acc_std"] == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert agg["bad"]["status"] == FAILED and "exploded" in agg["bad"]["error"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_user_errors_are_not_swallowed_by_cells(tmp_path):
    def work(cell):
        raise UserError("bad key 'zzz'")

    with pytest.raises(UserError, match="zzz"):
        run_cells(ResultStore(tmp_path), [Cell("d", "s", 1, "m", 0)], work, "t", progress=False)


def test_mean_std_and_h5(tmp_path):
    assert mean_std([1.0, None, float("nan"), 3.0])[:2] == (2.0, pytest.approx(math.sqrt(2)))
    assert math.isnan(mean_std([None])[0])
    p = write_h5_table(tmp_path / "t.h5", [{"a": 1, "b": 0.5, "c": "x"}, {"a": 2, "b": None, "c": "y"}])
    with h5py.File(p) as f:
        assert f["a"][:].tolist() == [1, 2] and math.isnan(f["b"][1]) and f["c"].asstr()[:].tolist() == ["x", "y"]


def test_alpha_beta_fit_and_projection():
    sizes = np.array([8, 1e3, 1e5, 1e6, 1e7])
    alpha, beta = fit_alpha_beta(sizes, 5e-6 + sizes / 2e9)
    assert alpha == pytest.approx(5e-6, rel=1e-3) and beta == pytest.approx(2e9, rel=1e-3)
    p = {r["clients"]: r for r in project(alpha, beta, 1e5, 3, [1024, 10_000], servers=32)}
    assert p[10_000]["query_tree_best_s"] < p[10_000]["query_tree_s"] < p[10_000]["query_flat_s"]
    assert p[10_000]["train_flat_s"] == pytest.approx(10_000 * (3 * alpha + 1e5 / beta))


def test_sigterm_to_the_driver_ends_its_job(tmp_path):
    """The job runs in a process group of its own; a SIGTERM to the driver must still end every rank."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "rank.pid"
    job = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    driver = ("import sys; from mpifc.experiments.launcher import Launcher; "
              f"Launcher(slurm=False).run(1, ['-c', {job!r}], timeout=600)")
    proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    try:
        for _ in range(600):  # the rank writes its pid once it runs
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        rank_pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        for _ in range(200):
            try:
                os.kill(rank_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(rank_pid, signal.SIGKILL)
            pytest.fail("the job's rank outlived the SIGTERMed driver")
    finally:
        if proc.poll() is None:
            proc.kill()
