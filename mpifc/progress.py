"""Progress lines for people watching a long command: never more than :data:`EVERY_S` seconds of
silence in any phase.

A :class:`Ticker` starts a tiny helper process (a Python interpreter without site packages, a
few MB) that shares the command's stdout. Code says what it is doing with :func:`phase` (a no-op
when no ticker runs, so library code may call it freely) and may print its own progress with
:func:`say`; whenever :data:`EVERY_S` seconds pass without a line, the helper prints one itself:
``PROG: <phase> ... [N s]``. The helper, not a thread, keeps the clock, so a line comes on time
even while the command holds Python's GIL for seconds (a C extension's import on a loaded
machine); it exits when told, or as soon as the command's process is gone (its pipe closes).

Only the process a person reads runs a ticker (rank 0 of an MPI job, or the one process of
``python -m data_prep``, ``mpifc evaluate``, ``mpifc query``), and only for human output: ``--json``
and ``--quiet`` print no progress. Lines go to stdout, beside the human summary; stderr stays
for errors and warnings (bad input is one line there, however long the command ran).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Callable

EVERY_S = 4.0
"""Seconds of silence after which the ticker prints a line (the promise to users is 5 s)."""

_current: "Ticker | None" = None

_HELPER = r"""
import os, select, sys, time
prog, every = sys.argv[1], float(sys.argv[2])
status, since, last, buf = None, time.monotonic(), time.monotonic(), b""
while True:
    ready = select.select([0], [], [], min(0.25, every / 5))[0]
    now = time.monotonic()
    if ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        stop = False
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd, _, text = line.decode("utf-8", "replace").partition(" ")
            if cmd == "phase":
                status, since = text or None, now
            elif cmd == "text":
                status = text or None
            elif cmd == "said":
                last = now
            elif cmd == "stop":
                stop = True
        if stop:
            break
    if status is not None and now - last >= every:
        try:
            os.write(1, f"{prog}: {status} ... [{now - since:.0f} s]\n".encode())
        except OSError:
            break
        last = now
"""


class Ticker:
    """Prints ``PROG: <phase> ... [N s]`` on stdout whenever ``every`` seconds pass without a line.

    Use it as a context manager; :meth:`phase` and :meth:`say` may be called from any thread.

    Args:
        prog: the line's prefix, e.g. ``"mpifc train"``.
        every: seconds of silence before a line.
    """

    def __init__(self, prog: str, every: float = EVERY_S) -> None:
        self.prog = prog
        self.every = float(every)
        self._lock = threading.Lock()
        self._status: str | Callable[[], str] | None = None
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _send(self, line: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write((" ".join(line.split("\n")) + "\n").encode())
            proc.stdin.flush()
        except (OSError, ValueError):  # the helper is gone: no more progress lines, nothing else
            self._proc = None

    def phase(self, status: str | Callable[[], str], quiet: bool = False) -> None:
        """What is being done now (a text, or a function giving it, asked again every second);
        ``quiet``: a phase that prints its own lines."""
        with self._lock:
            self._status = None if quiet else status
            self._send("phase " + ("" if self._status is None else self._text()))

    def _text(self) -> str:
        status = self._status
        try:
            return status() if callable(status) else str(status)
        except Exception:  # noqa: BLE001 - a progress text never fails the command
            return "working"

    def say(self, line: str) -> None:
        """Print ``PROG: line`` now (and restart the silence clock)."""
        with self._lock:
            sys.stdout.write(f"{self.prog}: {line}\n")
            sys.stdout.flush()
            self._send("said")

    def _refresh(self) -> None:
        """Keep the helper's copy of a changing text (``"2 of 3 clients done"``) current."""
        while not self._stop.wait(1.0):
            with self._lock:
                if callable(self._status):
                    self._send("text " + self._text())

    def __enter__(self) -> "Ticker":
        global _current
        sys.stdout.flush()
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER, self.prog, str(self.every)],
                                          stdin=subprocess.PIPE, stdout=None, stderr=subprocess.DEVNULL,
                                          close_fds=True)
        except OSError:
            self._proc = None  # no helper, no progress lines: the command itself goes on
        self._thread = threading.Thread(target=self._refresh, name="mpifc-progress", daemon=True)
        self._thread.start()
        _current = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop printing (the command is done, or ``--json``/``--quiet`` turned out to be asked for)."""
        global _current
        self._stop.set()
        with self._lock:
            self._send("stop")
            proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()
                proc.wait(timeout=2.0)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        if _current is self:
            _current = None


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


class _Joined(_Silent):
    """The ticker already running in this process, for code that would start its own: it shares
    that ticker's clock and prefix, and leaving it does not stop it."""

    def __init__(self, running: Ticker) -> None:
        self._t = running

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
