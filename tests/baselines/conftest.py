"""Shared shard directories (preparing data takes seconds; every test reuses them) and one
compute thread per test process: these models are tiny, and on a shared 2-core machine torch's
and OpenMP's thread pools only fight each other (50x slower when the machine is loaded)."""
from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_limits

from tests.baselines.fixtures import make_shards


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def bc_dirs(tmp_path_factory):
    """Breast cancer, seed 0: ``h1`` (1 client), ``h3`` (3 horizontal), ``v2`` (2 vertical)."""
    root = tmp_path_factory.mktemp("bc-shards")
    return {"h1": make_shards(root / "h1", dataset="breast-cancer", setting="horizontal", clients=1, seed=0),
            "h3": make_shards(root / "h3", dataset="breast-cancer", setting="horizontal", clients=3, seed=0),
            "v2": make_shards(root / "v2", dataset="breast-cancer", setting="vertical", clients=2, seed=0)}
