"""Loaders of image datasets: digits (embedded) and MNIST (pickle or idx files).

Pixels are kept as uint8 levels and named ``px_r_c`` (row-major), so a 70k-image set stays
near its raw size and patches can be cut by name.
"""
from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

from mpifc.errors import UserError

from .files import find_file, locate
from .table import RawTable, pixel_names


def load_digits(name: str, path: Path | None, data_root: Path) -> RawTable:
    """scikit-learn's 8x8 digits (1797 images, pixel levels 0..16, ten classes)."""
    from sklearn.datasets import load_digits as sk_load

    bunch = sk_load()
    x = np.asarray(bunch.data).astype(np.uint8)
    return RawTable(name=name, x=x, features=pixel_names(8, 8), meta_types=["discrete"] * 64,
                    y=bunch.target.astype(np.int64), target="label",
                    classes=[int(c) for c in bunch.target_names],
                    source_splits={"all": [0, x.shape[0]]}, image_shape=(8, 8),
                    pixel={"levels": 17, "file_scale": 1.0}, standardize_default=False,
                    source_files=["sklearn.datasets.load_digits"])


# --------------------------------------------------------------------------- mnist
def _read_idx(path: Path) -> np.ndarray:
    """An idx file (``...-ubyte[.gz]``) as a uint8 array of its stored shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise UserError(f"{path}: not an idx file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise UserError(f"{path}: idx header says {dims} but the file holds {data.size} bytes")
    return data.reshape(dims)


IDX_NAMES = {
    "train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte",
}


def _mnist_from_idx(folder: Path) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    parts, files = [], []
    for split in ("train", "test"):
        xs = find_file(folder, [IDX_NAMES[f"{split}_x"], IDX_NAMES[f"{split}_x"] + ".gz"],
                        f"{split} images")
        ys = find_file(folder, [IDX_NAMES[f"{split}_y"], IDX_NAMES[f"{split}_y"] + ".gz"],
                        f"{split} labels")
        x, y = _read_idx(xs), _read_idx(ys)
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise UserError(f"{xs}: {x.shape} images do not match {y.shape} labels in {ys}")
        parts.append((x.reshape(x.shape[0], -1), y))
        files += [str(xs), str(ys)]
    return parts, files


def _mnist_from_pickle(file: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        with gzip.open(file, "rb") as f:
            splits = pickle.load(f, encoding="latin1")
    except (OSError, EOFError, pickle.UnpicklingError) as exc:
        raise UserError(f"{file}: cannot unpickle ({exc})") from None
    if not (isinstance(splits, tuple) and len(splits) == 3):
        raise UserError(f"{file}: expected a (train, valid, test) tuple")
    parts = []
    for x, y in splits:
        x = np.asarray(x)
        # the pickle stores levels k/256 as float32; they are exact, so bytes lose nothing.
        # In place, so the peak stays at the unpickled arrays plus their byte copies.
        np.multiply(x, 256, out=x)
        np.rint(x, out=x)
        parts.append((x.astype(np.uint8), np.asarray(y, dtype=np.int64)))
    del splits, x
    return parts


def load_mnist(name: str, path: Path | None, data_root: Path) -> RawTable:
    """MNIST from ``mnist.pkl.gz`` (50k/10k/10k) or the classic idx files (60k/10k).

    The pickle's validation part joins the training rows (60k, as torchvision has it); its
    id range is kept in ``source_splits``.
    """
    where = locate(path, data_root, "mnist")
    if where.is_dir() and not (where / "mnist.pkl.gz").exists():
        parts, files = _mnist_from_idx(where)
        scale = 1.0
        names = ["train", "test"]
    else:
        file = find_file(where, ["mnist.pkl.gz"], "mnist.pkl.gz")
        parts, files, scale = _mnist_from_pickle(file), [str(file)], 1.0 / 256.0
        names = ["train", "valid", "test"]
    sizes = [p[0].shape[0] for p in parts]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    del parts
    bounds = np.cumsum([0] + sizes)
    own_test = np.zeros(x.shape[0], dtype=bool)
    own_test[bounds[-2]:] = True
    side = int(round(np.sqrt(x.shape[1])))
    return RawTable(name=name, x=x, features=pixel_names(side, side),
                    meta_types=["discrete"] * x.shape[1], y=y, target="label",
                    classes=list(range(10)), own_test=own_test,
                    source_splits={n: [int(bounds[i]), int(bounds[i + 1])]
                                   for i, n in enumerate(names)},
                    image_shape=(side, side), pixel={"levels": 256, "file_scale": scale},
                    standardize_default=False, source_files=files)
