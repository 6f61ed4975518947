"""Where dataset files live and how they are opened (shared by every loader)."""
from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

from mpifc.errors import UserError


def default_data_root() -> Path:
    """``$MPIFC_DATA`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get("MPIFC_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def open_text(path: Path) -> io.TextIOBase:
    """Text lines of ``path``, transparently gunzipped when it ends in ``.gz``."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def locate(path: Path | None, data_root: Path, folder: str) -> Path:
    """The folder or file to read: ``--path`` if given, else ``data_root/folder``."""
    where = path if path is not None else data_root / folder
    if not where.exists():
        raise UserError(f"{where}: not found (give the dataset's location with --path, or set "
                        "MPIFC_DATA)")
    return where


def find_file(where: Path, names: list[str], what: str) -> Path:
    """The first of ``names`` inside folder ``where`` (or ``where`` itself if it is a file)."""
    if where.is_file():
        return where
    for name in names:
        cand = where / name
        if cand.is_file():
            return cand
    raise UserError(f"{where}: no {what} found (looked for {', '.join(names)})")
