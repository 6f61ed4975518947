"""Loaders of tabular datasets: breast-cancer (embedded), adult, credit, debd."""
from __future__ import annotations

import csv
import io
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from mpifc.errors import UserError

from .files import find_file, locate, open_text
from .table import RawTable
from .textparse import ColumnSpec, DelimitedParser, feature_matrix


def _table_from_parsed(name: str, parsed, specs: list[ColumnSpec], target: str | None,
                       **kw) -> RawTable:
    x, feats, meta = feature_matrix(parsed, specs)
    return RawTable(name=name, x=x, features=feats, meta_types=meta,
                    categories=parsed.categories, y=parsed.y, target=target,
                    classes=parsed.classes, **kw)


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
    where = locate(path, data_root, "adult")
    folder = where if where.is_dir() else where.parent
    train = find_file(folder, ["adult.data", "adult.data.gz"], "adult.data")
    test = find_file(folder, ["adult.test", "adult.test.gz"], "adult.test")
    parser = DelimitedParser(ADULT_COLUMNS, delimiter=",", missing=frozenset({"?", ""}))
    with open_text(train) as f:
        n_train = parser.feed(f, str(train))
    with open_text(test) as f:
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
    where = locate(path, data_root, "credit")
    file = find_file(where, ["cs-training.csv", "cs-training.csv.zip"], "cs-training.csv")

    @contextmanager
    def open_lines() -> Iterator[io.TextIOBase]:
        if file.suffix != ".zip":
            with open_text(file) as f:
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


# --------------------------------------------------------------------------- debd
def _read_binary_rows(path: Path) -> np.ndarray:
    """Comma-separated 0/1 rows as an ``(n, d)`` uint8 array; errors name the line."""
    try:
        return _parse_binary_rows(path)
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # e.g. a truncated .gz
        raise UserError(f"{path}: cannot read ({exc})") from None


def _parse_binary_rows(path: Path) -> np.ndarray:
    rows: list[bytes] = []
    width = None
    with open_text(path) as f:
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

    ``NAME.ts`` rows are the training pool, ``NAME.valid`` rows the dataset's own validation
    split (``own_valid``: kept out of training unless ``--valid merge``), ``NAME.test`` the
    held-out test set; ``source_splits`` keeps the three id ranges.
    """
    _, _, set_name = name.partition(":")
    if not set_name:
        raise UserError("debd needs a set name, e.g. --dataset debd:nltcs")
    where = locate(path, data_root, "debd")
    folder = where if where.is_dir() else where.parent
    parts, files = [], []
    for split in ("ts", "valid", "test"):
        stem = f"{set_name}.{split}.data"
        file = find_file(folder, [stem, stem + ".gz"], f"{set_name} {split} file")
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
    own_valid = np.zeros(x.shape[0], dtype=bool)
    own_valid[bounds[1]:bounds[2]] = True
    d = x.shape[1]
    return RawTable(name=name, x=x, features=[f"v{j}" for j in range(d)],
                    meta_types=["discrete"] * d, own_test=own_test, own_valid=own_valid,
                    source_splits={"train": [0, int(bounds[1])],
                                   "valid": [int(bounds[1]), int(bounds[2])],
                                   "test": [int(bounds[2]), int(bounds[3])]},
                    standardize_default=False, source_files=files)
