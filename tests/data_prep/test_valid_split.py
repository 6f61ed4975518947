"""A dataset's own validation split (DEBD's NAME.valid) in the shards: kept out of every client's
training rows by default (``valid/`` per client), merged into them with ``--valid merge`` (the
bytes of the format before ``valid/`` existed), and older shard folders still readable."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from data_prep import shards as S
from data_prep.prepare import prepare
from mpifc.cli.prep import run as prep_run
from mpifc.errors import UserError

SIZES = {"ts": 300, "valid": 90, "test": 60}


@pytest.fixture()
def debd_root(tmp_path):
    """A toy DEBD set ``debd:toy``: 5 binary columns, files of 300 / 90 / 60 rows."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "data" / "debd"
    folder.mkdir(parents=True)
    for split, n in SIZES.items():
        rows = rng.integers(0, 2, (n, 5))
        (folder / f"toy.{split}.data").write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return tmp_path / "data"


def _ids(split: str) -> set[int]:
    lo = {"ts": 0, "valid": SIZES["ts"], "test": SIZES["ts"] + SIZES["valid"]}[split]
    return set(range(lo, lo + SIZES[split]))


@pytest.mark.parametrize("setting,clients", [("central", 1), ("horizontal", 3), ("vertical", 2), ("hybrid", 2)])
def test_kept_validation_rows_are_the_valid_file_split_like_the_train_rows(debd_root, setting, clients):
    prepared = prepare(dataset="debd:toy", data_root=str(debd_root), setting=setting, clients=clients, seed=1)
    parts = [prepared.client_shard(i) for i in range(clients)]
    train = [set(p.ids_train.tolist()) for p in parts]
    valid = [set(p.ids_valid.tolist()) for p in parts]
    assert all(t <= _ids("ts") for t in train) and all(v <= _ids("valid") for v in valid)
    if setting in ("central", "vertical"):
        assert all(v == _ids("valid") for v in valid)  # every client holds every row
    else:
        assert set().union(*valid) == _ids("valid") and sum(map(len, valid)) == SIZES["valid"]
        assert all(abs(len(v) - SIZES["valid"] / clients) <= 1 for v in valid)  # iid, as the train rows
    for p in parts:
        assert p.x_valid.shape == (len(p.ids_valid), len(p.features))
        assert np.array_equal(np.sort(p.ids_valid), p.ids_valid)
    assert prepared.manifest_fields()["n_valid"] == SIZES["valid"]


def test_merge_puts_the_validation_rows_back_into_training(debd_root):
    keep = prepare(dataset="debd:toy", data_root=str(debd_root), setting="central", clients=1)
    merge = prepare(dataset="debd:toy", data_root=str(debd_root), setting="central", clients=1, valid="merge")
    k, m = keep.client_shard(0), merge.client_shard(0)
    assert set(m.ids_train.tolist()) == _ids("ts") | _ids("valid") and m.ids_valid.size == 0
    assert set(k.ids_train.tolist()) == _ids("ts")
    assert np.array_equal(k.ids_test, m.ids_test)
    with pytest.raises(UserError, match="--valid must be one of keep, merge"):
        prepare(dataset="debd:toy", data_root=str(debd_root), setting="central", clients=1, valid="drop")


def test_shard_files_round_trip_and_old_folders_stay_readable(debd_root, tmp_path):
    out = tmp_path / "shards"
    assert prep_run(["--dataset", "debd:toy", "--data-root", str(debd_root), "--setting", "horizontal",
                     "--clients", "2", "--out", str(out)]) in (0, None)
    m = S.load_manifest(out)
    prepared = prepare(dataset="debd:toy", data_root=str(debd_root), setting="horizontal", clients=2)
    for i in range(2):
        read, built = S.read_client(out, i), prepared.client_shard(i)
        assert m.clients[i]["n_valid"] == len(built.ids_valid) > 0
        assert np.array_equal(read.x_valid, built.x_valid) and np.array_equal(read.ids_valid, built.ids_valid)
    # merge: no valid/ group, no n_valid, the shard reads as zero validation rows
    merged = tmp_path / "merged"
    prep_run(["--dataset", "debd:toy", "--data-root", str(debd_root), "--setting", "central", "--clients", "1",
              "--valid", "merge", "--out", str(merged)])
    with h5py.File(merged / "client-0.h5") as f:
        assert "valid" not in f
    assert "n_valid" not in S.load_manifest(merged).clients[0]
    assert S.read_client(merged, 0).x_valid.shape == (0, 5)
    # a valid/ group the manifest does not list is refused, naming the file
    keep_sha = S.sha256_file(out / "client-0.h5")
    raw = json.loads((out / "manifest.json").read_text())
    del raw["clients"][0]["n_valid"]
    (out / "manifest.json").write_text(json.dumps(raw))
    assert S.sha256_file(out / "client-0.h5") == keep_sha
    with pytest.raises(UserError, match=r"client-0\.h5: holds a 'valid' group"):
        S.read_client(out, 0)
    raw["clients"][0]["n_valid"] = "many"
    (out / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="field 'n_valid' must be an integer"):
        S.read_client(out, 0)
