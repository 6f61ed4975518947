"""``python -m data_prep``: bad input gives one line naming the fault and exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_prep import shards as S
from mpifc.cli.prep import main

from .conftest import REPO


def _write_csv(tmp_path, lines, schema=None):
    data = tmp_path / "people.csv"
    data.write_text("\n".join(lines) + "\n")
    schema = schema or {"columns": [{"name": "age", "type": "discrete"},
                                    {"name": "city", "type": "categorical"},
                                    {"name": "score", "type": "real"},
                                    {"name": "label", "type": "categorical"}],
                        "target": "label"}
    (tmp_path / "people.schema.json").write_text(json.dumps(schema))
    return data


def _rows(n=60):
    rng = np.random.default_rng(0)
    return ["age,city,score,label"] + [
        f"{rng.integers(18, 80)},{['oslo', 'rome', 'lima'][i % 3]},{rng.normal():.4f},"
        f"{'yes' if i % 4 == 0 else 'no'}" for i in range(n)]


def _run_module(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "data_prep", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["unknown", "malformed", "too_many_clients"])
def test_module_exits_2_with_one_line(tmp_path, case):
    rows = _rows()
    data = _write_csv(tmp_path, rows if case != "malformed" else
                      rows[:30] + ["41,oslo,0.5"] + rows[31:])
    args = {"unknown": ["--dataset", "imagenet", "--out", "o"],
            "malformed": ["--dataset", "csv", "--path", str(data), "--out", "o"],
            # --categoricals codes keeps scikit-learn out of the subprocess (a slow import)
            "too_many_clients": ["--dataset", "csv", "--path", str(data), "--categoricals", "codes",
                                 "--setting", "vertical", "--clients", "5", "--out", "o"]}[case]
    expected = {"unknown": "unknown dataset 'imagenet'",
                "malformed": f"{data} line 31: expected 4 fields, got 3",
                "too_many_clients": "cannot split 3 features among 5 clients"}[case]
    proc = _run_module(args, tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("data_prep: error: ")
    assert expected in lines[0]
    assert not (tmp_path / "o").exists()


def test_csv_round_trip_through_the_cli(tmp_path, capsys):
    data = _write_csv(tmp_path, _rows())
    assert main(["--dataset", "csv", "--path", str(data), "--setting", "vertical",
                 "--clients", "2", "--label-owner", "all", "--categoricals", "codes",
                 "--out", str(tmp_path / "o")]) == 0
    assert "client 1: 48 train rows, 12 test rows" in capsys.readouterr().out
    m = S.load_manifest(tmp_path / "o")
    assert m.classes == ["no", "yes"] and m.target == "label"
    assert m.features["city"]["meta_type"] == "categorical"
    assert m.features["city"]["n_categories"] == 3


@pytest.mark.parametrize("args,message", [
    (["--dataset", "csv", "--out", "o"], "--dataset csv needs --path"),
    (["--setting", "horizontal", "--clients", "500", "--out", "o"],
     "client 455 would get no training rows"),
    (["--split", "label", "--clients", "3", "--dataset", "debd:nope", "--path", "nowhere",
      "--out", "o"], "nowhere: not found"),
    (["--dataset", "adult", "--data-root", "/nonexistent", "--out", "o"],
     "/nonexistent/adult: not found"),
    (["--test-fraction", "1.5", "--out", "o"], "--test-fraction must be between 0 and 1"),
    (["--setting", "hybrid", "--clients", "2", "--patches", "2x2", "--dataset", "digits",
      "--out", "o"], "--patches 2x2 gives 4 patches for 2 clients"),
    (["--split", "segment", "--clients", "2", "--segment", "mean_radius>14", "--out", "o"],
     "one --segment per client: got 1 for 2 clients"),
    (["--out", "o", "--max-rows", "0"], "--max-rows must be >= 1"),
    ([], "--out DIR is required"),
])
def test_bad_input_messages(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_schema_errors_name_the_schema_and_column(tmp_path, capsys):
    data = _write_csv(tmp_path, _rows(), schema={"columns": [
        {"name": "age", "type": "discrete"}, {"name": "city", "type": "categorical"},
        {"name": "score", "type": "real"}, {"name": "label", "type": "categorical"}],
        "target": "outcome"})
    assert main(["--dataset", "csv", "--path", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "people.schema.json: target 'outcome' is not one of the schema's columns" in \
        capsys.readouterr().err
    (tmp_path / "people.schema.json").write_text(json.dumps({"columns": [
        {"name": "age", "type": "discrete"}, {"name": "city", "type": "text"}]}))
    assert main(["--dataset", "csv", "--path", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "columns[1] ('city') has type 'text'" in capsys.readouterr().err


def test_missing_target_column_in_the_file(tmp_path, capsys):
    rows = [r.rsplit(",", 1)[0] for r in _rows()]
    data = _write_csv(tmp_path, rows)
    assert main(["--dataset", "csv", "--path", str(data), "--out", str(tmp_path / "o")]) == 2
    assert f"{data}: no target column 'label'" in capsys.readouterr().err


def test_npy_with_schema(tmp_path):
    rng = np.random.default_rng(0)
    arr = np.column_stack([rng.normal(size=50), rng.integers(0, 3, 50), rng.integers(0, 2, 50)])
    arr[3, 0] = np.nan
    np.save(tmp_path / "m.npy", arr)
    (tmp_path / "m.schema.json").write_text(json.dumps({"columns": [
        {"name": "r", "type": "real"}, {"name": "c", "type": "categorical"},
        {"name": "y", "type": "categorical"}], "target": "y"}))
    assert main(["--dataset", "csv", "--path", str(tmp_path / "m.npy"), "--out",
                 str(tmp_path / "o"), "--clients", "2"]) == 0
    m = S.load_manifest(tmp_path / "o")
    assert m.preprocessing["missing"]["r"]["train"] + m.preprocessing["missing"]["r"]["test"] == 1
    assert m.classes == [0, 1]


def test_list_shows_every_dataset(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("breast-cancer", "digits", "adult", "credit", "mnist", "debd", "csv"):
        assert name in out


def test_same_seed_same_checksums_across_processes(tmp_path):
    data = _write_csv(tmp_path, _rows())
    sums = []
    for k, hash_seed in enumerate(("1", "2")):
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=hash_seed)
        proc = subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "csv", "--path",
                               str(data), "--categoricals", "codes", "--setting", "hybrid",
                               "--clients", "2", "--shared-features", "1", "--seed", "9",
                               "--out", f"o{k}"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        sums.append([c["sha256"] for c in S.load_manifest(tmp_path / f"o{k}").clients])
    assert sums[0] == sums[1]
