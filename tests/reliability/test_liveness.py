"""Liveness never trips on honest work, waiting ranks do not burn a core, and the limits are checked."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.federated.fixtures import write_shards
from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi
WAITS = "launch/bench/idle_wait.py"  # its rank side; the benchmark itself prints the figures beside a busy wait


def _long_fit_shards(folder, n: int, d: int = 16):
    """One client holding ``n`` rows of ``d`` non-linearly dependent real columns (a LearnSPN fit
    of several seconds with a small slice size) and a binary label."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(n + 50, 4))
    cols = [np.sin(z[:, i % 4] * (1 + i)) + 0.3 * rng.normal(size=n + 50) for i in range(d)]
    x = np.column_stack(cols + [(z[:, 0] > 0).astype(np.float64)])
    features = tuple(f"f{i}" for i in range(d)) + ("y",)
    return write_shards(folder, "horizontal", x[:n], x[n:], meta_type="real", features=features,
                        layouts=[(features, slice(None))])


def test_a_long_honest_fit_never_trips_liveness(tmp_path):
    # A short limit on the command line: the fit outlasts it several times over in a few seconds
    # (on a fast machine the table grows until it does).
    liveness = 0.3
    for n in (600, 1_200, 2_400, 4_800):
        shards = _long_fit_shards(tmp_path / str(n), n=n)
        model = tmp_path / f"m{n}.h5"
        r = run_mpi(2, ["-m", "mpifc", "train", str(shards), "--learner", "learnspn", "--clusters", "1",
                        "--threshold", "0.1", "--min-instances-slice", "10", "--model", str(model),
                        "--liveness", str(liveness), "--json"], timeout=600)
        assert r.returncode == 0, r.stderr
        assert model.is_file()
        learn = json.loads(r.stdout.strip().splitlines()[-1])["client_seconds_wall"]["0"]["learn"]
        if learn > 3 * liveness:
            return
    pytest.fail(f"the largest fit took {learn:.1f} s, not more than {3 * liveness} s")


WAIT_KINDS = ("recv", "barrier", "send", "recv_any", "await")


@pytest.fixture(scope="module")
def idle_waits() -> dict[str, dict]:
    r = run_mpi(2, [WAITS, "--rank-side", "2", *WAIT_KINDS], timeout=300)
    assert r.returncode == 0, r.stderr
    return {d["wait"]: d for d in map(json.loads, r.stdout.strip().splitlines())}


@pytest.mark.parametrize("wait", WAIT_KINDS)
def test_a_waiting_rank_sleeps_instead_of_spinning(idle_waits, wait):
    """A sleeping wait polls a bounded number of times a second whatever the load (some 50 once
    it has lasted), so its CPU share stays near 1-2 % (the precise figures, beside a busy wait
    measured in the same run: launch/bench/idle_wait.py). The bound here is 25 %: costlier
    wake-ups on a loaded machine stay far below it, and a wait that spins (a blocking MPI wait,
    some 100 % of a core on an idle machine) is far above it."""
    got = idle_waits[wait]
    assert got["wall"] >= 2.0, got
    assert got["cpu"] / got["wall"] < 0.25, got  # process CPU time: every thread of the waiting rank


@pytest.mark.parametrize("flag", ["--deadline", "--liveness"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_limits_must_be_positive(tmp_path, flag, value):
    shards = _long_fit_shards(tmp_path / "shards", n=200, d=3)
    r = run_mpi(2, ["-m", "mpifc", "train", str(shards), "--learner", "factorized", "--model", str(tmp_path / "m.h5"),
                    flag, value], timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"{flag} must be > 0 seconds, got {float(value):g}" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count("mpifc:") == 1, r.stderr
    assert not (tmp_path / "m.h5").exists()
