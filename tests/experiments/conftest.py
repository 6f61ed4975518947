"""Quick experiment runs shared by the tests of this folder (each runs once per test run).

Every quick run prepares its breast-cancer shards in one shared cache, so data are prepared
once; the MPI jobs are few and tiny (2-4 ranks).
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shard_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("experiment-shards")


def _quick(name, tmp_path_factory, shard_cache, **opts):
    from mpifc.experiments import registry

    out = tmp_path_factory.mktemp(f"quick-{name}")
    summary = registry.get(name).run(out, [0], True, shards=shard_cache, progress=False, **opts)
    return out, summary


@pytest.fixture(scope="session")
def quick_table1(tmp_path_factory, shard_cache):
    return _quick("table1", tmp_path_factory, shard_cache)


@pytest.fixture(scope="session")
def quick_table7(tmp_path_factory, shard_cache):
    return _quick("table7", tmp_path_factory, shard_cache)


@pytest.fixture(scope="session")
def quick_commcost(tmp_path_factory, shard_cache):
    return _quick("commcost", tmp_path_factory, shard_cache)


@pytest.fixture(scope="session")
def quick_scaling(tmp_path_factory, shard_cache):
    return _quick("scaling", tmp_path_factory, shard_cache)


@pytest.fixture(scope="session")
def quick_table3(tmp_path_factory, shard_cache):
    return _quick("table3", tmp_path_factory, shard_cache)
