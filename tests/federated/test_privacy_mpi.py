"""The privacy audit in real ``mpiexec`` jobs on breast cancer: a finding ends the job (exit 3,
one line, no model or ledger), with ``--audit`` or without (the models a client sends are
always checked), unless ``--audit-findings record`` says otherwise, which the model records.
Default jobs hold no value that fewer than 5 rows hold, in any message or in the model file:
``test_defaults_mpi.py`` (three settings), ``launch/bench/privacy.py`` (every setting, learner
and dataset)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpifc.cli.prep import run as prep_run
from mpifc.federated.serialize import load_fc
from tests.mpi_util import run_mpi

LEAKY = str(Path(__file__).with_name("leaky_train.py"))


@pytest.fixture(scope="module")
def vertical_bc(tmp_path_factory):
    shards = tmp_path_factory.mktemp("privacy") / "bc"
    prep_run(["--dataset", "breast-cancer", "--setting", "vertical", "--clients", "3", "--seed", "0",
              "--out", str(shards)])
    return shards


def test_a_finding_ends_the_job_with_exit_3_one_line_and_no_model(vertical_bc, tmp_path):
    # no --audit: the models a client sends are checked all the same; one leaky client, so one
    # finding (several clients that find at once each name themselves)
    model, ledger = tmp_path / "m.h5", tmp_path / "l.csv"
    r = run_mpi(4, [LEAKY, "train", str(vertical_bc), "--learner", "factorized", "--client-learner", "1=leaky",
                    "--model", str(model), "--ledger", str(ledger)], timeout=300)
    assert r.returncode == 3, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mpifc:")]
    assert len(lines) == 1 and "PrivacyFinding: privacy audit: client 1 (rank 2)" in lines[0], r.stderr
    assert "fc.train.model" in lines[0] and "a raw row" in lines[0] and "no model is written" in lines[0]
    assert not model.exists() and not ledger.exists()


def test_record_sends_the_finding_counts_it_per_kind_and_the_model_says_so(vertical_bc, tmp_path):
    model, audit = tmp_path / "m.h5", tmp_path / "aud"
    r = run_mpi(4, [LEAKY, "train", str(vertical_bc), "--learner", "leaky", "--model", str(model),
                    "--audit", str(audit), "--audit-findings", "record"], timeout=300)
    assert r.returncode == 0, r.stderr
    assert load_fc(model, load_models=False).meta["privacy"] == {"k": 5, "audit": "every message",
                                                                  "findings": "record"}
    summary = json.loads((audit / "audit-summary.json").read_text())
    found = summary["kinds"]["fc.train.model"]
    assert found["raw_rows"] > 0 and found["rare_values"] > 0 and summary["findings"] == found["findings"] > 0
    assert summary["kinds"]["fc.train.counts"]["findings"] == 0 and summary["stopped"] is None
