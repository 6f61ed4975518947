"""The k-rows rule (k = 5): no value that fewer than k rows hold stands in what a client sends.

Pieces: the byte search the audit makes (any offset, float64 and float32), histogram edges off
every value, the Gaussian moment guard, the audit stopping a message before it leaves, and, on
adult and credit (when their files are present), every PC a client learns with the default
flags and the codec a model carries."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit.privacy import (MIN_LEAF_ROWS, MomentGuard, find_values, off_value_edges, rare_values,
                                   value_patterns)
from mpifc.errors import PrivacyFinding
from mpifc.fedpc.audit import SendAudit
from mpifc.runtime.kinds import register_kind

_PROBE = register_kind("test.privacy.probe", "model_parameters", "a test message")


def test_rare_values_are_those_fewer_than_k_rows_hold():
    x = np.array([[1.0, 0.5], [1.0, 0.5], [1.0, 0.5], [1.0, 0.25], [1.0, np.nan], [2.0, 0.5]])
    assert MIN_LEAF_ROWS == 5
    assert rare_values(x).tolist() == [0.25, 0.5, 2.0]  # 1.0: five rows; 0.5: four; NaN: no value
    assert rare_values(x, [0]).tolist() == [2.0]
    x[4, 1] = 0.5
    assert rare_values(x).tolist() == [0.25, 2.0]


def test_the_search_finds_a_value_at_any_byte_offset_and_float32_in_float32_arrays():
    rare = np.array([0.123456789, -3.5e-7, 42.0625])
    pats = value_patterns(rare)
    for off in range(9):
        blob = bytes(range(off)) + np.array([7.0, rare[1], 9.0]).tobytes() + b"tail"
        assert find_values(blob, pats)["float64"].tolist() == [rare[1]]
    # a float32 model's parameter widened to float64 is found too
    assert find_values(np.array([np.float32(rare[0])], dtype=np.float64).tobytes(), pats)["float64"].size == 1
    got = find_values(b"", pats, [np.array([1.0, rare[2], rare[0]], dtype=np.float32)])["float32"]
    assert got.size == 2
    assert find_values(np.array([0.1234567891, 42.0626]).tobytes(), pats)["float64"].size == 0


def test_histogram_edges_lie_on_no_value_and_keep_every_value_inside():
    from mpifc.circuit.learnspn import _global_breaks

    rng = np.random.default_rng(0)
    for raw in (rng.integers(17, 91, 300).astype(float), np.round(rng.lognormal(0, 1, 400), 2)):
        col = (raw - raw.mean()) / raw.std()  # a standardised lattice, as data_prep writes it
        edges = off_value_edges(_global_breaks(col, "real", 0), col)
        lattice = (np.arange(raw.min() - 50, raw.max() + 50, 0.01 if raw.max() < 17 else 1.0) - raw.mean()) / raw.std()
        assert not np.isin(edges, col).any() and not np.isin(edges, lattice).any()
        assert np.all(np.diff(edges) > 0) and edges[1] < col.min() and col.max() < edges[-2]
    # a small cluster's rows of such a column (a one-column group of the class glue): its edges
    # miss the whole column's lattice too, equal end gaps included (their shares differ)
    lattice = (np.arange(-100, 200) - 7.3) / 3.1
    for _ in range(500):
        rows = (np.sort(rng.choice(60, rng.integers(6, 25))) - 7.3) / 3.1
        if np.unique(rows).size >= 4:
            assert not np.isin(off_value_edges(_global_breaks(rows, "real", 0), rows), lattice).any()


def test_the_guard_moves_moments_off_the_grid_and_nothing_else():
    rare = np.array([0.3, 1.7])
    guard = MomentGuard(rare)

    class Group(dict):
        pass

    g = Group(mean=np.array([0.3, 0.4]), var=np.array([1.7, 2.0]), min_var=np.array([0.3]),
              breaks=np.array([0.3, 1.7]), sub=Group(leaf_mean=np.array([1.7], dtype=np.float32)))
    guard.apply(g)
    assert g["mean"][1] == 0.4 * (1 + 2.0 ** -40) and g["var"][1] == 2.0 * (1 + 2.0 ** -40)
    assert not np.isin(np.concatenate([g["mean"], g["var"]]), rare).any()
    assert np.allclose(g["mean"], [0.3, 0.4], rtol=1e-11, atol=0)
    assert g["sub"]["leaf_mean"][0] != np.float32(1.7) and abs(g["sub"]["leaf_mean"][0] / 1.7 - 1) < 1e-4
    assert g["min_var"][0] == 0.3 and g["breaks"].tolist() == [0.3, 1.7] and guard.coincidences == 3
    # a mean of five grid values that is a sixth grid value is moved off the grid
    grid = (np.arange(1000) * 0.001 - 0.4) / 0.13
    five = grid[[10, 11, 12, 13, 14]]
    m = np.array([five.mean()])
    assert np.isin(m, grid).any()
    MomentGuard(np.empty(0)).fix(m)
    assert not np.isin(m, grid).any()


class _Transport:
    def __init__(self):
        self.sent = []

    def isend(self, x, dest, kind):
        self.sent.append((kind, x))

    def isend_obj(self, obj, dest, kind):
        self.sent.append((kind, obj))


def test_the_audit_stops_a_message_with_a_rare_value_or_raw_row_before_it_leaves(tmp_path):
    rng = np.random.default_rng(1)
    x = np.round(rng.normal(size=(40, 3)), 3)
    x[:, 2] = np.repeat([0.0, 1.0], 20)  # a discrete column: its codes are no values to search
    t = _Transport()
    audit = SendAudit(2, findings="fail", directory=tmp_path, who="client 1 (rank 2)")
    audit.protect(x, "train", real=[True, True, False], names=["a", "b", "c"])
    audit.install(t)
    t.isend(np.array([x[:, 0].mean(), 1.0, 0.0]), 0, _PROBE)  # aggregates and codes: sent
    with pytest.raises(PrivacyFinding, match=r"client 1 \(rank 2\).*1 value\(s\) that fewer than 5 .*'b'"):
        t.isend(np.frombuffer(b"xyz" + np.array([3.25, x[7, 1]]).tobytes(), dtype=np.uint8), 0, _PROBE)
    with pytest.raises(PrivacyFinding, match="a raw row"):
        t.isend(np.frombuffer(b"q" + x[11].tobytes() + b"r", dtype=np.uint8), 0, _PROBE)
    with pytest.raises(PrivacyFinding, match="'a'"):  # a Python float in a pickle: big-endian bytes
        t.isend_obj({"stats": [1.0, float(x[4, 0])]}, 0, _PROBE)
    t.isend_obj({"mean": float(x[:, 0].mean()), "n": 40}, 0, _PROBE)
    assert len(t.sent) == 2  # no finding left
    summary = (tmp_path / "audit-summary.json").read_text()
    assert '"stopped"' in summary and "test.privacy.probe" in summary
    # record: sent, and counted per kind
    t2 = _Transport()
    rec = SendAudit(2, findings="record")
    rec.protect(x, "train", real=[True, True, False], names=["a", "b", "c"])
    rec.install(t2)
    t2.isend(np.array([x[3, 0], x[5, 1]], dtype=np.float32), 0, _PROBE)
    kinds = rec.summary()["kinds"]["test.privacy.probe"]
    assert len(t2.sent) == 1 and kinds["rare_values"] == 2 and kinds["rare_float32"] == 2
    assert kinds["rare_columns"] == ["a", "b"] and kinds["findings"] == 1


def test_a_row_that_k_rows_share_is_no_finding():
    x = np.array([[0.5, 2.0]] * 6 + [[0.25, 3.0]])
    t = _Transport()
    audit = SendAudit(1, findings="fail")
    audit.protect(x, "train")
    audit.install(t)
    t.isend(np.array([9.0, 0.5, 2.0, 9.0]), 0, _PROBE)  # six rows hold (0.5, 2.0): nobody's in particular
    with pytest.raises(PrivacyFinding):
        t.isend(np.array([9.0, 0.25, 3.0]), 0, _PROBE)


def test_the_audit_finds_a_wide_row_or_column_at_any_byte_offset_and_nothing_else():
    # 2,000 columns: the search key reads a few words of a row, the match is word for word
    rng = np.random.default_rng(4)
    x = np.round(rng.normal(size=(20, 2_000)), 4)
    audit = SendAudit(1, findings="record")
    audit.protect(x, "train")
    for off in range(8):
        row = np.frombuffer(rng.bytes(off) + x[13].tobytes() + rng.bytes(5), dtype=np.uint8)
        col = np.frombuffer(rng.bytes(off) + np.ascontiguousarray(x[:, 1_234]).tobytes(), dtype=np.uint8)
        assert audit._has_raw_row(row) and not audit._has_raw_column(row)
        assert audit._has_raw_column(col) and not audit._has_raw_row(col)
    for j in (1, 999, 1_998):  # one word changed anywhere: no row of the set
        near = x[13].copy()
        near[j] += 1.0
        near_col = x[:, 1_234].copy()
        near_col[j % 20] += 1.0
        assert not audit._has_raw_row(np.frombuffer(b"ab" + near.tobytes(), dtype=np.uint8))
        assert not audit._has_raw_column(np.frombuffer(near_col.tobytes(), dtype=np.uint8))


# one case here; every dataset, setting and learner through real jobs: launch/bench/privacy.py
@pytest.mark.parametrize("dataset,setting", [("credit", "vertical")])
def test_default_pcs_and_codec_of_adult_and_credit_hold_no_rare_value(tmp_path, dataset, setting):
    from data_prep.prepare import prepare
    from data_prep.shards import load_manifest, write_shards
    from mpifc.fedpc.audit import codec_values
    from mpifc.fedpc.data import read_client_data
    from mpifc.fedpc.job import resolve_glue_and_refine
    from mpifc.fedpc.train import builder_from_config, client_rare_values, model_codec
    from mpifc.federated.one_pass import run_client_tasks
    from mpifc.federated.wire_format import model_to_bytes, set_release_guard

    try:
        prep = prepare(dataset=dataset, setting=setting, clients=2, seed=0, max_rows=800)
    except Exception as e:  # noqa: BLE001 - the data files are optional
        pytest.skip(f"{dataset} not available: {e}")
    shards = tmp_path / "shards"
    write_shards(prep, shards)
    m = load_manifest(shards)
    cfg = resolve_glue_and_refine({"products": 4, "seed": 0, "learner": "learnspn", "glue": None, "clusters": None,
                                   "hyperparameters": {}, "defaults": "adaptive", "assign": "flat"}, m)
    data = [read_client_data(shards, c) for c in range(m.n_clients)]
    plan = builder_from_config(cfg).plan([d.declaration for d in data], m.feature_order, m.target, m.setting)
    for c, d in enumerate(data):
        rare = client_rare_values(d.shard)
        assert rare.size > 0
        guard = MomentGuard(rare)
        set_release_guard(guard)
        try:
            report = run_client_tasks(plan, c, d.shard.x_train, d.shard.features, x_valid=d.shard.x_valid)
            blobs = [model_to_bytes(leaf.model) for leaf in report.leaves]
        finally:
            set_release_guard(None)
        assert all(leaf.n_rows >= MIN_LEAF_ROWS for leaf in report.leaves)
        pats = value_patterns(rare)
        assert sum(find_values(b, pats)["float64"].size for b in blobs) == 0, (c, guard.moved)
    # the codec: no level, knot, imputed value or encoding is a value fewer than k rows hold
    table = prep.table
    numeric = [j for j, mt in enumerate(table.meta_types) if mt != "categorical"]
    raw, units = codec_values({"codec": model_codec(m)})
    assert raw.size > 0 and not np.isin(raw, rare_values(table.x, numeric)).any()
