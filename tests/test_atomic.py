"""mpifc.atomic: the one atomic-write helper every layer uses."""
from __future__ import annotations

import os

import pytest

from mpifc.atomic import atomic_path, atomic_write_text


def test_write_replaces_whole_file_with_plain_open_mode(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    mask = os.umask(0)
    os.umask(mask)
    assert (target.stat().st_mode & 0o777) == (0o666 & ~mask)
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_error_leaves_target_untouched_and_no_temp_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("keep")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert target.read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
