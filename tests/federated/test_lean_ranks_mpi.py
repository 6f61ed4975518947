"""Lean ranks: a user's job imports only what each rank's role and learner need.

Real ``mpiexec`` jobs on breast cancer (3 horizontal clients) with ``MPIFC_MODULE_REPORT`` set
(:func:`mpifc.runtime.job.write_module_report`): every rank writes the top-level modules it
loaded. Training with LearnSPN, factorized and DT clients, ``mpifc evaluate`` (gathered and
``--distributed``) and ``mpifc query --distributed`` (ll, predict, marginal) load no torch on any
rank, and ``mpifc query`` in one process loads no torch, scikit-learn, pandas or SciPy; no rank of a training job loads scikit-learn or pandas (LearnSPN's k-means and FC[DT]'s
trees are numpy), and LearnSPN's RDC splits need no SciPy either; warm-up fits run only with
``--warm-up`` (and then change nothing in the model). No timings are asserted here (see
``launch/bench/startup.py``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpifc.federated.serialize import load_fc
from mpifc.federated.wire_format import model_to_bytes
from tests.mpi_util import REPO, run_mpi

JOB = ["-m", "mpifc"]


def _reports(folder: Path, n: int) -> dict[int, dict]:
    out = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}
    assert sorted(out) == list(range(n)), f"module reports of ranks {sorted(out)}, expected {n}"
    return out


def _job(n: int, args: list[str], folder: Path) -> dict[int, dict]:
    r = run_mpi(n, JOB + args, timeout=240, env={"MPIFC_MODULE_REPORT": str(folder)})
    assert r.returncode == 0, r.stderr
    return _reports(folder, n)


def _no_torch(reports: dict[int, dict]) -> None:
    for rank, rep in reports.items():
        assert "torch" not in rep["modules"], f"rank {rank} ({rep['role']}, {rep['notes']}) imported torch"
        assert rep["peak_rss_mb"] > 0


def _no_scikit_learn(reports: dict[int, dict]) -> None:
    for rank, rep in reports.items():
        for name in ("sklearn", "pandas"):
            assert name not in rep["modules"], f"rank {rank} ({rep['role']}, {rep['notes']}) imported {name}"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("lean") / "bc"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "breast-cancer", "--setting", "horizontal",
                        "--clients", "3", "--seed", "0", "--out", str(d)], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def learnspn_model(shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("learnspn")
    model = tmp / "fc.h5"
    reports = _job(4, ["train", str(shards), "--seed", "0", "--model", str(model), "--quiet"], tmp / "train")
    return model, reports, tmp


def test_learnspn_train_loads_no_torch_and_no_warm_up(learnspn_model):
    _, reports, _ = learnspn_model
    _no_torch(reports)
    _no_scikit_learn(reports)
    server, clients = reports[0], [reports[r] for r in (1, 2, 3)]
    assert server["role"] == "server"
    assert not server["notes"]["warm_up"]
    for c in clients:
        assert c["role"] == "client" and c["notes"] == {"learners": ["learnspn"], "warm_up": False}
        assert "scipy" not in c["modules"]  # RDC splits and k-means: numpy and SciPy's BLAS only
        # OMP_NUM_THREADS=1 (tests.mpi_util) already starts every native pool with one thread
        assert "threadpoolctl" not in c["modules"]


def test_warm_up_only_when_asked_and_same_model(learnspn_model, shards):
    model, _, tmp = learnspn_model
    warm = tmp / "warm.h5"
    reports = _job(4, ["train", str(shards), "--seed", "0", "--model", str(warm), "--quiet", "--warm-up"],
                   tmp / "warm")
    assert all(rep["notes"]["warm_up"] for rep in reports.values())
    _no_torch(reports)  # LearnSPN's warm-up imports what its fit needs: no torch either
    blobs = [[bytes(model_to_bytes(n.leaf.model)) for n in load_fc(p).nodes if n.leaf is not None]
             for p in (model, warm)]
    assert blobs[0] == blobs[1]


@pytest.mark.parametrize("distributed", [False, True], ids=["gathered", "distributed"])
def test_evaluate_loads_no_torch(learnspn_model, shards, distributed):
    model, _, tmp = learnspn_model
    folder = tmp / f"evaluate-{distributed}"
    n = 4 if distributed else 1
    reports = _job(n, ["evaluate", str(shards), "--model", str(model), "--quiet",
                       *(["--distributed"] if distributed else [])], folder)
    _no_torch(reports)
    for rep in reports.values():
        assert "sklearn" not in rep["modules"]


def _query_csv(model: Path, shards: Path, path: Path) -> list[str]:
    """Eight test rows in the user's units (the model's codec decodes them), as a CSV."""
    import csv

    from data_prep.codec import RowCodec
    from data_prep.shards import read_test

    codec = RowCodec.from_json(load_fc(model).meta["codec"])
    test = read_test(shards)
    x = test.x[:8][:, [test.features.index(f) for f in codec.features]]
    cols = codec.decode(x)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(codec.features)
        for i in range(len(x)):
            w.writerow(["" if v is None or (isinstance(v, float) and np.isnan(v)) else v
                        for v in (cols[name][i] for name in codec.features)])
    return list(codec.features)


def _query(learnspn_model, shards, what: str, tag: str) -> tuple[Path, list[str]]:
    """The work folder and the ``mpifc query`` arguments for eight test rows (``marginal``: of
    the first two columns)."""
    model, _, tmp = learnspn_model
    csv = tmp / f"{tag}-{what}.csv"
    names = _query_csv(model, shards, csv)
    extra = ["--keep", ",".join(names[:2])] if what == "marginal" else []
    return tmp, ["query", str(model), "--data", str(csv), "--what", what, "--out", str(tmp / f"{tag}-{what}-answers.csv"),
                 "--quiet", *extra]


@pytest.mark.parametrize("what", ["ll", "predict", "marginal"])
def test_distributed_query_loads_no_torch(learnspn_model, shards, what):
    tmp, args = _query(learnspn_model, shards, what, "distributed")
    _no_torch(_job(4, [*args, "--distributed"], tmp / f"query-{what}"))


ONE_PROCESS = """import json, sys
from mpifc.cli import main
for args in json.loads(sys.argv[1]):
    try:
        main(args)
    except SystemExit as e:
        assert not e.code, (args, e.code)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "sklearn", "pandas", "scipy"})))
"""


def test_one_process_query_loads_no_torch_scikit_learn_pandas_or_scipy(learnspn_model, shards):
    """``mpifc query`` without ``--distributed`` answers a LearnSPN model with numpy alone
    (``ll``, ``predict`` and ``marginal`` in one process)."""
    queries = [_query(learnspn_model, shards, what, "one")[1] for what in ("ll", "predict", "marginal")]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", ONE_PROCESS, json.dumps(queries)], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"mpifc query imported {r.stdout.strip()}"
    for args in queries:
        out = args[args.index("--out") + 1]
        assert len(open(out).read().splitlines()) == 9  # a header and the eight rows' answers


@pytest.mark.parametrize("learner", ["factorized", "dt"])
def test_factorized_and_dt_train_load_no_torch(shards, tmp_path, learner):
    model = tmp_path / "fc.h5"
    reports = _job(4, ["train", str(shards), "--seed", "0", "--learner", learner, "--clusters", "1",
                       "--model", str(model), "--quiet"], tmp_path / "train")
    _no_torch(reports)
    _no_scikit_learn(reports)
    for r in (1, 2, 3):
        assert reports[r]["notes"]["learners"] == [learner]
    ev = _job(4, ["evaluate", str(shards), "--model", str(model), "--distributed", "--quiet"], tmp_path / "ev")
    _no_torch(ev)
