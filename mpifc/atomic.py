"""Output files for every layer: written whole or not at all, and never over a file that is not an output.

Writing. New content goes to a temp file in the target's folder, which is renamed over the
target only once it is complete; on any error the temp file is removed and the target left
untouched. Every byte goes through one function (:func:`atomic_write_bytes`); HDF5 files are
built in memory first (:func:`atomic_h5`), so the HDF5 library never meets a full disk. A
failed write (a full disk, a quota, an I/O error) is a :class:`~mpifc.errors.UserError` naming
the output (``--model m.h5: cannot be written (No space left on device)``): one line, exit 2.

Checking. :func:`check_outputs` runs before a job does any work. An output may replace only an
earlier output of its own kind (an mpifc model, a ledger, an answer file, an audit file: each
:class:`OutputKind` recognises its own files by their content, never by their name); anything
else is refused unless the user gives ``--overwrite``. The job's own inputs and the sources a
shard manifest or a model records (the user's CSV, its schema, the shards) are never replaced,
not even with ``--overwrite``.

Testing hook: ``MPIFC_FAULT_DISK_FULL=N`` lets this process write N bytes of output files, after
which every write fails as on a full disk (``ENOSPC``); ``MPIFC_FAULT_DISK_FULL=NAME`` makes only
the writes of output files named NAME fail so. The failure path of every output is tested
without mounting a small file system.
"""
from __future__ import annotations

import errno
import io
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mpifc.errors import UserError

DISK_FULL_ENV = "MPIFC_FAULT_DISK_FULL"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- names -------------------------------------------------------------------------------------
_LABELS: dict[str, str] = {}


def _key(path: str | os.PathLike) -> str:
    return os.path.abspath(path)


def name_output(path: str | os.PathLike, label: str) -> None:
    """Call the file ``path`` ``label`` in error messages (e.g. ``--model out/m.h5`` for the
    model's staged partial file): the user knows the flag and the path given, not the temp name."""
    _LABELS[_key(path)] = label


def output_label(path: str | os.PathLike) -> str:
    """How error messages name the output file ``path`` (see :func:`name_output`; a file under a
    named output folder is named by the folder's flag)."""
    key = _key(path)
    if key in _LABELS:
        return _LABELS[key]
    for folder in Path(key).parents:
        if str(folder) in _LABELS:
            return f"{_LABELS[str(folder)]}/{Path(key).relative_to(folder)}"
    return str(path)


def write_error(path: str | os.PathLike, exc: BaseException) -> UserError:
    """The one-line error for a failed write of ``path``."""
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return UserError(f"{output_label(path)}: cannot be written ({why})")


# -- writing -----------------------------------------------------------------------------------
_written = 0  # bytes this process wrote through _write_all (for the disk-full testing hook)


def _room(path: str | os.PathLike, size: int) -> int | None:
    """How many of ``size`` bytes the :data:`DISK_FULL_ENV` hook lets a write of ``path`` take
    before it fails (None: the whole write goes through)."""
    text = os.environ.get(DISK_FULL_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit():  # a file name: only its writes fail, half-way
        name = os.path.basename(output_label(path).split(" ", 1)[-1])
        return size // 2 if name == text else None
    budget = int(text)
    return max(budget - _written, 0) if _written + size > budget else None


def _write_all(f: Any, data: bytes | memoryview, path: str | os.PathLike) -> None:
    """``f.write(data)``, failing with ENOSPC where the :data:`DISK_FULL_ENV` hook says."""
    global _written
    room = _room(path, len(data))
    if room is not None:
        f.write(data[:room])  # a full disk takes what fits, then refuses
        _written += room
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    f.write(data)
    _written += len(data)


def write_all(f: Any, data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to the binary file ``f`` opened on (a temp file of) the output ``path``,
    as :func:`atomic_write_bytes` does: a file written in parts (a streamed answer) fails on a
    full disk the same way, the :data:`DISK_FULL_ENV` testing hook included."""
    _write_all(f, memoryview(data), path)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on normal exit it replaces ``path``, on error it is removed.

    The file gets the mode a plain ``open()`` would give (mkstemp alone would leave it 0600).
    An ``OSError`` on the way (creating the folder or the temp file, writing, renaming) becomes a
    :class:`UserError` naming ``path`` (:func:`write_error`).
    """
    path = Path(path)
    made = [p for p in path.absolute().parents if not p.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # here: a training rank that writes nothing never imports it

        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        remove_empty_folders(made)
        raise write_error(path, e) from None
    tmp = Path(tmp_name)
    name_output(tmp, output_label(path))
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        remove_empty_folders(made)  # the folders made for it go too
        if isinstance(e, OSError):
            raise write_error(path, e) from None
        raise
    finally:
        _LABELS.pop(_key(tmp), None)


def remove_empty_folders(folders: Sequence[Path]) -> None:
    """Remove ``folders`` (in the order given: deepest first) where they are empty (the folders a
    failed write made)."""
    for d in folders:
        try:
            d.rmdir()
        except OSError:
            pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (fsynced before the rename); returns the path.

    Raises:
        UserError: the write failed (full disk, quota, I/O error), naming ``path``; nothing of
            the new content is left behind and ``path`` is as it was.
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            _write_all(f, memoryview(data), path)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def hdf5_in_memory(**kwargs: Any) -> Iterator[tuple[Any, io.BytesIO]]:
    """``(h5py.File, buffer)``: a new HDF5 file built in memory; once the ``with`` block ends,
    ``buffer.getvalue()`` holds the whole file. ``kwargs`` go to ``h5py.File`` (e.g.
    ``userblock_size``)."""
    import h5py

    buf = io.BytesIO()
    with h5py.File(buf, "w", **kwargs) as f:
        yield f, buf


@contextmanager
def atomic_h5(path: str | os.PathLike, finish: Callable[[bytes], bytes] | None = None,
              **kwargs: Any) -> Iterator[Any]:
    """An ``h5py.File`` to fill; when the ``with`` block ends without error, the file (passed
    through ``finish``, e.g. to seal it) is written to ``path`` by :func:`atomic_write_bytes`.

    The file is built in memory: the HDF5 library never writes to disk, so a full disk is an
    ordinary write error (:class:`UserError` naming ``path``), never a crash inside the library.
    """
    with hdf5_in_memory(**kwargs) as (f, buf):
        yield f
    data = buf.getvalue()
    atomic_write_bytes(path, finish(data) if finish is not None else data)


# -- checking ----------------------------------------------------------------------------------
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
        # A name of this process's own (every rank of a job may probe the same folder at once),
        # created exclusively: no module of temporary names is imported on a rank for it.
        probe = base / f".mpifc-probe-{os.getpid()}-{time.monotonic_ns()}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
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


@dataclass(frozen=True)
class OutputKind:
    """A kind of output file, and how to recognise an earlier one by its content.

    Attributes:
        name: what it is, for messages (``"an mpifc model"``).
        recognise: ``recognise(path)``: whether the existing file ``path`` is an earlier output
            of this kind (read its format marker; never trust the name). Must not raise.
        members: for a folder output (``--audit DIR``): a regular expression matching the names
            of the files the output writes in its folder; ``recognise`` then applies to them.
    """

    name: str
    recognise: Callable[[Path], bool]
    members: str | None = None

    @property
    def folder(self) -> bool:
        return self.members is not None

    def writes(self, folder: Path, path: Path) -> bool:
        """Whether this folder output, in ``folder``, would write the file ``path``."""
        return (self.members is not None and same_file(Path(path).parent, folder)
                and re.fullmatch(self.members, Path(path).name) is not None)


@dataclass(frozen=True)
class Output:
    """One output a job asks for: the flag, the path given (None: not asked for), its kind."""

    flag: str
    path: str | os.PathLike | None
    kind: OutputKind


OVERWRITE_HINT = "give --overwrite to replace it"


def _existing_members(folder: Path, kind: OutputKind) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if re.fullmatch(kind.members or "", p.name))


def check_outputs(outputs: Sequence[Output], inputs: Sequence[tuple[str, str | os.PathLike]],
                  sources: Sequence[tuple[str, str | os.PathLike]] = (), overwrite: bool = False) -> None:
    """Refuse, before any work, outputs that would destroy a file or cannot be written.

    In this order: an output on an input of the job or on a source (never, whatever
    ``overwrite`` says); two outputs on one file; an existing file that is not an earlier output
    of the same kind (unless ``overwrite``); a path that cannot be written. Each output's path is
    then named by its flag in write errors (:func:`name_output`).

    Args:
        outputs: the job's outputs (those with no path are skipped).
        inputs: ``(what, path)`` per input file of the job, e.g. ``("shard", "DIR/client-0.h5")``.
        sources: ``(what, path)`` per file the inputs were made from (a manifest's or a model's
            record): never replaced either.
        overwrite: the user's ``--overwrite``: replace existing files of another kind.

    Raises:
        UserError: one line naming the flag and the path.
    """
    given = [(o.flag, Path(o.path), o.kind) for o in outputs if o.path not in (None, "")]
    protected = [(what, Path(p), "is an input of this job") for what, p in inputs] + \
                [(what, Path(p), "is a source this job's data was made from") for what, p in sources]
    for flag, path, kind in given:
        for what, src, why in protected:
            if same_file(path, src) or (kind.folder and kind.writes(path, src)):
                hit = src if kind.folder and not same_file(path, src) else path
                raise UserError(f"{flag} {hit}: {why} ({what} {src}); refusing to overwrite it, "
                                f"even with --overwrite")
    for i, (flag, path, kind) in enumerate(given):
        for flag2, path2, kind2 in given[i + 1:]:
            if same_file(path, path2):
                raise UserError(f"{flag} {path} and {flag2} {path2}: the same file; give each output its own path")
            for (fa, pa, ka), (fb, pb, _) in (((flag, path, kind), (flag2, path2, kind2)),
                                              ((flag2, path2, kind2), (flag, path, kind))):
                if ka.folder and ka.writes(pa, pb):
                    raise UserError(f"{fb} {pb}: {fa} {pa} writes a file of that name; give each output its own path")
    for flag, path, kind in given:
        problem = write_problem(path, folder=kind.folder)
        if problem is not None:
            raise UserError(f"{flag} {path}: cannot be written: {problem}")
        targets = _existing_members(path, kind) if kind.folder else ([path] if path.is_file() else [])
        for t in targets:
            if not overwrite and not kind.recognise(t):
                raise UserError(f"{flag} {t}: exists and is not {kind.name}; refusing to overwrite it "
                                f"({OVERWRITE_HINT})")
        name_output(path, f"{flag} {path}")
