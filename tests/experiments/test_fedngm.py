"""``mpifc experiment fedngm --quick``: FedNGM (MPI job) and FedPC on the same Adult segment split."""
from __future__ import annotations

import csv
import math

import pytest

from mpifc.experiments import registry

PNG = b"\x89PNG\r\n\x1a\n"


def _adult_available() -> bool:
    from data_prep.files import default_data_root

    return (default_data_root() / "adult").exists()


pytestmark = [pytest.mark.mpi, pytest.mark.data,
              pytest.mark.skipif(not _adult_available(), reason="Adult data not found under the data root")]


@pytest.fixture(scope="module")
def quick_fedngm(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick-fedngm")
    return out, registry.get("fedngm").run(out, [0], True, progress=False)


def test_fedngm_is_registered():
    assert "fedngm" in registry.names()


def test_quick_fedngm_writes_its_files_atomically(quick_fedngm):
    out, summary = quick_fedngm
    for name in ("fedngm_metrics.csv", "fedngm_summary.csv", "fedngm_costs.csv", "fedngm.md", "fedngm.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "fedngm.png").read_bytes()[:8] == PNG
    assert not list(out.rglob("*.tmp"))
    assert "## public test data" in summary["markdown"] and "FedPC" in summary["markdown"]


def test_quick_fedngm_scores_every_model_on_every_test_set(quick_fedngm):
    _, summary = quick_fedngm
    recs = summary["records"]
    ngm = {"client0-NGM", "client1-NGM", "client2-NGM", "global-NGM"}
    tests = {"client0 private", "client1 private", "client2 private", "public"}
    for model in ngm:
        for test in tests:
            got = {r["target"]: r for r in recs if r["model"] == model and r["test"] == test}
            assert set(got) == {"age", "hours-per-week", "income", "occupation"}, (model, test)
            assert got["age"]["kind"] == "real" and got["hours-per-week"]["kind"] == "real"
            assert got["income"]["kind"] == "binary" and 0.0 <= got["income"]["auc"] <= 1.0
            assert got["occupation"]["kind"] == "multiclass"
            assert 0.0 <= got["occupation"]["macro_recall"] <= 1.0
            # Age in years: an NGM that predicts anything sensible is within decades.
            assert 0.0 < got["age"]["mae"] < 20.0
    fedpc = [r for r in recs if r["model"] == "FedPC"]
    assert len(fedpc) == 1 and 0.5 < fedpc[0]["accuracy"] <= 1.0


def test_quick_fedngm_costs_come_from_the_ledgers(quick_fedngm):
    out, summary = quick_fedngm
    costs = {c["method"]: c for c in summary["costs"]}
    assert set(costs) == {"FedNGM", "FedPC"}
    for method, c in costs.items():
        assert c["clients"] == 3 and c["bytes_train"] > 0 and c["model_file_bytes"] > 0, method
        ledger = (out / "models" / "seed0" / "fold0" / "ledger.csv") if method == "FedNGM" else \
            (out / "models" / "seed0" / "fedpc.ledger.csv")
        with open(ledger, newline="") as fh:
            assert c["bytes_train"] == sum(int(r["total_bytes"]) for r in csv.DictReader(fh))
    assert math.isfinite(costs["FedNGM"]["parameters"])
