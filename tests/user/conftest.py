"""A newcomer's own table: a CSV with named columns, text labels and empty cells, as shards and
as a model trained with default flags (real mpiexec jobs)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.mpi_util import REPO, run_mpi

CITIES = ("Paris", "Rome", "Oslo")
COLUMNS = ("age", "income", "visits", "city", "outcome")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m <args>`` in one process, as a user runs it (no mpiexec)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd or REPO, env=env)


def make_table(n: int, seed: int) -> list[dict[str, str]]:
    """Rows in the user's units: two real columns, a count, a city name and a yes/no outcome that
    depends on them; about 5% of the feature cells empty."""
    rng = np.random.default_rng(seed)
    city = rng.integers(0, 3, n)
    age = rng.normal(40 + 8 * city, 9, n)
    income = rng.normal(30 + 0.6 * age, 6, n)
    visits = rng.poisson(1 + 2 * (city == 2), n)
    p = 1 / (1 + np.exp(-(0.15 * (age - 45) + 0.08 * (income - 57) + 0.5 * visits - 1)))
    outcome = rng.random(n) < p
    rows = []
    for i in range(n):
        row = {"age": f"{age[i]:.3f}", "income": f"{income[i]:.2f}", "visits": str(int(visits[i])),
               "city": CITIES[city[i]], "outcome": "yes" if outcome[i] else "no"}
        for k in ("age", "income", "visits", "city"):
            if rng.random() < 0.05:
                row[k] = ""
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...] = COLUMNS) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in columns})
    return path


@pytest.fixture(scope="session")
def newcomer(tmp_path_factory):
    """``{"dir", "data", "shards", "model", "queries"}``: the table, its shards (2 horizontal
    clients) and a model trained by ``mpiexec -n 3 mpifc train SHARDS --model M`` (defaults)."""
    d = tmp_path_factory.mktemp("newcomer")
    data = write_csv(d / "people.csv", make_table(600, 0))
    (d / "people.schema.json").write_text(json.dumps({
        "columns": [{"name": "age", "type": "real"}, {"name": "income", "type": "real"},
                    {"name": "visits", "type": "discrete"}, {"name": "city", "type": "categorical"},
                    {"name": "outcome", "type": "categorical"}],
        "target": "outcome"}))
    shards = d / "shards"
    r = cli("data_prep", "--dataset", "csv", "--path", str(data), "--setting", "horizontal", "--clients", "2",
            "--seed", "0", "--out", str(shards))
    assert r.returncode == 0, r.stderr
    model = d / "fc.h5"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--model", str(model)], timeout=120)
    assert r.returncode == 0, r.stderr
    queries = write_csv(d / "new.csv", make_table(40, 1))
    return {"dir": d, "data": data, "shards": shards, "model": model, "queries": queries}


QUESTIONS = ("ll", "predict", "mpe", "sample", "marginal")
QUERY_ARGS = {"marginal": ["--keep", "age,city"], "sample": ["--n-samples", "3", "--seed", "5"]}


@pytest.fixture(scope="session")
def one_process_answers(newcomer):
    """Every question asked of the newcomer's query rows with the real command in one process:
    ``{what: {"one", "stdout"}}`` (the answer file and the command's summary)."""
    out = {}
    for what in QUESTIONS:
        d = newcomer["dir"] / f"answers-{what}"
        d.mkdir()
        one = d / "one.csv"
        r = cli("mpifc", "query", str(newcomer["model"]), "--data", str(newcomer["queries"]), "--what", what,
                "--out", str(one), *QUERY_ARGS.get(what, []))
        assert r.returncode == 0, r.stderr
        out[what] = {"one": one, "stdout": r.stdout}
    return out


@pytest.fixture(scope="session")
def answers(newcomer, one_process_answers):
    """:func:`one_process_answers`, each question also asked distributed (``mpiexec -n 3 ...
    --distributed --ledger``): ``{what: {"one", "dist", "ledger", "stdout"}}``. Only the tests that
    compare with the MPI job ask for it, so a worker running the others starts no query job."""
    out = {}
    for what in QUESTIONS:
        one = one_process_answers[what]
        d = one["one"].parent
        dist, ledger = d / "dist.csv", d / "ledger.csv"
        rd = run_mpi(3, ["-m", "mpifc", "query", str(newcomer["model"]), "--data", str(newcomer["queries"]),
                         "--what", what, "--out", str(dist), "--distributed", "--ledger", str(ledger), "--quiet",
                         *QUERY_ARGS.get(what, [])], timeout=120)
        assert rd.returncode == 0, rd.stderr
        out[what] = {**one, "dist": dist, "ledger": ledger}
    return out
