"""Run the mpifc command line in a process that sees GPUs it does not have, recording where the
device arrives. Usage (under mpiexec or alone): ``fake_cuda.py MPIFC-ARGS...``

Environment:
  FAKE_GPUS=N         torch reports N CUDA devices (default 2; 0: none, CUDA is not available)
  SPY_DIR=DIR         every rank appends what reached it to DIR/rank-R.jsonl: ``{"at": where,
                      "device": the device string it was given, ...}``

The device string travels unchanged from ``--device`` to the torch learners (``einet``,
``ratspn``), the placement of loaded leaf PCs and the baselines' MLPs, which record it and then
compute on the CPU (no tensor can live on a GPU that is not there). Everything else (the job,
the protocol, the ledger, the model file) is the real thing.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def _rank() -> int:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def record(at: str, device: object, **extra: object) -> None:
    folder = os.environ.get("SPY_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"rank-{_rank()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"at": at, "device": None if device is None else str(device), **extra}) + "\n")


class _Props:
    name = "Fake GPU"
    total_memory = 8 * 2**30


def fake_gpus(n: int) -> None:
    torch.cuda.is_available = lambda: n > 0
    torch.cuda.device_count = lambda: n
    torch.cuda.get_device_properties = lambda device=None: _Props()
    torch.cuda.max_memory_allocated = lambda device=None: 12345


def spy_learners() -> None:
    from mpifc.federated import learners as L

    for name in ("einet", "ratspn"):
        real = L.get_learner(name)

        def spy(x, meta_types, seed, n_categories=None, var_min_var=None, device="cpu", _real=real, _name=name,
                **hp):
            record(f"fit:{_name}", device)
            return _real(x, meta_types, seed, n_categories=n_categories, var_min_var=var_min_var, device="cpu", **hp)

        L.register_learner(name, spy)


def spy_placement() -> None:
    from mpifc.federated import placement

    real = placement.place_models

    def spy(fc, device, ranks=None):
        if device is not None:
            record("place", device)
        return real(fc, None if device is None else "cpu", ranks)

    placement.place_models = spy


def spy_baselines() -> None:
    from mpifc.baselines import mlp

    def spy(obj, device):
        record("mlp", device, what=type(obj).__name__)
        return obj

    mlp.on_device = spy


def main() -> None:
    fake_gpus(int(os.environ.get("FAKE_GPUS", "2")))
    spy_learners()
    spy_placement()
    spy_baselines()
    from mpifc.cli import main as cli_main

    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
