"""mpifc through a real (one-node) Slurm: srun, sbatch, squeue and scancel against the cluster
of conftest.py, compared with the same work under mpiexec.

Kept lean (the whole file is budgeted at 2 minutes of CI on 2 cores): breast-cancer shards of
3 clients, 4 ranks at most, the quick sweep in strong mode only.
"""
from __future__ import annotations

import csv
import json
import re
import shlex
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.mpi_util import mpiexec_path
from tests.slurm.conftest import Cluster, run_cmd

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

_SCRIPT = Path(sys.executable).parent / "mpifc"
MPIFC = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "mpifc"]  # `mpifc`, as users type it
TRAIN_OPTS = ["--seed", "0", "--threshold", "0.4", "--min-instances-slice", "30"]
JOB_MINUTES = "10"  # a Slurm time limit on every job: a stuck job ends even if the test's own timeout fails
# One failing rank ends the step (as mpifc's launcher does) rather than leaving the others waiting.
SRUN = ["srun", "--kill-on-bad-exit=1", f"--time={JOB_MINUTES}"]
SWEEP_ARGS = ["--modes", "strong", "--seeds", "0"]  # plus --quick: breast-cancer, all 569 rows
# Seconds before a job counts as hung. The jobs take seconds on an idle machine; the margin is
# for a machine whose 2 cores are shared with other work.
HANG = 400


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from data_prep import prepare, write_shards

    d = tmp_path_factory.mktemp("slurm-shards") / "bc3"
    write_shards(prepare(dataset="breast-cancer", setting="horizontal", clients=3, seed=0), d)
    return d


@pytest.fixture(scope="module")
def srun_model(slurm: Cluster, shards: Path, tmp_path_factory) -> tuple[Path, dict]:
    """``srun -n 4 mpifc train``, run once for the comparisons below."""
    d = tmp_path_factory.mktemp("srun-train")
    r = slurm.run([*SRUN, "-n", "4", *MPIFC, "train", shards, *TRAIN_OPTS,
                   "--model", "model.h5", "--json"], timeout=HANG, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:] + slurm.logs()
    return d / "model.h5", json.loads(r.stdout.strip().splitlines()[-1])


def model_content(path: Path) -> dict[str, object]:
    """Every dataset (dtype, shape, bytes) and attribute of a model file, with the training
    timings (``*seconds*`` keys of the ``meta`` JSON) left out: wall-clock seconds differ between
    any two runs, so the files' raw bytes do too."""

    def no_timings(v):
        if isinstance(v, dict):
            return {k: no_timings(x) for k, x in v.items() if "seconds" not in k}
        return [no_timings(x) for x in v] if isinstance(v, list) else v

    def value(v):
        if isinstance(v, (bytes, str)):
            text = v.decode() if isinstance(v, bytes) else v
            try:
                return ("json", no_timings(json.loads(text)))
            except ValueError:
                return ("str", text)
        a = np.asarray(v)
        return (a.dtype.str, a.shape, repr(a.tolist()) if a.dtype == object else a.tobytes())

    out: dict[str, object] = {}

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            out[name] = value(obj[()])
        for k, v in obj.attrs.items():
            out[f"{name}@{k}"] = value(v)

    with h5py.File(path, "r") as f:
        visit("/", f)
        f.visititems(visit)
    return out


def test_srun_gives_one_communicator_of_n_ranks(slurm: Cluster):
    r = slurm.run([*SRUN, "-n", "4", sys.executable, "-c",
                   "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.Get_rank(), c.Get_size())"], timeout=60)
    assert r.returncode == 0, r.stderr + slurm.logs()
    assert sorted(r.stdout.split("\n")[:-1]) == ["0 4", "1 4", "2 4", "3 4"]


def test_srun_train_writes_the_model_mpiexec_writes(slurm: Cluster, shards: Path, srun_model, tmp_path):
    model, summary = srun_model
    r = run_cmd([mpiexec_path(), "-n", "4", *MPIFC, "train", shards, *TRAIN_OPTS, "--model", "model.h5", "--json"],
                slurm.env, timeout=HANG, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["ranks"] == ref["ranks"] == 4
    assert (summary["n_parameters"], summary["bytes_train"]) == (ref["n_parameters"], ref["bytes_train"])
    got, want = model_content(model), model_content(tmp_path / "model.h5")
    assert sum(isinstance(v, tuple) and len(v) == 3 for v in want.values()) > 10  # arrays, not just metadata
    assert got.keys() == want.keys()
    assert [k for k in want if got[k] != want[k]] == []


def test_srun_distributed_evaluate_matches_gathered(slurm: Cluster, shards: Path, srun_model):
    model, _ = srun_model
    dist = slurm.run([*SRUN, "-n", "4", *MPIFC, "evaluate", shards, "--model", model,
                      "--distributed", "--json"], timeout=HANG)
    assert dist.returncode == 0, dist.stderr[-3000:] + slurm.logs()
    gathered = run_cmd([*MPIFC, "evaluate", shards, "--model", model, "--json"], slurm.env, timeout=HANG)
    assert gathered.returncode == 0, gathered.stderr[-3000:]
    d, g = (json.loads(x.stdout.strip().splitlines()[-1]) for x in (dist, gathered))
    assert (d["mode"], d["ranks"], g["mode"]) == ("distributed", 4, "gathered")
    assert d["messages"] > 0 and d["n_test"] == g["n_test"] > 0
    assert np.isfinite(g["test_ll"])
    assert d["test_ll"] == pytest.approx(g["test_ll"], rel=1e-12, abs=1e-12)
    assert d["accuracy"] == g["accuracy"]


def read_summary(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sbatch_fedpc_template_runs_on_a_partition_without_gpus(slurm: Cluster, tmp_path):
    out = tmp_path / "scaling"
    # The template unchanged, no GPU flag: the node has no GRES, so any GPU request would be refused.
    r = slurm.run(["sbatch", "--wait", "--ntasks=4", f"--time={JOB_MINUTES}", f"--output={tmp_path}/job-%j.out",
                   "--export=ALL,RANKS=4,OUT={},MODES=strong,SEEDS=0,EXTRA_ARGS=--quick".format(out),
                   "launch/slurm/fedpc.sbatch"], timeout=HANG)
    job_id = re.search(r"Submitted batch job (\d+)", r.stdout)
    log = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert r.returncode == 0 and job_id, f"sbatch exit {r.returncode}\n{r.stderr}\n{log[-3000:]}\n{slurm.logs()}"
    assert f"mpifc: 4 ranks on 1 node(s), job {job_id.group(1)}" in log
    assert (out / "scaling.md").exists() and (out / "transport.csv").exists()
    rows = read_summary(out / "summary.csv")
    assert [(x["setting"], x["clients"], x["status"]) for x in rows] == [("strong", "3", "ok")]
    assert "| strong | 4 | 3 |" in (out / "scaling.md").read_text()


def test_submit_sweep_one_job_per_rank_count_then_aggregate(slurm: Cluster, tmp_path):
    out = tmp_path / "sweep"
    r = slurm.run([sys.executable, "launch/slurm/submit_sweep.py", "--ranks", "2,4", "--out", out, *SWEEP_ARGS,
                   "--time", f"00:{JOB_MINUTES}:00", "--extra-args=--quick"], timeout=60)
    assert r.returncode == 0, r.stderr
    jobs = dict(re.findall(r"^(\d+) ranks: Submitted batch job (\d+)", r.stdout, re.M))
    assert sorted(jobs) == ["2", "4"] and len(set(jobs.values())) == 2, r.stdout
    slurm.wait_drained(list(jobs.values()), timeout=HANG)
    for ranks, job_id in jobs.items():
        log = (out / "slurm" / f"fedpc-r{ranks}-{job_id}.out").read_text()
        assert slurm.job_field(job_id, "JobState") == "COMPLETED", log[-3000:]
        assert slurm.job_field(job_id, "ExitCode") == "0:0"
        assert f"mpifc: {ranks} ranks on 1 node(s), job {job_id}" in log
    # Aggregation only: every cell is done, so no job may start (an mpiexec that always fails
    # would turn a missing cell into a failed row).
    agg = run_cmd([sys.executable, "launch/sweep.py", "--ranks", "2,4", "--out", out, *SWEEP_ARGS, "--quick",
                   "--no-progress"], {**slurm.env, "MPIFC_MPIEXEC": "false"}, timeout=HANG)
    assert agg.returncode == 0, agg.stderr[-3000:]
    rows = read_summary(out / "summary.csv")
    assert sorted((x["setting"], x["clients"], x["status"]) for x in rows) == [("strong", "1", "ok"),
                                                                             ("strong", "3", "ok")]
    md = (out / "scaling.md").read_text()
    assert "| strong | 2 | 1 |" in md and "| strong | 4 | 3 |" in md


def job_processes(job_id: str, conf: Path) -> dict[int, str]:
    """Processes of this cluster's job ``job_id`` on this machine: its slurmstepd daemons and
    everything that runs with its ``SLURM_JOB_ID`` (batch script, srun, ranks), pid -> cmdline."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = set((d / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if f"SLURM_CONF={conf}".encode() not in env:
            continue  # another cluster's (or no) job with the same number
        if f"SLURM_JOB_ID={job_id}".encode() in env or re.match(rf"slurmstepd: \[{job_id}\.", cmd):
            found[int(d.name)] = cmd
    return found


def test_scancel_mid_training_leaves_no_model_and_no_process(slurm: Cluster, shards: Path, tmp_path):
    model, one_pass = tmp_path / "model.h5", tmp_path / "one-pass.h5"
    # Outputs reach their final paths only when the job succeeds, so mid-training shows as the
    # partial one-pass model written beside its final path when EM refinement starts; EM then
    # runs far longer than the test waits.
    train = shlex.join([*SRUN[:2], *MPIFC, "train", str(shards), *TRAIN_OPTS, "--refine", "em", "--em-iters", "1000000",
                      "--em-initial-model", str(one_pass), "--model", str(model)])
    r = slurm.run(["sbatch", "--parsable", "--ntasks=4", f"--time={JOB_MINUTES}", f"--output={tmp_path}/job.out",
                   f"--wrap={train}"], timeout=30)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + HANG
    while not list(tmp_path.glob(f".{one_pass.name}.partial-*")):
        out = tmp_path / "job.out"
        assert time.monotonic() < deadline, (out.read_text() if out.exists() else "") + slurm.logs()
        assert slurm.queued([job_id]), "the job ended before EM started: " + (out.read_text() if out.exists() else "")
        time.sleep(0.3)
    ranks = {p: c for p, c in job_processes(job_id, slurm.conf).items()
             if Path(c.split()[0]).name.startswith("python") and " train " in c
             and " -c " not in c}  # not srun, not sh, not rank 0's progress ticker (a `python -c` helper)
    assert len(ranks) == 4 and not model.exists() and not one_pass.exists(), ranks
    slurm.check(["scancel", job_id])
    slurm.wait_drained([job_id], timeout=60)
    assert slurm.job_field(job_id, "JobState") == "CANCELLED"
    assert not model.exists() and not one_pass.exists()
    # the node sentinel outlives the ranks by a moment and removes their partial outputs
    deadline = time.monotonic() + 10
    while list(tmp_path.glob(".*.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(tmp_path.glob(".*.partial-*"))
    # The job leaves squeue once its steps report their ends; their last exits may trail by a moment.
    deadline = time.monotonic() + 10
    while (left := job_processes(job_id, slurm.conf)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == {}, left
