"""NGM model files: HDF5, written atomically, no pickle.

Layout (``format = "mpifc-ngm/1"``)::

    /                 attrs: format, meta (JSON of NGM.to_payload's metadata), extra (JSON)
    /arrays/<name>    every array of NGM.to_payload (weights w<k>/b<k>, mean, std, marginals,
                      the graph's uint8 adjacency, sampler calibration)

The graph travels with the model (``arrays/adjacency`` over ``meta.schema``'s feature order),
so a file is self-contained. ``extra`` holds what the writer wants to remember (the shard
directory, the release rule, training settings, ...).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifc.atomic import atomic_h5
from mpifc.errors import UserError
from mpifc.ngm.model import NGM

FORMAT = "mpifc-ngm/1"


def save_ngm(model: NGM, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to ``path`` (built in memory, then a temp file in the same folder renamed
    over ``path``; a failed write is a UserError naming ``path``)."""
    meta, arrays = model.to_payload()
    with atomic_h5(path) as f:
        f.attrs["format"] = FORMAT
        f.attrs["meta"] = json.dumps(meta)
        f.attrs["extra"] = json.dumps(extra or {})
        g = f.create_group("arrays")
        for name, a in arrays.items():
            g.create_dataset(name, data=np.ascontiguousarray(a))
    return Path(path)


def load_ngm(path: str | Path) -> tuple[NGM, dict[str, Any]]:
    """``(model, extra)`` from a file written by :func:`save_ngm`.

    Raises:
        UserError: missing file, not an NGM model file, or a malformed one (naming the file).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"NGM model file {path} not found")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise UserError(f"{path}: not an NGM model file (format {f.attrs.get('format')!r}, "
                                f"expected {FORMAT!r}); FedPC models need --model-family fc")
            meta = json.loads(f.attrs["meta"])
            extra = json.loads(f.attrs.get("extra", "{}"))
            arrays = {name: np.asarray(ds[()]) for name, ds in f["arrays"].items()}
    except OSError as e:
        raise UserError(f"{path}: cannot read as HDF5 ({e})") from None
    except (KeyError, ValueError) as e:
        raise UserError(f"{path}: malformed NGM model file ({e})") from None
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise UserError(f"{path}: array {name!r} holds a value that is not finite")
    try:
        return NGM.from_payload(meta, arrays), extra
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def is_ngm_file(path: str | Path) -> bool:
    """True when ``path`` is an HDF5 file written by :func:`save_ngm`."""
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("format") == FORMAT
    except OSError:
        return False
