"""A job's output files: written beside their final path, renamed into place only if the job succeeds.

A model written by the server while a client is already lost must not appear at its final path:
the job failed, and a user (or a script) would take the file for its result. So a job writes
each output to a partial file in the output's own folder (:meth:`StagedOutputs.stage`), and the
runner renames them all into place (:meth:`StagedOutputs.commit`) only after every rank has
finished and every file was written. A failing rank removes its partial files before it aborts
(:meth:`StagedOutputs.discard`); partial files of a rank killed outright are removed by the node
sentinel (:mod:`mpifc.runtime.sentinel`), to which each one is registered. Folders made for an
output (``--audit DIR`` where DIR did not exist) are removed again when the job fails.

A failed write of a partial file names the output as the user gave it (``--model m.h5: cannot
be written (No space left on device)``, :func:`mpifc.atomic.output_label`), not the partial name.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mpifc.atomic import name_output, output_label, write_error


class StagedOutputs:
    """This rank's outputs not yet in place.

    Args:
        node: the rank's :class:`~mpifc.runtime.node.NodeView` (registers partial files with the
            sentinel), or None.
    """

    def __init__(self, node: Any = None) -> None:
        self.node = node
        self._files: list[tuple[Path, Path, str | None]] = []  # (partial, final, sentinel key)
        self._made: list[tuple[Path, str | None]] = []  # folders made for outputs (and sentinel keys), in order

    def stage(self, final: str | os.PathLike, shared: bool = False) -> Path:
        """The partial path to write instead of ``final`` (same folder, hidden name); its folder
        is made if missing.

        ``shared``: the partial name does not depend on the process, so another rank of the
        same job can find it (e.g. rank 0 merging every rank's audit file before they are in
        place)."""
        final = Path(final)
        self._make_folder(final.parent)
        partial = shared_partial(final) if shared else \
            final.with_name(f".{final.name}.partial-{os.getpid()}-{len(self._files)}")
        name_output(partial, output_label(final))
        key = self.node.stage(partial) if self.node is not None else None
        self._files.append((partial, final, key))
        return partial

    def _make_folder(self, folder: Path) -> None:
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            except OSError as e:
                raise write_error(d, e) from None
            # the sentinel removes it (if empty) when this rank is killed before it can
            self._made.append((d, self.node.stage(d) if self.node is not None else None))

    def commit(self) -> list[Path]:
        """Rename every partial file that was written to its final path; returns those paths."""
        done = []
        for partial, final, key in self._files:
            if partial.exists():
                if self.node is not None:
                    self.node.committing(partial, final)  # undone if the job still fails
                try:
                    os.replace(partial, final)
                except OSError as e:
                    raise write_error(final, e) from None
                done.append(final)
            if key is not None:
                self.node.unstage(key)
        self._files.clear()
        self._forget_folders(remove=False)
        return done

    def discard(self) -> None:
        """Remove every partial file (the job failed), and the temp files of a write of it. The
        node sentinel keeps their names and removes them again once the ranks are gone (a write
        may still have been under way)."""
        from mpifc.runtime.sentinel import remove_partial

        for partial, _, key in self._files:
            remove_partial(str(partial))
        self._files.clear()
        self._forget_folders(remove=True)

    def _forget_folders(self, remove: bool) -> None:
        for d, key in reversed(self._made):  # deepest first
            if remove:
                try:
                    d.rmdir()
                except OSError:
                    # Still holds another rank's partial files: left registered, so the node
                    # sentinel removes it once they are gone.
                    continue
            if key is not None:
                self.node.unstage(key)
        self._made.clear()


def shared_partial(final: str | os.PathLike) -> Path:
    """The partial file of ``final`` staged with ``shared=True`` (by whichever rank)."""
    final = Path(final)
    return final.with_name(f".{final.name}.partial")


@contextmanager
def after_job(path: str | os.PathLike) -> Iterator[None]:
    """Around writing an output after the job's outputs were put in place (e.g. the answer of
    ``mpifc query --distributed``, built from the job's result): if the job still fails before
    this rank ends, the node sentinel removes the file and its temp files."""
    from mpifc.runtime import node

    view = node.current()
    if view is not None:
        view.writing(Path(path))
    yield
    if view is not None:
        view.committing(Path(path), Path(path))


_current: StagedOutputs | None = None


def current() -> StagedOutputs | None:
    """The staged outputs of the job this process runs, if any (for the abort path)."""
    return _current


def set_current(outputs: StagedOutputs | None) -> None:
    global _current
    _current = outputs
