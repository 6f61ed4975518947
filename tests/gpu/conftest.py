"""Shards for the device tests, and a process that believes it has GPUs (``fake_gpus``).

This machine may have no GPU: the device value is followed through the real code with torch
told there are two CUDA devices, and the torch work itself then done on the CPU by spies
(``tests/gpu/progs/fake_cuda.py`` does the same in MPI jobs). Tests that need a real GPU are in
``test_cuda.py`` and skip without one.
"""
from __future__ import annotations

import pytest
import torch

from tests.baselines.fixtures import make_shards


@pytest.fixture(scope="session")
def bc_h1(tmp_path_factory):
    """Breast cancer, seed 0, one client (horizontal FedAvg and vertical SplitNN alike)."""
    return make_shards(tmp_path_factory.mktemp("gpu-h1") / "h1", dataset="breast-cancer", setting="horizontal",
                       clients=1, seed=0)


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch reports two CUDA devices (none exists: nothing may be put on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    return 2


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
