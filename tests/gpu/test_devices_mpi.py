"""Devices in real ``mpiexec`` jobs, on any machine: ranks that see GPUs they do not have.

``tests/gpu/progs/fake_cuda.py`` runs the real command line with torch reporting two CUDA
devices; spies record the device string where it arrives (the torch learners, the placement of
loaded leaf PCs, the baselines' MLPs) and compute on the CPU. So these jobs show, without a GPU:

* each rank's device ``cuda:(local_rank % 2)`` reaches the EiNet and RAT-SPN fits, the pooled EM
  and the FedAvg and SplitNN models of that rank, and no device reaches the server's numpy work;
* the model records what each rank computed on, and the ledger of such a run equals a CPU run's
  message for message and byte for byte (nothing device-dependent is ever sent);
* ``--device cuda`` on a node without CUDA stops the job before any work with ONE line naming a
  rank and its host (exit code 2), and a device out of memory ends it with one line naming the
  rank, the device and the model's size.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi
PROG = "tests/gpu/progs/fake_cuda.py"
TRAIN = ["--learner", "einet", "--hp", "epochs=1", "--hp", "num_sums=2", "--hp", "depth=1", "--hp", "repetitions=1",
         "--hp", "dtype=float32", "--glue", "random", "--clusters", "1", "--refine", "em", "--em-iters", "1", "--quiet"]


def _spied(folder: Path) -> dict[int, list[tuple[str, str]]]:
    out: dict[int, list[tuple[str, str]]] = {}
    for p in sorted(folder.glob("rank-*.jsonl")):
        out[int(p.stem.split("-")[1])] = [(r["at"], r["device"]) for r in map(json.loads, p.read_text().splitlines())]
    return out


def _ledger(path: Path) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """The ledger without its clock: per link (sender, receiver), its messages in the order they
    arrived, each with its kind, phase and sizes."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    keys = ("kind", "phase", "payload_bytes", "header_bytes", "n_mpi_messages")
    assert rows and set(keys) <= set(rows[0]), rows[:1]
    links: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for r in sorted(rows, key=lambda r: float(r["t_recv"])):
        links.setdefault((r["src"], r["dst"]), []).append(tuple(r[k] for k in keys))
    return links


def _mpifc_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpifc:")]


def test_each_rank_device_reaches_its_learners_and_the_ledger_is_the_cpu_runs(bc_h1, tmp_path):
    """The client's device (local rank 1 of two GPUs: cuda:1) reaches its EiNet fit and the
    pooled EM's placement of the leaf PCs; the server computes nothing on torch (the same path
    carries RAT-SPN: tests/gpu/test_device_flow.py)."""
    from mpifc.federated.serialize import load_fc

    spy = tmp_path / "spy"
    gpu = run_mpi(2, [PROG, "train", str(bc_h1), *TRAIN, "--model", str(tmp_path / "g.h5"),
                      "--ledger", str(tmp_path / "g.csv")], timeout=240, env={"SPY_DIR": str(spy)})
    assert gpu.returncode == 0, gpu.stderr
    cpu = run_mpi(2, ["-m", "mpifc", "train", str(bc_h1), *TRAIN, "--model", str(tmp_path / "c.h5"),
                      "--ledger", str(tmp_path / "c.csv"), "--device", "cpu"], timeout=240)
    assert cpu.returncode == 0, cpu.stderr
    assert _spied(spy) == {1: [("fit:einet", "cuda:1"), ("place", "cuda:1")]}
    devices = load_fc(tmp_path / "g.h5", load_models=False).meta["train"]["devices"]
    assert {r: (d["device"], d["name"]) for r, d in devices.items()} == \
        {"0": ("cpu", devices["0"]["name"]), "1": ("cuda:1", "Fake GPU")}
    assert devices["1"]["memory_bytes"] == 8 * 2**30 and devices["1"]["peak_bytes"] == 12345
    assert {d["device"] for d in load_fc(tmp_path / "c.h5", load_models=False).meta["train"]["devices"].values()} \
        == {"cpu"}
    assert _ledger(tmp_path / "g.csv") == _ledger(tmp_path / "c.csv")


@pytest.mark.parametrize("baseline", ["fedavg", "splitnn"])
def test_each_rank_device_reaches_the_baselines_models(baseline, bc_h1, tmp_path):
    extra = ["--rounds", "1", "--hidden", "4"] if baseline == "fedavg" else \
        ["--epochs", "1", "--cut", "2", "--bottom-hidden", "4", "--top-hidden", "4"]
    r = run_mpi(2, [PROG, "baseline", baseline, str(bc_h1), *extra, "--batch-size", "0", "--json"], timeout=240,
                env={"SPY_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    seen = _spied(tmp_path)
    assert sorted(seen) == [0, 1]
    for rank, calls in seen.items():  # the model, its rows and (SplitNN) every tensor received
        assert len(calls) >= 2 and {d for _, d in calls} == {f"cuda:{rank}"}, (rank, calls)
    result = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
    assert {k: v["device"] for k, v in result["devices"].items()} == {"0": "cuda:0", "1": "cuda:1"}


def test_a_missing_gpu_stops_the_job_before_any_work_in_one_line(bc_h1, tmp_path):
    r = run_mpi(2, [PROG, "train", str(bc_h1), "--learner", "factorized", "--model", str(tmp_path / "m.h5"),
                    "--device", "cuda"], timeout=120, env={"FAKE_GPUS": "0"})
    assert r.returncode == 2, r.stderr
    lines = _mpifc_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mpifc: rank 0: UserError: --device 'cuda' on host ")
    assert lines[0].endswith(": CUDA is not available on this node (and on 1 more rank(s))")
    assert "Traceback" not in r.stderr and not (tmp_path / "m.h5").exists()
