"""launch/bench/relative_runtime_spflow.py: SPFlow's side makes the learner calls our clients make."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.script_util import load_script

_PATH = Path(__file__).resolve().parents[2] / "launch" / "bench" / "relative_runtime_spflow.py"


@pytest.fixture(scope="module")
def bench():
    return load_script("launch/bench/relative_runtime_spflow.py", "rr_spflow_bench")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from mpifc.experiments.jobs import ShardCache

    return ShardCache(tmp_path_factory.mktemp("rr") / "shards")


@pytest.mark.parametrize("setting", ["horizontal", "vertical", "hybrid"])
def test_spflow_jobs_are_the_clients_fits(bench, cache, setting) -> None:
    from mpifc.federated.one_pass import run_client_tasks

    inp = bench.cell_inputs(cache, "breast-cancer", setting, 0, 300)
    jobs, kmeans_s, arrays = bench.spflow_jobs(inp)
    assert len(kmeans_s) == len(inp["clients"]) and all(s >= 0 for s in kmeans_s)
    # the last job is the centralized fit on the union rows
    assert jobs[-1]["client"] == -1 and np.array_equal(arrays["union"], inp["union"])
    for c in inp["clients"]:
        i = c.declaration.index
        report = run_client_tasks(inp["plan"], i, c.shard.x_train, c.shard.features)
        mine = [j for j in jobs if j["client"] == i]
        # one SPFlow call per PC our client learns, on the same rows (cluster by cluster)
        assert [arrays[j["array"]].shape for j in mine] == [(leaf.n_rows, len(leaf.features))
                                                          for leaf in report.leaves]
        assert sum(leaf.n_rows for leaf in report.leaves) == len(c.shard.x_train) * len(inp["plan"].tasks_for(i))
    if setting == "vertical":  # every single-owner subspace is clustered (K = 2)
        assert sum(j["client"] >= 0 for j in jobs) > len(inp["clients"])


def test_ours_times_every_client_and_the_union(bench, cache) -> None:
    inp = bench.cell_inputs(cache, "breast-cancer", "vertical", 0, 300)
    o = bench.ours(inp, 0, 1)
    assert len(o["client_seconds"]) == 2 and all(s > 0 for s in o["client_seconds"]) and o["central_seconds"] > 0
    assert bench._ratio(o) == pytest.approx(max(o["client_seconds"]) / o["central_seconds"])
    assert bench._ratio({"timeout": 1.0}) is None


def test_spflow_worker_runs_when_spflow_is_installed(bench, cache, tmp_path) -> None:
    pytest.importorskip("spflow")
    inp = bench.cell_inputs(cache, "breast-cancer", "vertical", 0, 200)
    s = bench.spflow(inp, 0, 600.0, tmp_path / "work")
    assert "client_seconds" in s, s
    assert len(s["client_seconds"]) == 2 and s["central_seconds"] > 0
    assert all(c >= k for c, k in zip(s["client_seconds"], s["kmeans_seconds"]))
    assert json.loads((tmp_path / "work" / "spec.json").read_text())["threshold"] == inp["hp"]["threshold"]


def test_script_runs_end_to_end_with_the_repo_on_pythonpath(tmp_path) -> None:
    """As a script (its folder first on sys.path, where a data_prep.py sits), with PYTHONPATH
    naming the repository: one cell, SPFlow cut off by its timeout, results written."""
    import os
    import subprocess
    import sys

    repo = _PATH.parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(_PATH), "--settings", "horizontal", "--seeds", "0", "--max-rows", "200",
                          "--repeat", "1", "--spflow-timeout", "0.01", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())["results"]
    assert len(res) == 1 and res[0]["spflow"] == {"timeout": 0.01} and res[0]["ratio_spflow"] is None
    assert res[0]["ratio_ours"] > 0 and (tmp_path / "results.csv").read_text().count("\n") == 2
