"""Atomic file writes, for every layer: a reader sees the old file or the whole new one.

The new content goes to a temp file in the target's folder, which is renamed over the target
only once it is complete; on any error the temp file is removed and the target left untouched.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on normal exit it replaces ``path``, on error it is removed.

    The file gets the mode a plain ``open()`` would give (mkstemp alone would leave it 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (fsynced before the rename); returns the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_problem(path: str | os.PathLike, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written, or None if it can (checked without touching ``path``).

    ``folder``: ``path`` is a folder to write files into (created if missing), not a file. The
    check creates and removes a probe file in the nearest folder that exists, so it sees what a
    write would meet (a read-only file system, a permission, a file where a folder should be).
    """
    p = Path(os.path.abspath(path))
    if p.exists():
        if folder and not p.is_dir():
            return f"{p} is a file, not a folder"
        if not folder and p.is_dir():
            return f"{p} is a folder, not a file"
    base = p if folder else p.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"{base} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".mpifc-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot create files in {base} ({e.strerror or e})"
    return None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (symbolic and hard links followed)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(outputs: list[tuple[str, str | os.PathLike | None, bool]],
                  inputs: list[tuple[str, str | os.PathLike]]) -> None:
    """Refuse outputs that cannot be written, that would overwrite an input, or that share a path.

    Args:
        outputs: ``(flag, path or None, is_folder)`` per output (None: not asked for).
        inputs: ``(what, path)`` per input file, e.g. ``("shard", "DIR/client-0.h5")``.

    Raises:
        UserError: one line naming the flag and the path.
    """
    from mpifc.errors import UserError

    given = [(flag, Path(path), is_folder) for flag, path, is_folder in outputs if path not in (None, "")]
    for flag, path, is_folder in given:
        for what, src in inputs:
            if same_file(path, src):
                raise UserError(f"{flag} {path}: is an input of this job ({what} {src}); refusing to overwrite it")
    for i, (flag, path, _) in enumerate(given):
        for flag2, path2, _ in given[i + 1:]:
            if same_file(path, path2):
                raise UserError(f"{flag} {path} and {flag2} {path2}: the same file; give each output its own path")
    for flag, path, is_folder in given:
        problem = write_problem(path, folder=is_folder)
        if problem is not None:
            raise UserError(f"{flag} {path}: cannot be written: {problem}")
