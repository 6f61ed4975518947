"""``mpifc.load`` and ``mpifc.simulate``: numpy answers, DataFrames by column name, the same
answers as ``mpifc query`` and as the MPI job."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from tests.mpi_util import run_mpi
from tests.user.conftest import QUESTIONS, cli

pd = pytest.importorskip("pandas")


def frame(path) -> "pd.DataFrame":
    return pd.read_csv(path, dtype=str, keep_default_na=False)


@pytest.mark.mpi
def test_dataframe_and_array_paths_agree(newcomer):
    import mpifc

    fc = mpifc.load(newcomer["model"])
    df = frame(newcomer["queries"])
    x = fc.encode(df)
    assert isinstance(x, np.ndarray) and x.shape == (len(df), len(fc.features))
    for name in ("log_likelihood", "predict_proba"):
        a, b = getattr(fc, name)(df), getattr(fc, name)(x)
        assert isinstance(a, np.ndarray) and np.array_equal(a, b), name
    assert np.array_equal(fc.predict(df), fc.predict(x))
    # columns are matched by name, not position
    assert np.array_equal(fc.log_likelihood(df[df.columns[::-1]]), fc.log_likelihood(df))
    mpe_user, mpe_model = fc.mpe(df), fc.mpe(x)
    assert mpe_user.dtype == object and mpe_model.dtype == np.float64
    np.testing.assert_allclose(fc.encode({f: mpe_user[:, j] for j, f in enumerate(fc.features)}), mpe_model,
                               rtol=0, atol=1e-12)


@pytest.mark.mpi
def test_predict_proba_rows_sum_to_one_and_marginal_of_everything_is_the_likelihood(newcomer):
    import mpifc

    fc = mpifc.load(newcomer["model"])
    df = frame(newcomer["queries"])
    p = fc.predict_proba(df)
    assert p.shape == (len(df), len(fc.classes)) and fc.classes == ["no", "yes"]
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert set(fc.predict(df)) <= {"yes", "no"}
    np.testing.assert_allclose(fc.marginal(df, keep=fc.features), fc.log_likelihood(df), rtol=0, atol=1e-12)
    # marginalising a column gives at least the joint's likelihood... of fewer variables: a check
    # that marginal differs from the joint where the column is observed
    assert not np.allclose(fc.marginal(df, keep=["age"]), fc.log_likelihood(df))


@pytest.mark.mpi
@pytest.mark.parametrize("what", QUESTIONS)
def test_the_api_answers_as_mpifc_query_does(newcomer, one_process_answers, what):
    import mpifc

    fc = mpifc.load(newcomer["model"])
    df = frame(newcomer["queries"])
    with open(one_process_answers[what]["one"], newline="") as f:
        ans = list(csv.DictReader(f))
    if what in ("ll", "marginal"):
        api = fc.log_likelihood(df) if what == "ll" else fc.marginal(df, keep=["age", "city"])
        assert np.array_equal(np.array([float(a["log_likelihood"]) for a in ans]), api)
    elif what == "predict":
        p = fc.predict_proba(df)
        assert np.array_equal(np.array([[float(a[f"p_{c}"]) for c in fc.classes] for a in ans]), p)
        assert [a["outcome"] for a in ans] == list(fc.predict(df))
    else:
        # --n-samples 3: each row three times, in row order
        rows = fc.mpe(df) if what == "mpe" else fc.sample(3 * len(df), evidence=df.loc[df.index.repeat(3)], seed=5)
        got = fc.encode({f: [a[f] for a in ans] for f in fc.features})
        want = fc.encode({f: rows[:, j] for j, f in enumerate(fc.features)})
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


@pytest.mark.mpi
def test_simulate_gives_the_model_the_mpi_job_gives(tmp_path):
    import mpifc
    from data_prep.shards import read_test

    shards = tmp_path / "shards"
    assert cli("data_prep", "--dataset", "breast-cancer", "--setting", "hybrid", "--clients", "2", "--seed", "1",
               "--out", str(shards)).returncode == 0
    model = tmp_path / "mpi.h5"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--seed", "3", "--glue", "combinatorial",
                    "--threshold", "0.4", "--min-instances-slice", "40", "--model", str(model), "--quiet"],
                timeout=120)
    assert r.returncode == 0, r.stderr
    mpi = mpifc.load(model)
    sim = mpifc.simulate(shards, seed=3, glue="combinatorial",
                         hyperparameters={"threshold": 0.4, "min_instances_slice": 40}, model=tmp_path / "sim.h5")
    assert sim.fc.num_parameters() == mpi.fc.num_parameters() and len(sim.fc.nodes) == len(mpi.fc.nodes)
    test = read_test(shards)
    x = test.x[:, [test.features.index(f) for f in mpi.features]]
    assert np.array_equal(sim.log_likelihood(x), mpi.log_likelihood(x))
    assert np.array_equal(sim.predict_proba(x), mpi.predict_proba(x))
    assert np.array_equal(sim.sample(50, seed=2, units="model"), mpi.sample(50, seed=2, units="model"))
    assert np.array_equal(mpifc.load(tmp_path / "sim.h5").log_likelihood(x), mpi.log_likelihood(x))
