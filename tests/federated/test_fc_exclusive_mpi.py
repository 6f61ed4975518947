"""Exclusive timing (clients learn one after another, mpifc.fedpc.train) changes nothing but
the timing: same model, same messages and bytes per phase as the default (contended) run."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np

from mpifc.federated.evaluate import log_likelihood
from mpifc.federated.serialize import load_fc
from tests.federated.fixtures import real_table, write_shards
from tests.federated.test_fc_mpi import JOB, read_ledger
from tests.mpi_util import run_mpi



def _train(extra, shards, tmp, name):
    model, ledger = tmp / f"{name}.h5", tmp / f"{name}.csv"
    r = run_mpi(4, JOB + ["train", str(shards), *extra, "--learner", "factorized",
                                  "--glue", "cooccurrence", "--clusters", "2", "--model", str(model),
                                  "--ledger", str(ledger), "--json"], timeout=180)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    rows = Counter((x["phase"], x["kind"], x["src"], x["dst"], x["payload_bytes"]) for x in read_ledger(ledger)
                   if not x["kind"].startswith("runtime."))
    return summary, load_fc(model), rows


def test_exclusive_timing_same_model_and_messages(tmp_path):
    shards = write_shards(tmp_path / "v", "vertical", real_table(240, 7), real_table(40, 8), "real")
    s_c, fc_c, rows_c = _train([], shards, tmp_path, "contended")
    s_x, fc_x, rows_x = _train(["--exclusive-timing"], shards, tmp_path, "exclusive")
    assert s_c["timing_mode"] == "contended" and s_x["timing_mode"] == "exclusive"
    assert rows_x == rows_c and s_x["bytes_train"] == s_c["bytes_train"]
    q = real_table(50, 9)
    ll = log_likelihood(fc_x, q)
    assert np.all(np.isfinite(ll)) and np.array_equal(ll, log_likelihood(fc_c, q))
    assert set(s_x["client_seconds"]) == set(s_c["client_seconds"]) and len(s_x["client_seconds"]) == 3
