"""Progress lines for people watching a long command: never more than :data:`EVERY_S` seconds of
silence in any phase.

A :class:`Ticker` runs a small daemon thread. Code says what it is doing with :func:`phase` (a
no-op when no ticker runs, so library code may call it freely) and may print its own progress
with :meth:`Ticker.say`; whenever :data:`EVERY_S` seconds pass without a line, the ticker prints
one itself: ``PROG: <phase> ... [N s]``. A phase announced with ``quiet=True`` is one whose own
code reports its progress (EM iterations): the ticker stays silent in it.

Only the process a person reads runs a ticker (rank 0 of an MPI job, or the one process of
``python -m data_prep``, ``mpifc evaluate``, ``mpifc query``), and only for human output: ``--json``
and ``--quiet`` print no progress. Lines go to stdout, beside the human summary; stderr stays
for errors and warnings (bad input is one line there, however long the command ran).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

EVERY_S = 4.0
"""Seconds of silence after which the ticker prints a line (the promise to users is 5 s)."""

_current: "Ticker | None" = None


class Ticker:
    """Prints a line on ``stream`` whenever :data:`EVERY_S` seconds pass without one.

    Args:
        prog: the line's prefix, e.g. ``"mpifc train"``.
        stream: where lines go (default: stdout, read at each line).
        every: seconds of silence before a line.
    """

    def __init__(self, prog: str, stream: TextIO | None = None, every: float = EVERY_S) -> None:
        self.prog = prog
        self._stream = stream
        self.every = float(every)
        self._lock = threading.Lock()
        self._status: str | Callable[[], str] | None = None
        self._since = time.monotonic()
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def phase(self, status: str | Callable[[], str], quiet: bool = False) -> None:
        """What is being done now (a text, or a function giving it at print time)."""
        with self._lock:
            self._status = None if quiet else status
            self._since = time.monotonic()

    def say(self, line: str) -> None:
        """Print ``PROG: line`` now (and restart the silence clock)."""
        with self._lock:
            self._write(line)

    def _write(self, line: str) -> None:
        stream = sys.stdout if self._stream is None else self._stream
        stream.write(f"{self.prog}: {line}\n")
        stream.flush()
        self._last = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(min(0.25, self.every / 5)):
            with self._lock:
                now = time.monotonic()
                if self._status is None or now - self._last < self.every:
                    continue
                status = self._status() if callable(self._status) else self._status
                self._write(f"{status} ... [{now - self._since:.0f} s]")

    def __enter__(self) -> "Ticker":
        global _current
        self._thread = threading.Thread(target=self._run, name="mpifc-progress", daemon=True)
        self._thread.start()
        _current = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _current
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if _current is self:
            _current = None

    def stop(self) -> None:
        """Stop printing (``--json`` or ``--quiet`` turned out to be asked for)."""
        self.__exit__(None, None, None)


class _Silent:
    """Stands in for a ticker where no progress is printed (``--json``, ``--quiet``, other ranks)."""

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def phase(self, status: str | Callable[[], str], quiet: bool = False) -> None:
        return None

    def say(self, line: str) -> None:
        return None


class _Joined:
    """The ticker already running in this process, for code that would start its own: it shares
    that ticker's clock and prefix, and leaving it does not stop it."""

    def __init__(self, running: Ticker) -> None:
        self._t = running

    def __enter__(self) -> "_Joined":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def phase(self, status: str | Callable[[], str], quiet: bool = False) -> None:
        self._t.phase(status, quiet)

    def say(self, line: str) -> None:
        self._t.say(line)


def ticker(prog: str, enabled: bool = True) -> "Ticker | _Joined | _Silent":
    """A :class:`Ticker` for ``prog`` when ``enabled`` (human output); the one already running,
    if any (the command line starts one before its imports, so start-up is covered too); else a
    silent stand-in."""
    if not enabled:
        return _Silent()
    return _Joined(_current) if _current is not None else Ticker(prog)


def running() -> bool:
    """Whether a ticker runs in this process."""
    return _current is not None


def phase(status: str | Callable[[], str], quiet: bool = False) -> None:
    """Tell the running ticker, if any, what is being done now."""
    t = _current
    if t is not None:
        t.phase(status, quiet)


def say(line: str) -> None:
    """Print a progress line through the running ticker, if any."""
    t = _current
    if t is not None:
        t.say(line)
