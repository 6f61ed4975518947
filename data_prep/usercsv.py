"""The ``csv`` dataset: a user's own CSV or NPY file described by a small JSON schema.

The schema is, in this order: the file given with ``--schema FILE``; ``<stem>.schema.json``
beside the data (``data.csv`` -> ``data.schema.json``); else, for a CSV with a header line, the
schema :mod:`data_prep.infer` reads off the file (the target named by ``--target``). This
example is valid JSON as it stands::

    {"columns": [{"name": "age", "type": "discrete"},
                 {"name": "city", "type": "categorical"},
                 {"name": "id", "type": "skip"},
                 {"name": "label", "type": "categorical"}],
     "target": "label",
     "header": true,
     "delimiter": ",",
     "missing": ["", "?", "NA"]}

Fields: ``columns`` (required), each a ``name`` and a ``type``: ``real``, ``discrete``,
``categorical`` or ``skip`` (the column is read and dropped); ``target``, the column to predict,
or ``null`` for unlabelled data; and for CSV only: ``header`` (default ``true``: the first line
names the columns), ``delimiter`` (default ``","``) and ``missing``, the tokens that mean a
missing cell (default ``["", "?", "NA"]``). With a header, columns are matched by name; without
one (and for NPY, a 2-D numeric array) they are taken in order.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from mpifc.errors import UserError

from .table import META_TYPES, RawTable
from .textparse import ColumnSpec, DelimitedParser, feature_matrix


def _schema_path(data: Path) -> Path:
    return data.with_name(data.stem + ".schema.json")


def _read_schema(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: schema not found")
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    cols = schema.get("columns") if isinstance(schema, dict) else None
    if not isinstance(cols, list) or not cols:
        raise UserError(f"{path}: field 'columns' must be a non-empty list")
    for k, col in enumerate(cols):
        if not isinstance(col, dict) or not isinstance(col.get("name"), str):
            raise UserError(f"{path}: columns[{k}] needs a string 'name'")
        if col.get("type") not in META_TYPES + ("skip",):
            raise UserError(f"{path}: columns[{k}] ({col['name']!r}) has type "
                            f"{col.get('type')!r}; use real, discrete, categorical or skip")
    names = [c["name"] for c in cols]
    target = schema.get("target")
    if target is not None and target not in names:
        raise UserError(f"{path}: target {target!r} is not one of the schema's columns")
    return schema


def _specs(schema: dict, order: list[str], data: Path, schema_file: Path) -> list[ColumnSpec]:
    types = {c["name"]: c["type"] for c in schema["columns"]}
    target = schema.get("target")
    if target is not None and target not in order:
        raise UserError(f"{data}: no target column {target!r}")
    for name in types:
        if name not in order:
            raise UserError(f"{data}: schema column {name!r} ({schema_file}) is not in the "
                            "file's header")
    specs = []
    for name in order:
        if name not in types:
            raise UserError(f"{data}: column {name!r} is not in the schema {schema_file}")
        specs.append(ColumnSpec(name, "target" if name == target else types[name]))
    return specs


def _load_npy(name: str, data: Path, schema: dict, schema_file: Path) -> RawTable:
    try:
        arr = np.load(data, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise UserError(f"{data}: cannot read as .npy ({exc})") from None
    cols = schema["columns"]
    if arr.ndim != 2 or arr.shape[1] != len(cols) or not np.issubdtype(arr.dtype, np.number):
        raise UserError(f"{data}: expected a numeric 2-D array with {len(cols)} columns "
                        f"(schema {schema_file}), got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.float64)
    if np.isinf(arr).any():
        row, col = np.argwhere(np.isinf(arr))[0]
        raise UserError(f"{data} row {row}, field {cols[col]['name']!r}: not finite")
    for j, col in enumerate(cols):
        if col["type"] == "discrete":
            values = arr[:, j]
            bad = ~np.isnan(values) & (values != np.floor(values))
            if bad.any():
                row = int(np.argmax(bad))
                raise UserError(f"{data} row {row}, field {col['name']!r}: {values[row]!r} is not an integer "
                                f"(the column is declared discrete in {schema_file})")
    target = schema.get("target")
    feats, meta, xs, categories = [], [], [], {}
    y = classes = None
    for j, col in enumerate(cols):
        values = arr[:, j]
        if col["name"] == target:
            if np.isnan(values).any():
                row = int(np.argwhere(np.isnan(values))[0, 0])
                raise UserError(f"{data} row {row}, field {target!r}: missing target label")
            labels, y = np.unique(values, return_inverse=True)
            classes = [int(v) if float(v).is_integer() else float(v) for v in labels]
            continue
        if col["type"] == "skip":
            continue
        if col["type"] == "categorical":
            seen = ~np.isnan(values)
            labels, codes = np.unique(values[seen], return_inverse=True)
            values = values.copy()
            values[seen] = codes
            categories[col["name"]] = [str(int(v)) if float(v).is_integer() else str(v)
                                       for v in labels]
        feats.append(col["name"])
        meta.append(col["type"])
        xs.append(values)
    x = np.stack(xs, axis=1) if xs else np.empty((arr.shape[0], 0))
    return RawTable(name=name, x=x, features=feats, meta_types=meta, categories=categories,
                    y=None if y is None else y.astype(np.int64), target=target,
                    classes=classes, source_splits={"all": [0, arr.shape[0]]},
                    source_files=[str(data), str(schema_file)])


_HDF5 = b"\x89HDF\r\n\x1a\n"  # at offset 0, or 512, 1024, ... behind a user block (mpifc models)
_BINARY_FORMATS = ((b"PK\x03\x04", "a zip archive (or .xlsx/.npz)"), (b"\x1f\x8b", "a gzip archive"),
                   (b"\x93NUMPY", "a .npy array (name it *.npy)"))


def _check_text(data: Path) -> None:
    """Refuse a file that is plainly not delimited text, naming what it is."""
    with open(data, "rb") as f:
        head = f.read(4096)
    found = [what for magic, what in _BINARY_FORMATS if head.startswith(magic)]
    if any(head[at:at + 8] == _HDF5 for at in (0, 512, 1024, 2048)):
        found.append("an HDF5 file (an mpifc model or shard?)")
    if found:
        raise UserError(f"{data}: {found[0]}, not a CSV (the csv dataset reads delimited UTF-8 text or .npy)")
    if b"\0" in head:
        raise UserError(f"{data}: not UTF-8 text (binary data, or another encoding such as UTF-16); "
                        f"the csv dataset reads delimited UTF-8 text or .npy")


def _first_bad_line(data: Path) -> int:
    """The line of ``data`` holding its first byte sequence that is not UTF-8."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(data, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                return line + block.count(b"\n", 0, e.start)
            line += block.count(b"\n")
    return line


def _choose_schema(data: Path, target: str | None, schema_file: Path | None) -> dict:
    """``{"schema", "source", "guesses"}``: the schema to read ``data`` with (module doc), where it
    came from (a file, or ``"inferred"``), and the inferred types' reasons (None for a file)."""
    if schema_file is None and _schema_path(data).is_file():
        schema_file = _schema_path(data)
    if schema_file is not None:
        schema = _read_schema(schema_file)
        if target is not None and schema.get("target") != target:
            raise UserError(f"--target {target!r}: the schema {schema_file} names the target "
                            f"{schema.get('target')!r}; edit the schema or leave --target out")
        return {"schema": schema, "source": str(schema_file), "guesses": None}
    if data.suffix == ".npy":
        raise UserError(f"{data}: a .npy file needs a schema ({_schema_path(data).name} beside it, "
                        "or --schema FILE): it has no header naming the columns")
    from .infer import infer_schema

    schema, guesses = infer_schema(data, target)
    return {"schema": schema, "source": "inferred", "guesses": guesses}


def load_user_table(name: str, data: Path, target: str | None = None,
                    schema_file: Path | None = None) -> RawTable:
    """Load a user's CSV/NPY file with its schema (see the module docstring).

    Args:
        name: the dataset's name (``csv``).
        data: the CSV or NPY file.
        target: ``--target``: the class column (must agree with a schema file's target).
        schema_file: ``--schema``: a schema file that wins over the one beside ``data``.

    Returns:
        The table; its ``schema_info`` holds the schema used, where it came from and, when
        inferred, the reason for each column's type.

    Raises:
        UserError: missing file or schema, schema errors, malformed lines.
    """
    if not data.is_file():
        raise UserError(f"{data}: not found")
    if data.suffix != ".npy":
        _check_text(data)
    info = _choose_schema(data, target, schema_file)
    schema = info["schema"]
    origin = data if info["source"] == "inferred" else Path(info["source"])
    if data.suffix == ".npy":
        table = _load_npy(name, data, schema, origin)
        table.schema_info = info
        return table
    delimiter = schema.get("delimiter", ",")
    missing = frozenset(schema.get("missing", ["", "?", "NA"]))
    with open(data, encoding="utf-8-sig", newline="") as f:
        if schema.get("header", True):
            try:
                line = f.readline()
            except UnicodeDecodeError:
                raise UserError(f"{data}: line {_first_bad_line(data)}: not UTF-8 text (save the file as UTF-8)") from None
            header = next(csv.reader([line], delimiter=delimiter, skipinitialspace=True), [])
            order = [t.strip() for t in header]
        else:
            order = [c["name"] for c in schema["columns"]]
        specs = _specs(schema, order, data, origin)
        parser = DelimitedParser(specs, delimiter=delimiter, missing=missing)
        f.seek(0)
        n = parser.feed(f, str(data), header=bool(schema.get("header", True)))
    parsed = parser.finish()
    x, feats, meta = feature_matrix(parsed, specs)
    files = [str(data)] + ([] if info["source"] == "inferred" else [str(origin)])
    return RawTable(name=name, x=x, features=feats, meta_types=meta,
                    categories=parsed.categories,
                    y=parsed.y, target=schema.get("target"), classes=parsed.classes,
                    source_splits={"all": [0, n]}, source_files=files, schema_info=info)
