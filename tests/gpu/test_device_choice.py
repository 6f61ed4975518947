"""``--device``: its forms, the auto rule ``cuda:(local_rank % n_gpus)``, a device that is not there
refused before any work (naming the host), and the summary line of what each rank used."""
from __future__ import annotations

import pytest
import torch

from mpifc.errors import UserError
from mpifc.runtime.device import describe_devices, device_problem, parse_device, select_device


def test_forms_are_checked_without_torch_work():
    assert [parse_device(v) for v in (None, "", "auto", "cpu", "cuda", "cuda:3")] == \
        ["auto", "auto", "auto", "cpu", "cuda", "cuda:3"]
    for bad in ("gpu", "cuda:", "cuda:-1", "CPU", "cuda:1:2", "mps"):
        with pytest.raises(UserError, match=f"--device '{bad}': expected auto, cpu, cuda or cuda:N"):
            parse_device(bad)


def test_auto_gives_each_local_rank_its_gpu(fake_gpus):
    assert [str(select_device(r, "auto")) for r in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert [str(select_device(r, "cuda")) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert str(select_device(0, "cuda:1")) == "cuda:1"
    assert str(select_device(1, "cpu")) == "cpu"
    assert device_problem(0, "cuda:1") is None
    assert device_problem(0, "cuda:2") == "this node has 2 CUDA device(s), so the last one is cuda:1"
    with pytest.raises(UserError, match=r"--device 'cuda:2' on host \S+: this node has 2 CUDA device"):
        select_device(0, "cuda:2")


def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused(no_gpu):
    assert str(select_device(3, "auto")) == "cpu"
    assert device_problem(0, "auto") is None and device_problem(0, "cpu") is None
    for value in ("cuda", "cuda:0"):
        assert device_problem(0, value) == "CUDA is not available on this node"
        with pytest.raises(UserError, match=rf"--device '{value}' on host \S+: CUDA is not available"):
            select_device(0, value)


def test_summary_line_groups_ranks_by_device():
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30}
    devices = {"0": {"device": "cpu"}, "1": {"device": "cuda:0", "peak_bytes": 2**30, **gpu},
               "2": {"device": "cuda:0", "peak_bytes": 3 * 2**29, **gpu}, "4": {"device": "cuda:0", **gpu},
               "3": {"device": "cpu"}}
    assert describe_devices(devices) == ("ranks 0,3 cpu; ranks 1-2,4 cuda:0 NVIDIA H100 80GB HBM3 (80.0 GiB); "
                                         "GPU peak per rank up to 1.50 GiB")


def test_command_line_refuses_a_malformed_device_with_exit_code_2(capsys):
    from mpifc.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "shards", "--model", "m.h5", "--device", "gpu"])
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[-1].endswith("argument --device: expected auto, cpu, cuda or cuda:N, got 'gpu'"), err


def test_api_refuses_a_missing_gpu_before_any_work(no_gpu, tmp_path):
    import mpifc

    # refused before the shards or the file are even opened (neither exists)
    with pytest.raises(UserError, match=r"device='cuda' on host \S+: CUDA is not available"):
        mpifc.simulate(tmp_path / "no-shards", learner="einet", device="cuda")
    with pytest.raises(UserError, match=r"device='cuda:0' on host \S+: CUDA is not available"):
        mpifc.load(tmp_path / "never-written.h5", device="cuda:0")


def test_experiment_passes_the_device_to_the_jobs_it_starts(monkeypatch, tmp_path):
    from mpifc.cli import parse_args
    from mpifc.cli.experiment import experiment_main
    from mpifc.experiments import registry

    seen = {}

    class Experiment:
        help = "records what a job it launched now would get"

        def run(self, out, seeds, quick, **opts):
            seen["device"] = parse_args(["train", "shards", "--model", "m.h5"]).device  # a job's command line
            return {}

    monkeypatch.setattr(registry, "get", lambda name: Experiment())
    monkeypatch.setenv("MPIFC_DEVICE", "auto")  # restored (removed) after the test
    experiment_main(parse_args(["experiment", "any", "--device", "cuda:1", "--out", str(tmp_path), "--quick"]))
    assert seen == {"device": "cuda:1"}
