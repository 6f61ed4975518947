"""A job's output files: written beside their final path, renamed into place only if the job succeeds.

A model written by the server while a client is already lost must not appear at its final path:
the job failed, and a user (or a script) would take the file for its result. So a job writes
each output to a partial file in the output's own folder (:meth:`StagedOutputs.stage`), and the
runner renames them all into place (:meth:`StagedOutputs.commit`) only after every rank has
finished and every file was written. A failing rank removes its partial files before it aborts
(:meth:`StagedOutputs.discard`); partial files of a rank killed outright are removed by the node
sentinel (:mod:`mpifc.runtime.sentinel`), to which each one is registered.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


class StagedOutputs:
    """This rank's outputs not yet in place.

    Args:
        node: the rank's :class:`~mpifc.runtime.node.NodeView` (registers partial files with the
            sentinel), or None.
    """

    def __init__(self, node: Any = None) -> None:
        self.node = node
        self._files: list[tuple[Path, Path, str | None]] = []  # (partial, final, sentinel key)

    def stage(self, final: str | os.PathLike) -> Path:
        """The partial path to write instead of ``final`` (same folder, hidden name)."""
        final = Path(final)
        partial = final.with_name(f".{final.name}.partial-{os.getpid()}-{len(self._files)}")
        key = self.node.stage(partial) if self.node is not None else None
        self._files.append((partial, final, key))
        return partial

    def commit(self) -> list[Path]:
        """Rename every partial file that was written to its final path; returns those paths."""
        done = []
        for partial, final, key in self._files:
            if partial.exists():
                if self.node is not None:
                    self.node.committing(partial, final)  # undone if the job still fails
                os.replace(partial, final)
                done.append(final)
            if key is not None:
                self.node.unstage(key)
        self._files.clear()
        return done

    def discard(self) -> None:
        """Remove every partial file (the job failed), and the temp files of a write of it. The
        node sentinel keeps their names and removes them again once the ranks are gone (a write
        may still have been under way)."""
        from mpifc.runtime.sentinel import remove_partial

        for partial, _, key in self._files:
            remove_partial(str(partial))
        self._files.clear()


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
