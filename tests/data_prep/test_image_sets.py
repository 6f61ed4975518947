"""ImageNet32 and image-folder loaders on tiny made-up files (the real sets are not here)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from data_prep.datasets import load_dataset
from data_prep.image_sets import read_image, rgb_names, square_resize
from data_prep.prepare import prepare
from mpifc.errors import UserError

from .conftest import REPO


def _imagenet32(folder, sizes=(6, 5), n_val=4, seed=0):
    """Official layout: train_data_batch_k.npz and val_data.npz with uint8 CHW rows, 1-based labels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    batches = []
    for k, n in enumerate(sizes, start=1):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(1, 1001, n)
        np.savez(folder / f"train_data_batch_{k}.npz", data=data, labels=labels.tolist(),
                 mean=data.mean(0))
        batches.append((data, labels))
    val = rng.integers(0, 256, (n_val, 3072), dtype=np.uint8), rng.integers(1, 1001, n_val)
    np.savez(folder / "val_data.npz", data=val[0], labels=val[1].tolist())
    return batches, val


def test_imagenet32_reads_official_batches(tmp_path):
    batches, val = _imagenet32(tmp_path / "in32")
    t = load_dataset("imagenet32", tmp_path / "in32")
    assert t.x.shape == (15, 3072) and t.x.dtype == np.uint8
    assert t.own_test.sum() == 4 and t.source_splits == {"train": [0, 11], "val": [11, 15]}
    # rows in file order, labels made 0-based
    np.testing.assert_array_equal(t.x[:6], batches[0][0])
    np.testing.assert_array_equal(t.x[11:], val[0])
    np.testing.assert_array_equal(t.y[6:11], batches[1][1] - 1)
    # channel-major names: the 1025th value of a row is the green channel's first pixel
    assert t.features[0] == "r_px_0_0" and t.features[1024] == "g_px_0_0" and t.features[33] == "r_px_1_1"
    # imagenet32:1 reads the first training batch only
    t1 = load_dataset("imagenet32:1", tmp_path / "in32")
    assert t1.x.shape == (10, 3072)


def test_imagenet32_found_under_the_data_root(tmp_path):
    _imagenet32(tmp_path / "imagenet32", sizes=(3,), n_val=2)
    assert load_dataset("imagenet32", None, data_root=tmp_path).x.shape == (5, 3072)


def test_imagenet32_prepares_into_shards(tmp_path):
    _imagenet32(tmp_path / "in32", sizes=(20, 20), n_val=10)
    prep = prepare(dataset="imagenet32", path=str(tmp_path / "in32"), setting="horizontal", clients=2, seed=0)
    assert prep.train_rows.size == 40 and prep.test_rows.size == 10
    from data_prep import write_shards
    from data_prep.shards import read_client

    write_shards(prep, tmp_path / "shards")
    shard = read_client(tmp_path / "shards", 0)
    px = shard.x_train[:, [j for j, f in enumerate(shard.features) if f != "label"]]
    assert px.shape[1] == 3072 and 0 <= px.min() and px.max() <= 255 and shard.x_train.shape[1] == 3073


@pytest.mark.parametrize("case, message", [
    ("missing", "no ImageNet32 training batch"),
    ("noval", "val_data.npz not found"),
    ("keys", "not an ImageNet32 batch"),
    ("shape", "expected \\(N, 3072\\)"),
    ("labels", "labels must be 1..1000"),
    ("garbage", "cannot read as .npz"),
    ("count", "train_data_batch_3.npz not found"),
])
def test_imagenet32_bad_files_are_named(tmp_path, case, message):
    folder = tmp_path / "in32"
    folder.mkdir()
    if case != "missing":
        _imagenet32(folder)
    if case == "noval":
        (folder / "val_data.npz").unlink()
    elif case == "keys":
        np.savez(folder / "train_data_batch_1.npz", x=np.zeros((2, 3072), np.uint8))
    elif case == "shape":
        np.savez(folder / "train_data_batch_1.npz", data=np.zeros((2, 100), np.uint8), labels=[1, 2])
    elif case == "labels":
        np.savez(folder / "train_data_batch_1.npz", data=np.zeros((2, 3072), np.uint8), labels=[0, 2])
    elif case == "garbage":
        (folder / "train_data_batch_1.npz").write_bytes(b"not a zip file at all")
    name = "imagenet32:3" if case == "count" else "imagenet32"
    with pytest.raises(UserError, match=message) as err:
        load_dataset(name, folder)
    if case not in ("missing", "count"):
        assert str(folder) in str(err.value)


def _png(path, img):
    from matplotlib.image import imsave

    if img.ndim == 2:
        imsave(path, img, cmap="gray", vmin=0, vmax=255)
    else:
        imsave(path, img)


def test_image_folder_png_npy_and_classes(tmp_path):
    rng = np.random.default_rng(1)
    imgs = {}
    for cls in ("cats", "dogs"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            img = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            imgs[(cls, i)] = img
            if i == 0:
                _png(tmp_path / cls / f"{i}.png", img)
            else:
                np.save(tmp_path / cls / f"{i}.npy", img)
    t = load_dataset("image-folder", tmp_path)
    assert t.x.shape == (6, 90) and t.classes == ["cats", "dogs"] and list(t.y) == [0, 0, 0, 1, 1, 1]
    assert t.features == rgb_names(6, 5)
    # PNG round trip is exact for uint8 levels; rows are channel-major
    np.testing.assert_array_equal(t.x[0], imgs[("cats", 0)].transpose(2, 0, 1).reshape(-1))
    np.testing.assert_array_equal(t.x[4], imgs[("dogs", 1)].transpose(2, 0, 1).reshape(-1))


def test_image_folder_flat_grayscale_unlabelled_and_resize(tmp_path):
    rng = np.random.default_rng(2)
    for i in range(4):
        np.save(tmp_path / f"im{i}.npy", rng.integers(0, 256, (10, 8), dtype=np.uint8))
    t = load_dataset("image-folder", tmp_path)
    assert t.y is None and t.target is None and t.image_shape == (10, 8) and t.features[0] == "px_0_0"
    t4 = load_dataset("image-folder:4", tmp_path)
    assert t4.x.shape == (4, 16) and t4.image_shape == (4, 4)
    # area averaging of the centre 8x8 crop into 2x2 blocks
    img = np.load(tmp_path / "im0.npy")[1:9].astype(float)
    want = np.rint(img.reshape(4, 2, 4, 2).mean(axis=(1, 3))).reshape(-1)
    np.testing.assert_array_equal(t4.x[0], want)
    prep = prepare(dataset="image-folder", path=str(tmp_path), setting="horizontal", clients=2, seed=0,
                   test_fraction=0.25)
    assert prep.test_rows.size == 1


def test_square_resize_keeps_a_constant_image_and_enlarges():
    img = np.full((7, 9, 3), 200, np.uint8)
    assert (square_resize(img, 3) == 200).all() and square_resize(img, 3).shape == (3, 3, 3)
    assert square_resize(img[:, :, 0], 14).shape == (14, 14)


def test_image_folder_errors_name_the_file(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no images found"):
        load_dataset("image-folder", tmp_path)
    np.save(tmp_path / "a.npy", np.zeros((4, 4), np.uint8))
    np.save(tmp_path / "b.npy", np.zeros((5, 4), np.uint8))
    with pytest.raises(UserError, match=r"b\.npy: image shape \(5, 4\) differs"):
        load_dataset("image-folder", tmp_path)
    (tmp_path / "b.npy").unlink()
    np.save(tmp_path / "c.npy", np.full((4, 4), 300.0))
    with pytest.raises(UserError, match=r"c\.npy: NPY image must hold levels 0..255"):
        load_dataset("image-folder", tmp_path)
    (tmp_path / "c.npy").unlink()
    (tmp_path / "d.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(UserError, match=r"d\.png: cannot read image"):
        load_dataset("image-folder", tmp_path)
    (tmp_path / "d.png").unlink()
    (tmp_path / "e.jpg").write_bytes(b"\xff\xd8 not really")
    monkeypatch.setitem(sys.modules, "PIL", None)  # Pillow absent: the JPEG is named
    with pytest.raises(UserError, match=r"e\.jpg: reading JPEG needs Pillow"):
        read_image(tmp_path / "e.jpg")
    with pytest.raises(UserError, match="not a folder"):
        load_dataset("image-folder", tmp_path / "a.npy")
    with pytest.raises(UserError, match="positive integer"):
        load_dataset("image-folder:x", tmp_path)


def test_jpeg_read_when_pillow_present(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    img = np.zeros((8, 8, 3), np.uint8)
    img[:, :, 0] = 255
    pil.fromarray(img).save(tmp_path / "red.jpg", quality=100)
    out = read_image(tmp_path / "red.jpg")
    assert out.shape == (8, 8, 3) and out[:, :, 0].min() > 240 and out[:, :, 1].max() < 15


def test_cli_missing_imagenet32_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "imagenet32", "--path",
                           str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "nowhere" in lines[0]
