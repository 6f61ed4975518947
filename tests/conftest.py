"""Suite-wide order: test files run longest first, so that the two workers finish together.

``launch/test.sh`` runs each test file whole on one of two workers (``--dist loadfile``) and hands
the files out in collection order (``--no-loadscope-reorder``). A file of one-minute MPI jobs
handed out last keeps one worker busy while the other idles; handed out first, the short files
fill the gaps around it. The order comes from measured seconds per file in ``file_seconds.json``
beside this file (a file not listed counts as the median). Refresh the table with a whole run:
``bash launch/test.sh --file-seconds tests/file_seconds.json`` (a partial run updates its files).
The order decides only when a file starts, never what it checks.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")


def pytest_addoption(parser):
    parser.addoption("--file-seconds", default=None, metavar="PATH",
                     help="write each test file's measured seconds (setup + call + teardown) to PATH, "
                          "a JSON table that orders the files longest first (default: none written)")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _seconds(path: Path) -> dict[str, float]:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in table.items()} if isinstance(table, dict) else {}


def pytest_collection_modifyitems(items):
    seconds = _seconds(TABLE)
    if not seconds:
        return
    unknown = statistics.median(seconds.values())
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_file(item.nodeid), i)
    # Stable: a file's tests keep their order, files of equal cost keep collection order.
    items.sort(key=lambda it: (-seconds.get(_file(it.nodeid), unknown), first_seen[_file(it.nodeid)]))


_totals: dict[str, float] | None = None  # per file, on the process that reports (not on workers)
_out: Path | None = None


def pytest_configure(config):
    global _totals, _out
    if config.getoption("file_seconds") and not hasattr(config, "workerinput"):
        _totals, _out = defaultdict(float), Path(config.getoption("file_seconds"))


def pytest_runtest_logreport(report):
    if _totals is not None:
        _totals[_file(report.nodeid)] += report.duration


def pytest_sessionfinish():
    if not _totals or _out is None:
        return
    from mpifc.atomic import atomic_write_text

    table = {**_seconds(_out), **{k: round(v, 1) for k, v in _totals.items()}}
    atomic_write_text(_out, json.dumps(dict(sorted(table.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
