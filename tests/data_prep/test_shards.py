"""Shards written to disk reassemble to the source; alignment, overlap, checksums, atomicity."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data_prep import shards as S
from data_prep.prepare import PrepConfig, prepare, prepare_table
from mpifc.errors import UserError

from .conftest import make_images, make_table


def _prep(table=None, **kw):
    cfg = dict(setting="horizontal", clients=3, seed=0)
    cfg.update(kw)
    return prepare_table(make_table(own_test=True) if table is None else table,
                         PrepConfig(**cfg))


def _read_all(out):
    m = S.load_manifest(out)
    return m, [S.read_client(out, i) for i in range(m.n_clients)], S.read_test(out)


def _reassemble(manifest, clients, rows_of):
    """Scatter the clients' train cells into a NaN matrix over (source row, feature_order)."""
    order = manifest.feature_order
    full = np.full((len(rows_of), len(order)), np.nan)
    hits = np.zeros(full.shape, dtype=int)
    for c in clients:
        cols = [order.index(f) for f in c.features]
        rows = np.array([rows_of[i] for i in c.ids_train])
        full[np.ix_(rows, cols)] = c.x_train
        hits[np.ix_(rows, cols)] += 1
    return full, hits


RAW = dict(encode="none", impute=False, standardize=False)  # shards = the source values


@pytest.mark.parametrize("setting,clients,split", [
    ("central", 1, "iid"), ("horizontal", 3, "iid"), ("horizontal", 2, "label"),
    ("horizontal", 3, "dirichlet"), ("vertical", 3, "iid"), ("hybrid", 3, "iid"),
])
def test_shards_reassemble_exactly_to_the_source(tmp_path, setting, clients, split):
    table = make_table(own_test=True)
    prepared = _prep(table, setting=setting, clients=clients, split=split, **RAW)
    S.write_shards(prepared, tmp_path / "out")
    m, shards, test = _read_all(tmp_path / "out")
    train = np.flatnonzero(~table.own_test)
    source = np.column_stack([table.x, table.y])  # the raw values over feature_order
    rows_of = {int(table.ids[r]): k for k, r in enumerate(train)}
    full, hits = _reassemble(m, shards, rows_of)
    covered = hits > 0
    assert np.array_equal(full[covered], source[train][covered], equal_nan=True)
    assert covered.any(axis=1).all(), "every train row is on some client"
    assert covered.any(axis=0).all(), "every feature is on some client"
    if setting != "hybrid":
        assert (hits == 1).all(), "each train cell on exactly one client"
    # the test set and each client's test rows are the source's test rows
    test_rows = np.flatnonzero(table.own_test)
    assert np.array_equal(test.ids, table.ids[test_rows])
    assert np.array_equal(test.x, source[test_rows], equal_nan=True)
    for c in shards:
        pos = np.searchsorted(test.ids, c.ids_test)
        cols = [m.feature_order.index(f) for f in c.features]
        assert np.array_equal(c.x_test, test.x[np.ix_(pos, cols)], equal_nan=True)
    assert sum(c.x_test.shape[0] for c in shards) == (
        len(test_rows) * (clients if setting == "vertical" else 1))


def test_preprocessed_shards_match_the_fitted_transform(tmp_path):
    table = make_table(own_test=True)
    prepared = _prep(table, setting="vertical", clients=2)
    S.write_shards(prepared, tmp_path / "out")
    m, shards, test = _read_all(tmp_path / "out")
    expected = prepared.preprocessor.transform(table.x[~table.own_test])
    for c in shards:
        cols = [table.features.index(f) for f in c.features if f != "label"]
        assert np.array_equal(c.x_train[:, :len(cols)], expected[:, cols])
        assert not np.isnan(c.x_train).any()
    assert m.preprocessing["missing"]["real_a"]["train"] == int(
        np.isnan(table.x[~table.own_test, 0]).sum())
    # a target-encoded categorical is its categories as levels; a 7-valued count, levels too
    assert m.features["cat_a"] == {"meta_type": "discrete", "raw_meta_type": "categorical",
                                   "n_categories": 3}
    assert m.features["disc"] == {"meta_type": "discrete", "raw_meta_type": "discrete", "n_categories": 7}
    assert m.features["real_a"]["meta_type"] == "real"
    assert m.features["label"]["meta_type"] == "discrete"


@pytest.mark.parametrize("owner,expected", [(None, [True, False, False]),
                                            (2, [False, False, True]),
                                            ("all", [True, True, True])])
def test_vertical_shards_are_sample_aligned_and_label_on_its_owner(tmp_path, owner, expected):
    S.write_shards(_prep(setting="vertical", label_owner=owner), tmp_path / "out")
    m, shards, _ = _read_all(tmp_path / "out")
    for c in shards[1:]:
        assert np.array_equal(c.ids_train, shards[0].ids_train)
        assert np.array_equal(c.ids_test, shards[0].ids_test)
    assert [("label" in c.features) for c in shards] == expected
    own = [set(c.features) - {"label"} for c in shards]
    assert sum(len(f) for f in own) == len(set().union(*own)) == 5, "disjoint, complete"
    assert m.label_owner == (0 if owner is None else owner)


def test_hybrid_shares_features_on_disjoint_samples(tmp_path):
    S.write_shards(_prep(setting="hybrid", clients=2, shared_features=2), tmp_path / "out")
    m, shards, _ = _read_all(tmp_path / "out")
    shared = set(m.raw["partition"]["shared_features"])
    assert len(shared) == 2
    a, b = (set(c.features) for c in shards)
    assert shared <= (a & b) and (a & b) - {"label"} == shared, "overlap is the shared block"
    assert a - b and b - a, "each client also has private features"
    assert not set(shards[0].ids_train) & set(shards[1].ids_train), "disjoint samples"
    assert "label" in a and "label" in b


def test_label_split_shards_hold_only_their_classes(tmp_path):
    prepared = prepare_table(make_images(n=400), PrepConfig(setting="horizontal", clients=4,
                                                            split="label"))
    S.write_shards(prepared, tmp_path / "out")
    m, shards, _ = _read_all(tmp_path / "out")
    owners = m.raw["partition"]["class_owners"]
    for c in shards:
        mine = {k for k, who in enumerate(owners) if c.index in who}
        assert set(np.unique(c.x_train[:, -1]).astype(int)) == mine
        assert set(np.unique(c.x_test[:, -1]).astype(int)) <= mine


def test_image_vertical_patches_and_pixel_levels(tmp_path):
    images = make_images(side=6)
    S.write_shards(prepare_table(images, PrepConfig(setting="vertical", clients=4)),
                   tmp_path / "out")
    m, shards, test = _read_all(tmp_path / "out")
    pixels = [set(c.features) - {"label"} for c in shards]
    assert all(len(p) == 9 for p in pixels) and len(set().union(*pixels)) == 36
    assert "px_0_0" in pixels[0] and "px_2_2" in pixels[0], "client 0 has the top-left 3x3"
    assert np.array_equal(test.x[:, :36], images.x[test.ids]), "ids are table rows here"
    assert m.raw["image"] == {"shape": [6, 6], "levels": 16, "range": [0, 15], "file_scale": 1.0}
    assert m.preprocessing["standardize"] is False
    x = shards[1].x_train
    assert np.all(x == np.round(x)) and x.max() <= 15, "un-standardized integer levels"


def test_hybrid_images_use_overlapping_patches_on_disjoint_samples(tmp_path):
    S.write_shards(prepare_table(make_images(side=8), PrepConfig(setting="hybrid", clients=2,
                                                                 overlap=1)), tmp_path / "out")
    _, shards, _ = _read_all(tmp_path / "out")
    a, b = (set(c.features) - {"label"} for c in shards)
    assert a & b and a - b and b - a
    assert not set(shards[0].ids_train) & set(shards[1].ids_train)


def test_same_seed_same_bytes_other_seed_other_shards(tmp_path):
    def digests(seed, name):
        S.write_shards(_prep(seed=seed, split="dirichlet"), tmp_path / name)
        return [c["sha256"] for c in S.load_manifest(tmp_path / name).clients]

    assert digests(3, "a") == digests(3, "b")
    assert digests(3, "a") != digests(4, "c")


def test_flipped_byte_is_caught_on_read(tmp_path):
    out = tmp_path / "out"
    S.write_shards(_prep(), out)
    path = out / "client-1.h5"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"client-1\.h5: checksum mismatch"):
        S.read_client(out, 1)
    S.read_client(out, 0)  # the other shards are still fine
    (out / "test.h5").write_bytes(b"garbage")
    with pytest.raises(UserError, match=r"test\.h5: checksum mismatch"):
        S.read_test(out)
    with pytest.raises(UserError, match="not a readable HDF5 file"):
        S.read_test(out, verify=False)


def test_reader_errors_name_the_file(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError, match="manifest.json: not found"):
        S.load_manifest(out)
    S.write_shards(_prep(), out)
    with pytest.raises(UserError, match="no client 7"):
        S.read_client(out, 7)
    os.remove(out / "client-2.h5")
    with pytest.raises(UserError, match=r"client-2\.h5: shard file not found"):
        S.read_client(out, 2)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format"] = "other/9"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="format 'other/9'"):
        S.load_manifest(out)


class _Failing:
    """A shard source whose second client fails half-way through a write."""

    def __init__(self, prepared):
        self.inner = prepared
        self.n_clients = prepared.n_clients

    def client_shard(self, i):
        if i == 1:
            raise RuntimeError("disk full")
        return self.inner.client_shard(i)

    def test_set(self):
        return self.inner.test_set()

    def manifest_fields(self):
        return self.inner.manifest_fields()


def test_failed_write_leaves_the_previous_directory_untouched(tmp_path):
    out = tmp_path / "out"
    first = S.write_shards(_prep(seed=1), out)
    with pytest.raises(RuntimeError, match="disk full"):
        S.write_shards(_Failing(_prep(seed=2)), out)
    assert S.load_manifest(out).clients == first.clients
    S.read_client(out, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no temp dirs left"
    S.write_shards(_prep(seed=2), out)  # a good write replaces the old set
    assert S.load_manifest(out).seed == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("precious")
    with pytest.raises(UserError, match="refusing to overwrite"):
        S.write_shards(_prep(), tmp_path / "notes")
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "precious"


def test_in_memory_api_matches_the_files(tmp_path):
    prepared = prepare(dataset="breast-cancer", setting="hybrid", clients=2, seed=5)
    S.write_shards(prepared, tmp_path / "out")
    for i in range(2):
        mem, disk = prepared.client_shard(i), S.read_client(tmp_path / "out", i)
        assert mem.features == disk.features and mem.meta_types == disk.meta_types
        assert np.array_equal(mem.x_train, disk.x_train)
        assert np.array_equal(mem.ids_test, disk.ids_test)
    m = S.load_manifest(tmp_path / "out")
    assert m.raw["n_train"] + m.raw["n_test"] == 569
    assert m.raw["n_test"] == round(0.2 * 569)


def test_nan_only_where_missing_and_counted_in_the_manifest(tmp_path):
    table = make_table(own_test=True)
    # codes kept: with --encode target a missing category gets its own encoded value
    S.write_shards(_prep(table, impute=False, encode="none"), tmp_path / "out")
    m, shards, test = _read_all(tmp_path / "out")
    counted = m.preprocessing["missing"]
    assert set(counted) == {"real_a", "cat_b"}, "only the columns that have missing values"
    for name in m.feature_order:
        col = m.feature_order.index(name)
        in_train = sum(int(np.isnan(c.x_train[:, c.features.index(name)]).sum())
                       for c in shards)
        expected = counted.get(name, {"train": 0, "test": 0})
        assert in_train == expected["train"]
        assert int(np.isnan(test.x[:, col]).sum()) == expected["test"]
    assert counted["real_a"]["train"] > 0


def test_hybrid_label_on_one_client(tmp_path):
    S.write_shards(_prep(setting="hybrid", clients=2, label_owner=1), tmp_path / "out")
    m, shards, _ = _read_all(tmp_path / "out")
    assert ["label" in c.features for c in shards] == [False, True]
    assert m.label_owner == 1
