"""launch/bench/defaults.py: its held-out tables are real csv-dataset files that data_prep reads
whole, with the target and classes their sources have."""
from __future__ import annotations

import json

import pytest

from tests.script_util import REPO, load_script


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(REPO / "launch" / "bench"))
    try:
        return load_script("launch/bench/defaults.py", "defaults_bench")
    finally:
        sys.path.remove(str(REPO / "launch" / "bench"))


@pytest.mark.parametrize("name,rows,classes", [("wine", 178, 3), ("fair", 6366, 2), ("anes96", 944, 2)])
def test_heldout_tables_become_vertical_shards(bench, tmp_path, name, rows, classes) -> None:
    from mpifc.cli.prep import run as prep_run

    if name != "wine":
        pytest.importorskip("statsmodels", reason="the [bench] extra holds statsmodels' tables")
    frame, cols = bench.HELDOUT[name]()
    path = bench.heldout_file(name, tmp_path)
    assert path.is_file() and path.with_name(f"{name}.schema.json").is_file()
    out = tmp_path / "shards"
    assert prep_run(["--dataset", "csv", "--path", str(path), "--setting", "vertical", "--clients", "2",
                     "--out", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"] == cols[-1][0] and len(m["classes"]) == classes and len(frame) == rows
    assert m["n_train"] + m["n_test"] + m["n_valid"] == rows
    # every column of the schema but the target is a feature of exactly one client; the label owner holds the target
    held = [f for c in m["clients"] for f in c["features"] if f != m["target"]]
    assert sorted(held) == sorted(c for c, _ in cols[:-1])
    assert m["target"] in m["clients"][m["label_owner"]]["features"]
