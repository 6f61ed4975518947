"""launch/bench/fedpc.py: the critical-path figures it derives from the training jobs' timings."""
from __future__ import annotations

import pytest

from tests.script_util import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("launch/bench/fedpc.py", "fedpc_bench")


def _job(clients: dict[str, tuple[float, float]], server: tuple[float, ...]) -> dict:
    return {"client_seconds": {c: {"read": 9.0, "learn": lr, "serialize": s, "em": 0.0}
                               for c, (lr, s) in clients.items()},
            "server_seconds": dict(zip(("plan", "assemble", "deserialize"), server))}


def test_critical_path_is_slowest_client_plus_server(bench) -> None:
    cp = bench.critical_path(_job({"0": (1.0, 0.1), "1": (2.0, 0.2)}, (0.01, 0.02, 0.03)))
    assert cp["client"] == pytest.approx(2.2) and cp["server"] == pytest.approx(0.06)
    assert cp["cp"] == pytest.approx(2.26)  # reading the shard is not in it
    assert cp["clients"] == {"0": pytest.approx(1.1), "1": pytest.approx(2.2)}


def test_client_best_takes_each_clients_best_round(bench) -> None:
    rounds = [_job({"0": (3.0, 0.0), "1": (1.0, 0.0)}, (0.2, 0.0, 0.0)),
              _job({"0": (1.0, 0.0), "1": (2.0, 0.0)}, (0.1, 0.0, 0.0))]
    # per round the slowest client is 3.0 then 2.0; each client's best is 1.0 and 1.0
    assert min(bench.critical_path(j)["cp"] for j in rounds) == pytest.approx(2.1)
    assert bench.client_best_cp(rounds) == pytest.approx(1.0 + 0.1)
    # one round: the same as the headline figure
    assert bench.client_best_cp(rounds[:1]) == pytest.approx(bench.critical_path(rounds[0])["cp"])
