"""Algorithm 1's k-means (one_pass.cluster_rows) runs with native pools at one thread, whatever
OMP_NUM_THREADS says, so a seed gives the same clusters on machines with other core counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROG = textwrap.dedent("""
    import json
    import numpy as np
    from threadpoolctl import threadpool_info
    import mpifc.circuit.splitting as splitting
    from mpifc.federated.one_pass import cluster_rows

    seen = []
    real = splitting.kmeans_labels

    def spy(*a, **k):
        seen.append(sorted({p["num_threads"] for p in threadpool_info()}))
        return real(*a, **k)

    splitting.kmeans_labels = spy
    outside = sorted({p["num_threads"] for p in threadpool_info()})
    x = np.random.default_rng(5).standard_normal((400, 6))
    labels = cluster_rows(x, 3, 17)
    print(json.dumps({"outside": outside, "inside": seen, "labels": labels.tolist()}))
""")


def _run(threads: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROG], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cluster_rows_clusters_with_one_native_thread() -> None:
    two = _run("2")
    assert two["outside"] == [2], two["outside"]  # the pools do have two threads out there ...
    assert two["inside"] == [[1]], two["inside"]  # ... and k-means runs with one
    one = _run("1")
    assert one["inside"] == [[1]]
    assert one["labels"] == two["labels"]
