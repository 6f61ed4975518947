"""The shard format ``mpifc-shards/1``: the contract between data_prep and the runtime.

A shard directory ``DIR`` holds::

    DIR/manifest.json     written last; describes and checksums everything else
    DIR/client-<i>.h5     one per client, i = 0..n_clients-1
    DIR/test.h5           the full held-out test set

``manifest.json``::

    {"format": "mpifc-shards/1", "dataset": "adult", "setting": "hybrid", "split": "iid",
     "seed": 0, "n_clients": 3,
     "target": "income" | null, "classes": ["<=50K", ">50K"] | null,
     "features": {name: {"meta_type": "real"|"discrete"|"categorical",
                         "raw_meta_type": ..., "n_categories": k | null}},
     "feature_order": [every name, canonical order, target last],
     "clients": [{"index": i, "file": "client-<i>.h5", "features": [names, column order],
                  "n_train": n, "n_test": m, "n_valid": v, "sha256": hex}],
     "test": {"file": "test.h5", "n": m, "sha256": hex},
     "label_owner": 0 | "all",
     "preprocessing": {"encode", "impute", "standardize", "fitted_on": "train",
                       "n_fit_rows", "columns": {name: {"meta_type", "raw_meta_type",
                       "transform": "levels"|"standardize"|"normal-score"|"target-encoding"|
                                    "codes"|"none",
                       "encoding"?, "encoding_missing"?, "impute"?, "mean"?, "std"?,
                       "levels"? (numeric levels, or a categorical's labels in level order,
                                  null = missing), "normal_score"? {"x", "z", "scale_lo",
                       "scale_hi"}, "selection"? {candidate: validation nats per row}}},
                       "selection"? {"rule", "candidates", "seed", "fit_rows",
                       "validation_rows"},
                       "missing": {name: {"train": count, "test": count}}},
     "partition": {those that apply: "class_owners", "dirichlet_proportions",
                   "dirichlet_draws", "segments", "shared_features", "patches", "overlap"},
     "n_train": total train rows, "n_test": total test rows, "n_valid": total validation rows,
     "source": {"files": [...], "splits": {"train": [lo, hi), ...}}  (id ranges),
     "image": {"shape": [h, w], "levels": L, "range": [0, L - 1], "file_scale": s}
              (images only),
     "config": {...every prepare() argument...},
     "schema": "schema.json", "skipped_columns": [names]  (a user's table only: the schema file
              of the set, and the columns it skipped, which a query may carry)}

``client-<i>.h5``: datasets ``train/x`` float64 ``(n_train, d_i)`` (NaN = missing, only when
imputation is off), ``train/ids`` int64 ``(n_train,)`` global sample ids, ascending (vertical
clients hold the same ids in the same order), ``test/x`` float64 ``(n_test, d_i)`` (the
client's held-out rows, its own features only: all test rows for vertical clients, and in
horizontal and hybrid settings the test rows drawn by the same rule as its train rows, so a
label-split client's test rows hold its classes), ``test/ids`` int64 ``(n_test,)``; attributes
``features`` and ``meta_types`` (JSON lists), ``client_index`` and ``format``. Where the dataset
has a validation split of its own (DEBD's ``NAME.valid``) and ``--valid keep`` (the default),
also ``valid/x`` float64 ``(n_valid, d_i)`` and ``valid/ids`` int64 ``(n_valid,)``: the client's
validation rows, drawn by the same rule as its train rows (central and vertical: all of them),
never among its train or test rows. A file without ``valid/`` (no such split, ``--valid merge``,
or written before the field existed) reads as zero validation rows; ``n_valid`` absent from
the manifest likewise means 0.

``test.h5``: ``x`` float64 ``(n, D)`` over ``feature_order`` and ``ids`` int64 ``(n,)``.

``schema.json`` (a user's table only, named by ``manifest["schema"]``): the column schema the CSV
was read with, inferred or given; ``python -m data_prep --schema DIR/schema.json`` reads it back.

The target is an ordinary column holding class codes ``0..k-1`` (never encoded or scaled);
its meta-type is ``discrete`` for two classes, else ``categorical``. Standardized values map
back to the source scale as ``raw = x * std + mean``, normal scores through their knots, level
codes ``c`` to ``levels[c]`` (``preprocessing.columns``; ``data_prep.preprocess``); image
pixels are levels ``0..L-1`` that were ``level * file_scale`` in the source file.

A client rank reads only its own shard with :func:`read_client`; any missing, malformed or
altered file raises :class:`mpifc.errors.UserError` naming the file. So does a value that is
not finite (``inf``): NaN means "missing", anything infinite is refused with the file, the
dataset, the column and the first row.

Writing (:func:`write_shards`) replaces an earlier shard set in ``DIR`` as a whole, atomically,
and only a shard set: a folder that holds anything else (any file or folder besides
``manifest.json`` and the files it lists) is refused, naming the first such entry, and nothing
in it is touched, unless the user gives ``--overwrite``. A folder that is or holds a file the
data is read from (``source.files``, recorded as absolute paths) is never replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import h5py
import numpy as np

import mpifc.progress as progress
from mpifc.errors import UserError

FORMAT = "mpifc-shards/1"
MANIFEST = "manifest.json"
TEST_FILE = "test.h5"
SCHEMA_FILE = "schema.json"
"""A user's table (``--dataset csv``): the column schema it was read with, inferred or given, in
the format ``--schema FILE`` reads (:mod:`data_prep.usercsv`); listed as ``manifest["schema"]``."""
_REQUIRED = ("format", "dataset", "setting", "split", "seed", "n_clients", "target", "classes",
             "features", "feature_order", "clients", "test", "preprocessing", "label_owner")


@dataclass
class ClientShard:
    """One client's data. ``x_*`` are float64 ``(n, len(features))``, ``ids_*`` int64 ``(n,)``."""

    index: int
    features: list[str]
    meta_types: list[str]
    x_train: np.ndarray
    ids_train: np.ndarray
    x_test: np.ndarray
    ids_test: np.ndarray
    x_valid: np.ndarray | None = None
    ids_valid: np.ndarray | None = None

    def __post_init__(self) -> None:
        # No validation rows: empty arrays of the right width, so callers never test for None.
        if self.x_valid is None:
            self.x_valid = np.empty((0, len(self.features)), dtype=np.float64)
        if self.ids_valid is None:
            self.ids_valid = np.empty(0, dtype=np.int64)


@dataclass
class TestSet:
    """The held-out test set: ``x`` float64 ``(n, D)`` over ``features``, ``ids`` ``(n,)``."""

    features: list[str]
    x: np.ndarray
    ids: np.ndarray


@dataclass
class Manifest:
    """A parsed ``manifest.json``; ``raw`` keeps every key, the fields the common ones."""

    directory: Path
    dataset: str
    setting: str
    split: str
    seed: int
    n_clients: int
    target: str | None
    classes: list | None
    features: dict[str, dict]
    feature_order: list[str]
    clients: list[dict]
    test: dict
    preprocessing: dict
    label_owner: int | str
    raw: dict

    def meta_types(self, names: list[str]) -> list[str]:
        """Meta-types of ``names``."""
        return [self.features[n]["meta_type"] for n in names]


class ShardSource(Protocol):
    """What :func:`write_shards` needs (``prepare.PreparedData`` provides it)."""

    n_clients: int

    def client_shard(self, index: int) -> ClientShard: ...

    def test_set(self) -> TestSet: ...

    def manifest_fields(self) -> dict: ...

    # optional: ``extra_files() -> {name: text}``, small text files of the set (SCHEMA_FILE)


# --------------------------------------------------------------------------- writing
def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 256 KiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 18), b""):
            h.update(block)
    return h.hexdigest()


def _write_h5(path: Path, arrays: dict[str, np.ndarray], attrs: dict) -> None:
    # Built in memory, so the HDF5 library never meets a full disk (an ordinary UserError then).
    # track_times off: the same data must give the same bytes, hence the same checksum.
    from mpifc.atomic import atomic_h5

    with atomic_h5(path) as f:
        for name, arr in arrays.items():
            f.create_dataset(name, data=arr, track_times=False)
        for key, value in attrs.items():
            f.attrs[key] = value


def write_client(path: Path, shard: ClientShard) -> None:
    """Write one client's HDF5 file (see the module docstring for its layout); the ``valid/``
    group only when the client has validation rows, so shards of datasets without a
    validation split keep their bytes."""
    arrays = {"train/x": shard.x_train.astype(np.float64, copy=False),
              "train/ids": shard.ids_train.astype(np.int64, copy=False),
              "test/x": shard.x_test.astype(np.float64, copy=False),
              "test/ids": shard.ids_test.astype(np.int64, copy=False)}
    if shard.x_valid.shape[0]:
        arrays["valid/x"] = shard.x_valid.astype(np.float64, copy=False)
        arrays["valid/ids"] = shard.ids_valid.astype(np.int64, copy=False)
    _write_h5(path, arrays,
              {"features": json.dumps(shard.features), "meta_types": json.dumps(shard.meta_types),
               "client_index": shard.index, "format": FORMAT})


def shard_set_files(out: Path) -> set[str]:
    """The names a shard set in ``out`` consists of: ``manifest.json`` and the files it lists
    (empty if there is no readable manifest)."""
    try:
        raw = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        names = {MANIFEST, str(raw["test"]["file"])} | {str(c["file"]) for c in raw["clients"]}
        if raw.get("schema"):
            names.add(str(raw["schema"]))
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {n for n in names if n and "/" not in n and n not in (".", "..")}


def foreign_entries(out: Path) -> list[str]:
    """Entries of folder ``out`` that are not part of the shard set it holds, sorted."""
    own = shard_set_files(out)
    return sorted(name for name in os.listdir(out) if name not in own)


def check_out_folder(out: Path, sources: list[str | Path] = (), overwrite: bool = False) -> None:
    """Refuse an output folder that cannot be written, that is or holds a source of the data
    (``sources``: never replaced, not even with ``overwrite``), or that holds anything but a
    shard set (unless ``overwrite``: then it is replaced as a whole).

    Raises:
        UserError: one line naming ``--out`` and the entry at fault.
    """
    from mpifc.atomic import write_problem

    problem = write_problem(out, folder=True)
    if problem is not None:
        raise UserError(f"--out {out}: cannot be written: {problem}")
    if not out.is_dir():
        return
    real = out.resolve()
    for src in sources:
        if os.path.exists(src) and (Path(src).resolve() == real or real in Path(src).resolve().parents):
            raise UserError(f"--out {out}: holds {src}, a source of this data set; refusing to overwrite it, "
                            f"even with --overwrite (choose another folder)")
    foreign = foreign_entries(out)
    if foreign and not overwrite:
        what = "holds files that are not a shard set" if (out / MANIFEST).is_file() else \
            "is not empty and holds no shard set (no manifest.json)"
        raise UserError(f"--out {out}: {what}, e.g. {out / foreign[0]}; refusing to overwrite it "
                        f"(choose an empty or new folder, or give --overwrite to replace the whole folder)")


def write_shards(source: ShardSource, out_dir: str | Path, overwrite: bool = False) -> Manifest:
    """Write every shard, the test set and the manifest to ``out_dir``, atomically.

    Everything goes to a temporary directory beside ``out_dir`` first, the manifest last;
    only a complete set is renamed into place, replacing an earlier shard directory (or, with
    ``overwrite``, any folder that holds no source of the data: :func:`check_out_folder`). A
    failure (a full disk included: a UserError naming the file) leaves ``out_dir`` as it was
    and nothing beside it. Shards are built and written one client at a time, so only one
    client's float64 copy is in memory at once.

    Returns:
        The manifest of the written directory.
    """
    import shutil
    import tempfile

    from mpifc.atomic import atomic_write_text, name_output, remove_empty_folders

    out = Path(out_dir).resolve()
    sources = [f for f in source.manifest_fields().get("source", {}).get("files", []) if isinstance(f, str)]
    check_out_folder(out, sources, overwrite)
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        remove_empty_folders(made)
        raise UserError(f"--out {out}: cannot be written ({exc.strerror or exc})") from None
    name_output(tmp, f"--out {out}")  # a failed write names the folder the user gave
    try:
        os.chmod(tmp, 0o755)
        clients = []
        progress.phase(lambda: f"writing {source.n_clients} shards: {len(clients)} done")
        for i in range(source.n_clients):
            shard = source.client_shard(i)
            file = f"client-{i}.h5"
            write_client(tmp / file, shard)
            entry = {"index": i, "file": file, "features": shard.features,
                     "n_train": int(shard.x_train.shape[0]), "n_test": int(shard.x_test.shape[0])}
            if shard.x_valid.shape[0]:
                entry["n_valid"] = int(shard.x_valid.shape[0])
            clients.append({**entry, "sha256": sha256_file(tmp / file)})
            del shard
        extra = source.extra_files() if hasattr(source, "extra_files") else {}
        for name, text in extra.items():
            (tmp / name).write_text(text, encoding="utf-8")
        test = source.test_set()
        _write_h5(tmp / TEST_FILE, {"x": test.x.astype(np.float64, copy=False),
                                    "ids": test.ids.astype(np.int64, copy=False)},
                  {"features": json.dumps(test.features), "format": FORMAT})
        manifest = {"format": FORMAT, **source.manifest_fields(), **({"schema": SCHEMA_FILE} if SCHEMA_FILE in extra else {}),
                    "n_clients": source.n_clients,
                    "clients": clients, "test": {"file": TEST_FILE, "n": int(test.x.shape[0]),
                                                 "sha256": sha256_file(tmp / TEST_FILE)}}
        del test
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            # a directory cannot be renamed over a non-empty one: move the old set aside
            # first, and put it back if the swap fails
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "previous")
            # Checked again now that nobody can add to it: only our own files are deleted.
            foreign = [] if overwrite else foreign_entries(old / "previous")
            if foreign:
                os.replace(old / "previous", out)
                shutil.rmtree(old, ignore_errors=True)
                raise UserError(f"--out {out}: {out / foreign[0]} appeared while the shards were written; "
                                f"the folder was left as it was")
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old / "previous", out)
                shutil.rmtree(old, ignore_errors=True)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_folders(made)
        raise UserError(f"--out {out}: cannot be written ({exc.strerror or exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_folders(made)
        raise
    return load_manifest(out)


# --------------------------------------------------------------------------- reading
def load_manifest(directory: str | Path) -> Manifest:
    """Parse and check ``directory/manifest.json``.

    Raises:
        UserError: missing file, invalid JSON, another format, or a missing key.
    """
    d = Path(directory)
    path = d / MANIFEST
    if not path.is_file():
        raise UserError(f"{path}: not found (not a shard directory?)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise UserError(f"{path}: format {got!r}, expected {FORMAT!r}")
    for key in _REQUIRED:
        if key not in raw:
            raise UserError(f"{path}: missing field {key!r}")
    check_manifest(raw, path)
    return Manifest(directory=d, dataset=raw["dataset"], setting=raw["setting"],
                    split=raw["split"], seed=raw["seed"], n_clients=raw["n_clients"],
                    target=raw["target"], classes=raw["classes"], features=raw["features"],
                    feature_order=raw["feature_order"], clients=raw["clients"],
                    test=raw["test"], preprocessing=raw["preprocessing"],
                    label_owner=raw["label_owner"], raw=raw)


_META_TYPES = ("real", "discrete", "categorical")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _file_name(value: object) -> bool:
    return isinstance(value, str) and bool(value) and "/" not in value and "\\" not in value and \
        value not in (".", "..")


def _sha(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_manifest(raw: dict, path: Path) -> None:
    """The fields every reader relies on have the types and values this module's docstring gives.

    Raises:
        UserError: naming ``path`` and the first field at fault.
    """
    def bad(field: str, want: str) -> UserError:
        return UserError(f"{path}: field {field!r} must be {want}")

    for key in ("dataset", "setting", "split"):
        if not isinstance(raw[key], str):
            raise bad(key, "a string")
    if not isinstance(raw["seed"], int) or isinstance(raw["seed"], bool):
        raise bad("seed", "an integer")
    n = raw["n_clients"]
    if not _count(n) or n < 1:
        raise bad("n_clients", "an integer >= 1")
    if raw["target"] is not None and not isinstance(raw["target"], str):
        raise bad("target", "a feature name or null")
    if raw["classes"] is not None and not isinstance(raw["classes"], list):
        raise bad("classes", "a list or null")
    if not isinstance(raw["preprocessing"], dict):
        raise bad("preprocessing", "an object")
    if not (raw["label_owner"] == "all" or _count(raw["label_owner"])):
        raise bad("label_owner", "a client index or \"all\"")
    feats = raw["features"]
    if not isinstance(feats, dict) or not feats:
        raise bad("features", "a non-empty object")
    for name, info in feats.items():
        if not isinstance(info, dict) or info.get("meta_type") not in _META_TYPES:
            raise bad(f"features.{name}.meta_type", "one of " + ", ".join(_META_TYPES))
        k = info.get("n_categories")
        if k is not None and not _count(k):
            raise bad(f"features.{name}.n_categories", "an integer >= 0 or null")
    order = raw["feature_order"]
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(feats) or len(set(map(str, order))) != len(order) \
            or not all(isinstance(f, str) for f in order):
        raise bad("feature_order", "a list naming every feature of 'features' once")
    if raw["target"] is not None and raw["target"] not in feats:
        raise bad("target", "a feature of 'features' or null")
    clients = raw["clients"]
    if not isinstance(clients, list):
        raise bad("clients", "a list")
    if len(clients) != n:
        raise UserError(f"{path}: field 'clients' lists {len(clients)} clients, 'n_clients' says {n}")
    for i, c in enumerate(clients):
        where = f"clients[{i}]"
        if not isinstance(c, dict):
            raise bad(where, "an object")
        if c.get("index") != i or isinstance(c.get("index"), bool):
            raise bad(f"{where}.index", f"{i}")
        if not _file_name(c.get("file")):
            raise bad(f"{where}.file", "a file name in the shard folder")
        cf = c.get("features")
        if not isinstance(cf, list) or not cf or not all(isinstance(f, str) and f in feats for f in cf) \
                or len(set(cf)) != len(cf):
            raise bad(f"{where}.features", "a non-empty list of distinct features of 'features'")
        for key in ("n_train", "n_test"):
            if not _count(c.get(key)):
                raise bad(f"{where}.{key}", "an integer >= 0")
        if not _sha(c.get("sha256")):
            raise bad(f"{where}.sha256", "64 lower-case hex digits")
    test = raw["test"]
    if not isinstance(test, dict):
        raise bad("test", "an object")
    if not _file_name(test.get("file")):
        raise bad("test.file", "a file name in the shard folder")
    if not _count(test.get("n")):
        raise bad("test.n", "an integer >= 0")
    if not _sha(test.get("sha256")):
        raise bad("test.sha256", "64 lower-case hex digits")
    if "image" in raw and raw["image"] is not None and not isinstance(raw["image"], dict):
        raise bad("image", "an object")


def input_files(manifest: Manifest) -> list[tuple[str, Path]]:
    """``(what, path)`` of every file of a shard set: the manifest, each client's shard, the test
    set (what a job must never overwrite)."""
    d = Path(manifest.directory)
    return ([("the manifest", d / MANIFEST)] + [("shard", d / c["file"]) for c in manifest.clients]
            + [("test set", d / manifest.test["file"])])


def source_files(manifest: Manifest) -> list[tuple[str, Path]]:
    """``(what, path)`` of every file on this machine the shard set was made from (the user's
    CSV and its schema, a dataset's files: ``source.files``), which no job may overwrite."""
    files = (manifest.raw.get("source") or {}).get("files") or []
    return [("source file", Path(f)) for f in files if isinstance(f, str) and os.path.isabs(f)]


def _checked_file(directory: Path, entry: dict, verify: bool) -> Path:
    path = directory / entry["file"]
    if not path.is_file():
        raise UserError(f"{path}: shard file not found")
    if verify:
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise UserError(f"{path}: checksum mismatch (manifest {entry['sha256'][:12]}..., "
                            f"file {digest[:12]}...): the shard is corrupt or was altered")
    return path


def _dataset(f: h5py.File, name: str, path: Path, shape: tuple, dtype) -> np.ndarray:
    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise UserError(f"{path}: dataset {name!r} missing")
    arr = f[name][()]
    if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
        got = f"{arr.dtype} {arr.shape}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise UserError(f"{path}: dataset {name!r} is {got}, expected {np.dtype(dtype)} {shape}")
    return arr


def check_finite(x: np.ndarray, features: list[str], path: Path, name: str) -> None:
    """Refuse infinite values in ``x`` (``(n, d)`` over ``features``; NaN = missing is allowed),
    naming the file, the dataset, the column and the first row."""
    bad = np.isinf(x)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise UserError(f"{path}: dataset {name!r}, column {features[col]!r}, row {row}: {x[row, col]!r} is not "
                        f"finite (NaN marks a missing value; infinite values are refused)")


def read_client(directory: str | Path, index: int, verify: bool = True, manifest: Manifest | None = None
                ) -> ClientShard:
    """Read client ``index``'s shard, checking it against the manifest.

    Args:
        directory: the shard directory.
        index: client index, ``0..n_clients-1``.
        verify: check the file's SHA-256 against the manifest first.
        manifest: ``directory``'s manifest, if read already (:func:`load_manifest` checks every
            client's entry, so a rank of a many-client job reads it once, not per call).

    Raises:
        UserError: no such client, a missing, corrupt or malformed file.
    """
    m = load_manifest(directory) if manifest is None else manifest
    if not 0 <= index < m.n_clients:
        raise UserError(f"{m.directory / MANIFEST}: no client {index} (n_clients = "
                        f"{m.n_clients})")
    entry = m.clients[index]
    path = _checked_file(m.directory, entry, verify)
    d = len(entry["features"])
    n_valid = entry.get("n_valid", 0)
    if isinstance(n_valid, bool) or not isinstance(n_valid, int) or n_valid < 0:
        raise UserError(f"{m.directory / MANIFEST}: client {index}: field 'n_valid' must be an "
                        f"integer >= 0, got {n_valid!r}")
    try:
        with h5py.File(path, "r") as f:
            feats = json.loads(f.attrs.get("features", "null"))
            if feats != entry["features"]:
                raise UserError(f"{path}: features attribute disagrees with the manifest")
            if not n_valid and "valid" in f:
                raise UserError(f"{path}: holds a 'valid' group that the manifest does not list "
                                "(no 'n_valid' for this client)")
            valid = {} if not n_valid else {
                "x_valid": _dataset(f, "valid/x", path, (n_valid, d), np.float64),
                "ids_valid": _dataset(f, "valid/ids", path, (n_valid,), np.int64)}
            shard = ClientShard(
                index=index, features=feats, meta_types=m.meta_types(feats),
                x_train=_dataset(f, "train/x", path, (entry["n_train"], d), np.float64),
                ids_train=_dataset(f, "train/ids", path, (entry["n_train"],), np.int64),
                x_test=_dataset(f, "test/x", path, (entry["n_test"], d), np.float64),
                ids_test=_dataset(f, "test/ids", path, (entry["n_test"],), np.int64), **valid)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{path}: not a readable HDF5 file ({exc})") from None
    check_finite(shard.x_train, feats, path, "train/x")
    check_finite(shard.x_test, feats, path, "test/x")
    check_finite(shard.x_valid, feats, path, "valid/x")
    return shard


def read_test(directory: str | Path, verify: bool = True) -> TestSet:
    """Read the full held-out test set over ``feature_order``.

    Raises:
        UserError: a missing, corrupt or malformed file.
    """
    m = load_manifest(directory)
    path = _checked_file(m.directory, m.test, verify)
    n, d = m.test["n"], len(m.feature_order)
    try:
        with h5py.File(path, "r") as f:
            feats = f.attrs.get("features")
            if feats is not None and json.loads(feats) != list(m.feature_order):
                raise UserError(f"{path}: features attribute disagrees with the manifest's feature_order")
            test = TestSet(features=list(m.feature_order),
                           x=_dataset(f, "x", path, (n, d), np.float64),
                           ids=_dataset(f, "ids", path, (n,), np.int64))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{path}: not a readable HDF5 file ({exc})") from None
    check_finite(test.x, test.features, path, "x")
    return test
