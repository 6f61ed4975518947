"""MPE and sampling: the per-node steps equal the single-process queries, the distributed passes
equal them exactly (any ψ), bytes follow the closed form, and client sends pass the audit."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from scipy.stats import chisquare

from mpifc.federated.assign import assign
from mpifc.federated.evaluate import log_likelihood, mpe
from mpifc.federated.mpe import mpe_reference, sample_seeded
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.serialize import load_fc
from mpifc.fedpc.evaluate import batches
from mpifc.fedpc.mpe import query_payload
from tests.federated.fixtures import FEATURES, all_binary, binary_table, real_table, split, write_shards
from tests.federated.test_fc_mpi import JOB, assert_ledger_declared, assert_private, read_ledger, train
from tests.mpi_util import run_mpi


def _fc(setting: str):
    x = binary_table(300, seed=3)
    parts = split(x, setting)
    b = OnePassBuilder(n_clusters=2, n_products=3, seed=1, learner="factorized")
    return assign(build_single_process(b, [(d, xi) for d, xi, _ in parts], FEATURES, "y", setting), "flat")


@pytest.mark.parametrize("setting", ["horizontal", "vertical", "hybrid"])
def test_mpe_steps_equal_single_process_mpe(setting):
    fc = _fc(setting)
    ev = binary_table(60, seed=9)
    ev[:, 4] = np.nan
    ev[::3, 0] = np.nan
    ev[1::4, 2] = np.nan
    got = mpe_reference(fc, {f: ev[:, j] for j, f in enumerate(FEATURES)})
    assert np.array_equal(got, mpe(fc, ev))
    assert not np.isnan(got).any()


@pytest.mark.parametrize("setting", ["horizontal", "vertical", "hybrid"])
def test_seeded_sampler_matches_the_circuit_distribution(setting):
    fc = _fc(setting)
    s = sample_seeded(fc, 20_000, seed=5, batch=7_000)
    codes = (s.astype(np.int64) * (2 ** np.arange(len(FEATURES) - 1, -1, -1))).sum(axis=1)
    p = np.exp(log_likelihood(fc, all_binary(len(FEATURES))))
    res = chisquare(np.bincount(codes, minlength=len(p)), p * len(s))
    assert res.pvalue > 1e-3, res  # fixed seed: deterministic
    # The draws depend on the seed, node ids and batch only (not on ψ or the rank order).
    assert np.array_equal(s, sample_seeded(_fc(setting), 20_000, seed=5, batch=7_000))
    assert not np.array_equal(s, sample_seeded(fc, 20_000, seed=6, batch=7_000))


def _query(n, shards, model, tmp, query, batch, name, *extra):
    out, ledger, audit = tmp / f"{name}.h5", tmp / f"{name}.csv", tmp / f"{name}-audit"
    r = run_mpi(n, JOB + ["evaluate", str(shards), "--model", str(model), "--query", query, "--batch", str(batch),
                          "--out", str(out), "--ledger", str(ledger), "--audit", str(audit), "--json", *extra],
                timeout=180)
    assert r.returncode == 0, r.stderr
    with h5py.File(out, "r") as f:
        x = f["x"][()]
    return x, json.loads(r.stdout.strip().splitlines()[-1]), ledger, audit


def _check_bytes(fc, ledger, query, n, batch, client_ranks):
    rows = read_ledger(ledger)
    d = sum(len(c.features) for c in fc.clients.values())
    want: dict[str, int] = {}
    for lo, hi in batches(n, batch):
        for k, v in query_payload(fc, hi - lo, query, d).items():
            want[k] = want.get(k, 0) + v
    for kind, total in want.items():
        assert sum(int(x["payload_bytes"]) for x in rows if x["kind"] == kind) == total, kind
    assert_ledger_declared(rows, client_ranks)
    return rows


@pytest.mark.parametrize("setting,assign_args,n_ranks", [
    ("vertical", [], 4),
    ("horizontal", ["--assign", "tree", "--servers", "2"], 6),
])
def test_distributed_mpe_and_sampling_equal_gathered(setting, assign_args, n_ranks, tmp_path):
    table = real_table if setting == "vertical" else binary_table
    meta = "real" if setting == "vertical" else "discrete"
    shards = write_shards(tmp_path / setting, setting, table(200, 11), table(30, 12), meta)
    r, model, _, _ = train(n_ranks, shards, tmp_path, "--clusters", "2", *assign_args)
    assert r.returncode == 0, r.stderr
    fc = load_fc(model)
    clients = {c.rank for c in fc.clients.values()}
    # MPE of the test rows with the target blanked, distributed == single process, exactly.
    got, res, ledger, audit = _query(n_ranks, shards, model, tmp_path, "mpe", 8, "mpe", "--distributed")
    test = table(30, 12)
    ev = test.copy()
    ev[:, FEATURES.index("y")] = np.nan
    assert np.array_equal(got, mpe(fc, ev))
    assert res["mpe_accuracy"] == float((got[:, 4] == test[:, 4]).mean())
    rows = _check_bytes(fc, ledger, "mpe", 30, 8, clients)
    ev_rows = [x for x in rows if x["kind"] == "fc.query.evidence"]
    assert bool(ev_rows) == (setting != "vertical")  # vertical clients use their own test rows
    assert_private(audit, clients, cooccurrence=False, content=(meta == "real"))
    # Sampling: distributed == the single-process seeded sampler (any ψ), and == --gathered.
    got, res, ledger, audit = _query(n_ranks, shards, model, tmp_path, "sample", 40, "s", "--distributed",
                                     "--n-samples", "100", "--sample-seed", "3")
    assert np.array_equal(got, sample_seeded(fc, 100, 3, 40)) and not np.isnan(got).any()
    _check_bytes(fc, ledger, "sample", 100, 40, clients)
    assert_private(audit, clients, cooccurrence=False, content=(meta == "real"))
    # The same query on the gathered model (evaluate without --distributed), in process.
    from mpifc.fedpc.mpe import query_rank

    out = tmp_path / "sg.h5"
    cfg = {"dir": str(shards), "model": str(model), "distributed": False, "batch": 40, "query": "sample",
           "n_samples": 100, "seed": 3, "out": str(out)}
    assert query_rank(type("Ctx", (), {"rank": 0})(), cfg)["mode"] == "gathered"
    with h5py.File(out, "r") as f:
        assert np.array_equal(got, f["x"][()])
