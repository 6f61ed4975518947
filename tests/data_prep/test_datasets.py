"""Loaders: real data when ../shared/data is present (else skipped), idx on made-up files."""
from __future__ import annotations

import gzip
import struct
import zipfile

import numpy as np
import pytest

from data_prep import shards as S
from data_prep.datasets import load_dataset
from data_prep.prepare import prepare
from mpifc.errors import UserError

from .conftest import needs_data


def _write_idx(path, arr):
    header = struct.pack(">4B", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_mnist_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 4, 4)))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    table = load_dataset("mnist", tmp_path)
    assert table.x.shape == (40, 16) and table.image_shape == (4, 4)
    assert table.own_test.sum() == 10 and table.features[5] == "px_1_1"
    assert table.pixel == {"levels": 256, "file_scale": 1.0}
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x09\x01"))
    with pytest.raises(UserError, match="not an idx file"):
        load_dataset("mnist", tmp_path)


def test_debd_malformed_line_is_named(tmp_path):
    for split in ("ts", "valid", "test"):
        (tmp_path / f"toy.{split}.data").write_text("0,1,1\n1,0,1\n")
    (tmp_path / "toy.valid.data").write_text("0,1,1\n1,2,1\n")
    with pytest.raises(UserError, match=r"toy\.valid\.data line 2: '2' is not 0 or 1"):
        load_dataset("debd:toy", tmp_path)
    with pytest.raises(UserError, match="debd needs a set name"):
        load_dataset("debd", tmp_path)
    (tmp_path / "toy.valid.data").unlink()
    (tmp_path / "toy.valid.data.gz").write_bytes(gzip.compress(b"0,1,1\n" * 50)[:-12])
    with pytest.raises(UserError, match=r"toy\.valid\.data\.gz: cannot read"):
        load_dataset("debd:toy", tmp_path)


ADULT_ROW = "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, " \
            "Not-in-family, White, Male, 2174, 0, 40, United-States, "


def test_adult_files_junk_line_full_stops_and_missing(tmp_path):
    (tmp_path / "adult.data").write_text(ADULT_ROW + "<=50K\n" +
                                         ADULT_ROW.replace("State-gov", "?") + ">50K\n\n")
    test = "|1x3 Cross validator\n" + ADULT_ROW + ">50K.\n"
    (tmp_path / "adult.test").write_text(test)
    table = load_dataset("adult", tmp_path)
    assert table.x.shape == (3, 14) and table.classes == ["<=50K", ">50K"]
    assert table.y.tolist() == [0, 1, 1] and table.own_test.tolist() == [False, False, True]
    assert np.isnan(table.x[1, 1]) and table.categories["workclass"] == ["State-gov"]
    (tmp_path / "adult.test").write_text(test + "25, Private\n")
    with pytest.raises(UserError, match=r"adult\.test line 3: expected 15 fields, got 2"):
        load_dataset("adult", tmp_path)


CREDIT_HEAD = (",SeriousDlqin2yrs,RevolvingUtilizationOfUnsecuredLines,age,DebtRatio,"
               "MonthlyIncome,NumberOfDependents")


def test_credit_from_a_zip_drops_the_index_and_reads_na(tmp_path):
    rows = [CREDIT_HEAD, "1,1,0.76,45,0.80,9120,2", "2,0,0.95,40,0.12,NA,1",
            "3,0,0.65,38,0.08,3042,NA"]
    with zipfile.ZipFile(tmp_path / "cs-training.csv.zip", "w") as zf:
        zf.writestr("cs-training.csv", "\n".join(rows) + "\n")
    table = load_dataset("credit", tmp_path)
    assert table.features == ["RevolvingUtilizationOfUnsecuredLines", "age", "DebtRatio",
                              "MonthlyIncome", "NumberOfDependents"]
    assert table.y.tolist() == [1, 0, 0] and table.classes == [0, 1]
    assert np.isnan(table.x[1, 3]) and np.isnan(table.x[2, 4])
    assert table.meta_types[1] == "discrete"


def test_credit_without_its_target_column(tmp_path):
    (tmp_path / "cs-training.csv").write_text(",age,DebtRatio\n1,45,0.8\n")
    with pytest.raises(UserError, match="no target column 'SeriousDlqin2yrs'"):
        load_dataset("credit", tmp_path)


@needs_data("adult")
def test_adult_hybrid(tmp_path):
    prepared = prepare(dataset="adult", setting="hybrid", clients=3, max_rows=3000)
    table = prepared.table
    assert table.source_splits == {"train": [0, 32561], "test": [32561, 48842]}, \
        "junk first line of adult.test skipped"
    assert table.classes == ["<=50K", ">50K"], "test labels' full stops stripped"
    assert len(table.features) == 14
    m = S.write_shards(prepared, tmp_path / "out")
    assert m.n_clients == 3 and m.raw["n_train"] == 2000 and m.raw["n_test"] == 1000
    for name in ("workclass", "occupation", "native-country"):
        assert m.preprocessing["missing"][name]["train"] > 0
    shards = [S.read_client(tmp_path / "out", i) for i in range(3)]
    assert not any(np.isnan(c.x_train).any() for c in shards)
    shared = set(shards[0].features) & set(shards[1].features) & set(shards[2].features)
    assert shared - {"income"} == set(m.raw["partition"]["shared_features"])
    assert len({int(i) for c in shards for i in c.ids_train}) == 2000


@needs_data("credit")
def test_credit_missing_values_and_index_column():
    prepared = prepare(dataset="credit", setting="horizontal", clients=2, max_rows=3000)
    fields = prepared.manifest_fields()
    assert len(fields["feature_order"]) == 11 and fields["target"] == "SeriousDlqin2yrs"
    assert "" not in fields["feature_order"], "the unnamed index column is dropped"
    assert fields["preprocessing"]["missing"]["MonthlyIncome"]["train"] > 0
    assert fields["classes"] == [0, 1]
    shard = prepared.client_shard(0)
    assert not np.isnan(shard.x_train).any()


@needs_data("mnist")
def test_mnist_label_split_one_digit_per_client():
    prepared = prepare(dataset="mnist", setting="horizontal", split="label", clients=10,
                       max_rows=2000)
    fields = prepared.manifest_fields()
    assert fields["image"] == {"shape": [28, 28], "levels": 256, "range": [0, 255],
                               "file_scale": 1 / 256}
    assert fields["preprocessing"]["standardize"] is False
    digits = set()
    for i in range(10):
        shard = prepared.client_shard(i)
        labels = np.unique(shard.x_train[:, -1])
        assert labels.size == 1
        digits.add(int(labels[0]))
        px = shard.x_train[:, :-1]
        assert px.shape[1] == 784 and np.all(px == np.round(px)) and px.max() <= 255
    assert digits == set(range(10))


@needs_data("debd")
def test_debd_vertical():
    prepared = prepare(dataset="debd:nltcs", setting="vertical", clients=2)
    fields = prepared.manifest_fields()
    assert fields["target"] is None and len(fields["feature_order"]) == 16
    assert fields["source"]["splits"]["valid"] == [16181, 18338]
    assert prepared.test_rows.size == 3236
    a, b = prepared.client_shard(0), prepared.client_shard(1)
    assert np.array_equal(a.ids_train, b.ids_train)
    assert set(np.unique(a.x_train)) <= {0.0, 1.0}
