"""A one-node Slurm cluster on localhost for the tests of this folder.

``launch/slurm/local-cluster.sh`` (the script a user runs on a workstation) brings up munged,
slurmctld and slurmd once per test run, with its ``slurm.conf``, key, logs and state in a
temporary folder, and stops them by their PIDs after the last test, even when a test fails.
Slurm and munge are installed with apt-get when missing and the run is root (as in CI);
otherwise every test here skips with one reason.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.mpi_util import run_in_group

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "slurm" / "local-cluster.sh"
TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
DAEMONS = ("munged", "slurmctld", "slurmd")
SBIN = os.pathsep.join(("/usr/sbin", "/sbin"))


def run_cmd(cmd: list[str], env: dict[str, str], timeout: float, cwd: str | Path = REPO,
            ) -> subprocess.CompletedProcess:
    """``cmd`` in a process group of its own; on timeout the whole process group goes, then
    subprocess.TimeoutExpired is raised (srun and sbatch must never hang a test run)."""
    return run_in_group(cmd, timeout=timeout, cwd=cwd, env=env)


def _search_path() -> str:
    return os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""), SBIN))


def _missing_tools() -> list[str]:
    path = _search_path()
    return [t for t in TOOLS if shutil.which(t, path=path) is None]


def _install_or_skip() -> None:
    """Slurm and munge on this machine, installed now if need be; else the one skip reason."""
    missing = _missing_tools()
    if not missing:
        return
    hint = f"run `{SCRIPT.relative_to(REPO)} install` as root"
    if os.geteuid() != 0:
        pytest.skip(f"Slurm tests need slurm-wlm and munge ({', '.join(missing)} missing); installing them "
                    f"needs root: {hint}")
    if shutil.which("apt-get") is None:
        pytest.skip(f"Slurm tests need slurm-wlm and munge ({', '.join(missing)} missing) and there is no "
                    "apt-get to install them")
    env = {**os.environ, "PATH": _search_path()}
    try:
        r = run_cmd(["bash", SCRIPT, "install"], env, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("Slurm tests: apt-get did not install slurm-wlm and munge within 10 minutes")
    if r.returncode != 0 or _missing_tools():
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"Slurm tests: apt-get could not install slurm-wlm and munge: {last}")


def _free_ports(n: int) -> list[int]:
    """n ports free on localhost now (all held open together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive_as(pid: int, name: str) -> bool:
    """pid runs and is ``name`` (a PID reused by another program is not ours)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


@dataclass
class Cluster:
    """The running cluster: its folder, the environment its clients need, the daemons' PIDs."""

    dir: Path
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def run(self, cmd: list[str], timeout: float = 120.0, cwd: str | Path = REPO,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return run_cmd(cmd, {**self.env, **(env or {})}, timeout, cwd)

    def check(self, cmd: list[str], timeout: float = 30.0) -> str:
        """stdout of a Slurm client command that must succeed."""
        r = self.run(cmd, timeout)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stderr}"
        return r.stdout

    def queued(self, job_ids: list[str] | None = None) -> list[str]:
        """IDs of the jobs squeue still lists (pending, running or completing)."""
        cmd = ["squeue", "--noheader", "--format=%i"]
        if job_ids:
            cmd.append("--jobs=" + ",".join(job_ids))
        r = self.run(cmd, 30)
        # squeue exits non-zero for job IDs slurmctld no longer knows: those are gone too.
        return r.stdout.split() if r.returncode == 0 else []

    def wait_drained(self, job_ids: list[str] | None = None, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.queued(job_ids):
            if time.monotonic() > deadline:
                raise AssertionError(f"squeue still lists {self.queued(job_ids)} after {timeout:g} s\n"
                                     + self.check(["squeue", "--states=all"]))
            time.sleep(0.3)

    def job_field(self, job_id: str, key: str) -> str:
        """One ``Key=value`` field of ``scontrol show job``."""
        for tok in self.check(["scontrol", "--oneliner", "show", "job", job_id]).split():
            k, _, v = tok.partition("=")
            if k == key:
                return v
        raise AssertionError(f"scontrol show job {job_id}: no {key}")

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.dir / name
            if p.exists():
                parts.append(f"--- {name} (tail) ---\n" + "\n".join(p.read_text().splitlines()[-20:]))
        return "\n".join(parts)


def _client_env(conf: Path) -> dict[str, str]:
    # Inside an outer allocation these would point srun at that job instead of this cluster.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(SLURM_CONF=str(conf), OMP_NUM_THREADS="1", PATH=_search_path(), PYTHON=sys.executable,
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[Cluster]:
    _install_or_skip()
    d = tmp_path_factory.mktemp("slurm-cluster")
    ctld_port, d_port = _free_ports(2)
    env = _client_env(d / "slurm.conf")
    cluster = Cluster(d, env)
    up_env = {**env, "SLURMCTLD_PORT": str(ctld_port), "SLURMD_PORT": str(d_port), "SLURM_LOCAL_CPUS": "8"}
    try:
        r = run_cmd(["bash", SCRIPT, "up", d], up_env, timeout=90)
        _read_pids(cluster)
        if r.returncode != 0:
            pytest.fail(f"the local Slurm cluster did not come up (exit {r.returncode}):\n{r.stderr}", pytrace=False)
        yield cluster
    finally:
        _teardown(cluster, env)


def _read_pids(cluster: Cluster) -> None:
    for name in DAEMONS:
        try:
            cluster.pids[name] = int((cluster.dir / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # not started (or not yet written): nothing of it to stop


def _teardown(cluster: Cluster, env: dict[str, str]) -> None:
    """The script's `down`, then whatever daemon is still there by its PID: none may outlive the run."""
    _read_pids(cluster)  # again: a daemon may have written its PID file after a timed-out `up`
    try:
        run_cmd(["bash", SCRIPT, "down", cluster.dir], env, timeout=60)
    except subprocess.TimeoutExpired:
        pass
    survivors = [f"{n} ({p})" for n, p in cluster.pids.items() if _alive_as(p, n)]
    for name, pid in cluster.pids.items():
        if _alive_as(pid, name):
            os.kill(pid, signal.SIGKILL)
    assert not survivors, f"`{SCRIPT.name} down` left {', '.join(survivors)} running (now killed)"


@pytest.fixture(autouse=True)
def _empty_queue(slurm: Cluster):
    """Every test starts and ends with no job on the cluster, so a failing test cannot hold the
    node (or leave ranks running) for the next one."""
    yield
    slurm.run(["scancel", f"--user={pwd.getpwuid(os.getuid()).pw_name}"], 30)
    slurm.wait_drained(timeout=60)
