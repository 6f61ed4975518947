"""Dataset loaders: each turns the user's own copy of a dataset into a :class:`RawTable`.

A loader takes the path given with ``--path`` (a file or a folder) or, when that is None,
looks in its default folder under the data root (env ``MPIFC_DATA``, else
``<repo>/../shared/data``). Loaders do no preprocessing: they parse, name the features, give
their raw meta-types and the dataset's own train/test split where it has one.
"""
from __future__ import annotations

import csv
import gzip
import io
import os
import pickle
import struct
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from mpifc.errors import UserError

from .table import RawTable, pixel_names
from .textparse import ColumnSpec, DelimitedParser, feature_matrix


def default_data_root() -> Path:
    """``$MPIFC_DATA`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get("MPIFC_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass(frozen=True)
class DatasetInfo:
    """A registry entry: what the dataset is and where to get it."""

    name: str
    summary: str
    folder: str | None
    source: str
    load: Callable[[str, Path | None, Path], RawTable]


def _open_text(path: Path) -> io.TextIOBase:
    """Text lines of ``path``, transparently gunzipped when it ends in ``.gz``."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _locate(path: Path | None, data_root: Path, folder: str) -> Path:
    """The folder or file to read: ``--path`` if given, else ``data_root/folder``."""
    where = path if path is not None else data_root / folder
    if not where.exists():
        raise UserError(f"{where}: not found (give the dataset's location with --path, or set "
                        "MPIFC_DATA)")
    return where


def _find_file(where: Path, names: list[str], what: str) -> Path:
    """The first of ``names`` inside folder ``where`` (or ``where`` itself if it is a file)."""
    if where.is_file():
        return where
    for name in names:
        cand = where / name
        if cand.is_file():
            return cand
    raise UserError(f"{where}: no {what} found (looked for {', '.join(names)})")


def _table_from_parsed(name: str, parsed, specs: list[ColumnSpec], target: str | None,
                       **kw) -> RawTable:
    x, feats, meta = feature_matrix(parsed, specs)
    return RawTable(name=name, x=x, features=feats, meta_types=meta,
                    categories=parsed.categories, y=parsed.y, target=target,
                    classes=parsed.classes, **kw)


# --------------------------------------------------------------------------- sklearn sets
def load_breast_cancer(name: str, path: Path | None, data_root: Path) -> RawTable:
    """scikit-learn's Wisconsin breast cancer set: 569 x 30 real features, binary target."""
    from sklearn.datasets import load_breast_cancer as sk_load

    bunch = sk_load()
    feats = [str(f).replace(" ", "_") for f in bunch.feature_names]
    return RawTable(name=name, x=np.asarray(bunch.data, dtype=np.float64), features=feats,
                    meta_types=["real"] * len(feats), y=bunch.target.astype(np.int64),
                    target="diagnosis", classes=[str(c) for c in bunch.target_names],
                    source_splits={"all": [0, len(bunch.target)]},
                    source_files=["sklearn.datasets.load_breast_cancer"])


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


# --------------------------------------------------------------------------- adult
ADULT_COLUMNS = [
    ColumnSpec("age", "discrete"), ColumnSpec("workclass", "categorical"),
    ColumnSpec("fnlwgt", "real"), ColumnSpec("education", "categorical"),
    ColumnSpec("education-num", "discrete"), ColumnSpec("marital-status", "categorical"),
    ColumnSpec("occupation", "categorical"), ColumnSpec("relationship", "categorical"),
    ColumnSpec("race", "categorical"), ColumnSpec("sex", "categorical"),
    ColumnSpec("capital-gain", "real"), ColumnSpec("capital-loss", "real"),
    ColumnSpec("hours-per-week", "discrete"), ColumnSpec("native-country", "categorical"),
    ColumnSpec("income", "target"),
]


def load_adult(name: str, path: Path | None, data_root: Path) -> RawTable:
    """UCI Adult: ``adult.data`` (train) and ``adult.test`` (test); target income >50K."""
    where = _locate(path, data_root, "adult")
    folder = where if where.is_dir() else where.parent
    train = _find_file(folder, ["adult.data", "adult.data.gz"], "adult.data")
    test = _find_file(folder, ["adult.test", "adult.test.gz"], "adult.test")
    parser = DelimitedParser(ADULT_COLUMNS, delimiter=",", missing=frozenset({"?", ""}))
    with _open_text(train) as f:
        n_train = parser.feed(f, str(train))
    with _open_text(test) as f:
        # adult.test opens with a junk line and ends its labels with a full stop
        n_test = parser.feed(f, str(test), skip_prefix="|", strip_suffix=".")
    parsed = parser.finish()
    own_test = np.zeros(n_train + n_test, dtype=bool)
    own_test[n_train:] = True
    return _table_from_parsed(name, parsed, ADULT_COLUMNS, "income", own_test=own_test,
                              source_splits={"train": [0, n_train],
                                             "test": [n_train, n_train + n_test]},
                              source_files=[str(train), str(test)])


# --------------------------------------------------------------------------- credit
CREDIT_TARGET = "SeriousDlqin2yrs"
CREDIT_TYPES = {
    "RevolvingUtilizationOfUnsecuredLines": "real", "age": "discrete",
    "NumberOfTime30-59DaysPastDueNotWorse": "discrete", "DebtRatio": "real",
    "MonthlyIncome": "real", "NumberOfOpenCreditLinesAndLoans": "discrete",
    "NumberOfTimes90DaysLate": "discrete", "NumberRealEstateLoansOrLines": "discrete",
    "NumberOfTime60-89DaysPastDueNotWorse": "discrete", "NumberOfDependents": "discrete",
}


def _header(lines, path: str) -> list[str]:
    for row in csv.reader(lines):
        if row:
            return [c.strip() for c in row]
    raise UserError(f"{path}: file is empty")


def load_credit(name: str, path: Path | None, data_root: Path) -> RawTable:
    """Give Me Some Credit ``cs-training.csv`` (or its ``.zip``); target SeriousDlqin2yrs."""
    where = _locate(path, data_root, "credit")
    file = _find_file(where, ["cs-training.csv", "cs-training.csv.zip"], "cs-training.csv")

    @contextmanager
    def open_lines() -> Iterator[io.TextIOBase]:
        if file.suffix != ".zip":
            with _open_text(file) as f:
                yield f
            return
        try:
            archive = zipfile.ZipFile(file)
        except zipfile.BadZipFile:
            raise UserError(f"{file}: not a valid zip archive") from None
        with archive:
            members = [m for m in archive.namelist() if m.endswith(".csv")]
            if not members:
                raise UserError(f"{file}: the archive holds no .csv file")
            with io.TextIOWrapper(archive.open(members[0]), encoding="utf-8",
                                  newline="") as f:
                yield f

    with open_lines() as f:
        names = _header(f, str(file))
    if CREDIT_TARGET not in names:
        raise UserError(f"{file}: no target column {CREDIT_TARGET!r} in the header")
    # the first, unnamed column is the row index of the Kaggle export
    specs = [ColumnSpec(n, "skip" if n == "" or n.startswith("Unnamed") else
                        "target" if n == CREDIT_TARGET else CREDIT_TYPES.get(n, "real"))
             for n in names]
    parser = DelimitedParser(specs, missing=frozenset({"", "NA"}))
    with open_lines() as f:
        n = parser.feed(f, str(file), header=True)
    return _table_from_parsed(name, parser.finish(), specs, CREDIT_TARGET,
                              source_splits={"train": [0, n]}, source_files=[str(file)])


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
        xs = _find_file(folder, [IDX_NAMES[f"{split}_x"], IDX_NAMES[f"{split}_x"] + ".gz"],
                        f"{split} images")
        ys = _find_file(folder, [IDX_NAMES[f"{split}_y"], IDX_NAMES[f"{split}_y"] + ".gz"],
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
    where = _locate(path, data_root, "mnist")
    if where.is_dir() and not (where / "mnist.pkl.gz").exists():
        parts, files = _mnist_from_idx(where)
        scale = 1.0
        names = ["train", "test"]
    else:
        file = _find_file(where, ["mnist.pkl.gz"], "mnist.pkl.gz")
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


# --------------------------------------------------------------------------- debd
def _read_binary_rows(path: Path) -> np.ndarray:
    """Comma-separated 0/1 rows as an ``(n, d)`` uint8 array; errors name the line."""
    rows: list[bytes] = []
    width = None
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            toks = line.split(",")
            if width is None:
                width = len(toks)
            elif len(toks) != width:
                raise UserError(f"{path} line {lineno}: expected {width} fields, "
                                f"got {len(toks)}")
            if any(t not in ("0", "1") for t in toks):
                bad = next(t for t in toks if t not in ("0", "1"))
                raise UserError(f"{path} line {lineno}: {bad!r} is not 0 or 1")
            rows.append(bytes(int(t) for t in toks))
    if not rows:
        raise UserError(f"{path}: no data rows")
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)


def load_debd(name: str, path: Path | None, data_root: Path) -> RawTable:
    """A binary density-estimation set ``debd:NAME`` from ``NAME.{ts,valid,test}.data[.gz]``.

    Train and validation rows form the training pool (the validation id range is kept in
    ``source_splits``); the test file is the held-out test set.
    """
    _, _, set_name = name.partition(":")
    if not set_name:
        raise UserError("debd needs a set name, e.g. --dataset debd:nltcs")
    where = _locate(path, data_root, "debd")
    folder = where if where.is_dir() else where.parent
    parts, files = [], []
    for split in ("ts", "valid", "test"):
        stem = f"{set_name}.{split}.data"
        file = _find_file(folder, [stem, stem + ".gz"], f"{set_name} {split} file")
        parts.append(_read_binary_rows(file))
        files.append(str(file))
    widths = {p.shape[1] for p in parts}
    if len(widths) != 1:
        raise UserError(f"{folder}: {set_name} files disagree on the number of variables "
                        f"({sorted(widths)})")
    sizes = [p.shape[0] for p in parts]
    x = np.concatenate(parts)
    bounds = np.cumsum([0] + sizes)
    own_test = np.zeros(x.shape[0], dtype=bool)
    own_test[bounds[2]:] = True
    d = x.shape[1]
    return RawTable(name=name, x=x, features=[f"v{j}" for j in range(d)],
                    meta_types=["discrete"] * d, own_test=own_test,
                    source_splits={"train": [0, int(bounds[1])],
                                   "valid": [int(bounds[1]), int(bounds[2])],
                                   "test": [int(bounds[2]), int(bounds[3])]},
                    standardize_default=False, source_files=files)


# --------------------------------------------------------------------------- registry
def _load_csv(name: str, path: Path | None, data_root: Path) -> RawTable:
    from .usercsv import load_user_table

    if path is None:
        raise UserError("--dataset csv needs --path FILE (a .csv or .npy with a schema)")
    return load_user_table(name, path)


DATASETS: dict[str, DatasetInfo] = {
    d.name: d for d in [
        DatasetInfo("breast-cancer", "Wisconsin breast cancer, 569 x 30 real, binary "
                    "(the embedded default)", None, "shipped with scikit-learn",
                    load_breast_cancer),
        DatasetInfo("digits", "8x8 digit images, 1797 rows, 10 classes (embedded image "
                    "default)", None, "shipped with scikit-learn", load_digits),
        DatasetInfo("adult", "UCI Adult / income, 48842 x 14 mixed, binary (>50K)", "adult",
                    "https://archive.ics.uci.edu/dataset/2/adult", load_adult),
        DatasetInfo("credit", "Give Me Some Credit, 150000 x 10, binary (SeriousDlqin2yrs)",
                    "credit", "https://www.kaggle.com/c/GiveMeSomeCredit (cs-training.csv)",
                    load_credit),
        DatasetInfo("mnist", "MNIST 28x28 digits, 60k train / 10k test, 10 classes", "mnist",
                    "mnist.pkl.gz (deeplearning.net) or the idx files", load_mnist),
        DatasetInfo("debd", "binary density-estimation sets, e.g. debd:nltcs", "debd",
                    "https://github.com/arranger1044/DEBD", load_debd),
        DatasetInfo("csv", "your own CSV or NPY file with a JSON schema (--path FILE)", None,
                    "your own data", _load_csv),
    ]
}


def load_dataset(name: str, path: str | Path | None = None,
                 data_root: str | Path | None = None) -> RawTable:
    """Load dataset ``name`` (``debd:SET`` for a DEBD set) from ``path`` or the data root.

    Raises:
        UserError: unknown dataset, missing file, or malformed content.
    """
    key = name.partition(":")[0]
    info = DATASETS.get(key)
    if info is None:
        raise UserError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)}; "
                        "see python -m data_prep --list)")
    root = Path(data_root) if data_root is not None else default_data_root()
    return info.load(name, None if path is None else Path(path), root)
