"""``launch/bench/gpu.py --device cpu --quick``: the prepared GPU check runs its every section on a
CPU (tiny sizes, synthetic images, one real ``mpiexec`` training) and writes its JSON and table."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.mpi_util import REPO

pytestmark = pytest.mark.mpi


def test_the_gpu_check_runs_on_the_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("MPIFC_DATA", None)
    r = subprocess.run([sys.executable, "launch/bench/gpu.py", "--out", str(tmp_path), "--device", "cpu", "--quick",
                        "--budget", "900"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["device"] == "cpu" and res["facts"]["torch"] and res["facts"]["mpiexec"]
    assert res["mnist"].startswith("synthetic")
    e = res["einet_mnist"]
    assert e["cpu"]["batches"] >= 1 and e["cpu"]["rows_per_s"] > 0 and math.isfinite(e["cpu"]["test_ll_after_same_batches"])
    (run,) = res["fedpc_mnist"]["runs"]
    assert run["status"] == "ok", run
    assert 0 < run["bpd"] < 8 and run["bytes_train"] > 0 and run["devices"] == {"0": "cpu", "1": "cpu"}
    im = res["imagenet32_client"]
    assert im["status"] == "ok" and im["epoch"]["full_epoch"] and im["epoch"]["rows_per_s"] > 0
    assert res["portability"]["status"] == "skipped"  # two trainings: the real run's, not --quick's
    text = (tmp_path / "gpu.txt").read_text()
    assert "EiNet MNIST" in text and "FedPC MNIST" in text and "ImageNet32 client" in text
