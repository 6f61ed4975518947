"""Shard directories for the baseline tests: breast cancer (shipped by scikit-learn) by default,
adult/credit from shared/data when present."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from data_prep.prepare import prepare
from data_prep.shards import write_shards

REPO = Path(__file__).resolve().parents[2]
DATA_ROOT = REPO.parent / "shared" / "data"


def make_shards(out: Path, **kwargs) -> Path:
    """``data_prep.prepare(**kwargs)`` written as shards to ``out``."""
    write_shards(prepare(**kwargs), out)
    return out


def real_data_or_skip(name: str) -> Path:
    """The data root holding ``name``, or skip the test cleanly."""
    if not (DATA_ROOT / name).is_dir():
        pytest.skip(f"{DATA_ROOT / name} is absent")
    return DATA_ROOT


def read_ledger(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def json_line(stdout: str) -> dict:
    """The last JSON line a job printed."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON line in output:\n{stdout}"
    return json.loads(lines[-1])


def phase_bytes(rows: list[dict], phase: str, field: str = "payload_bytes", kinds: set[str] | None = None) -> int:
    return sum(int(r[field]) for r in rows if r["phase"] == phase and (kinds is None or r["kind"] in kinds))
