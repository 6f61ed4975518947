"""Malformed inputs, generated: every case is a UserError naming the file or field (the CLI's one
line and exit code 2), never another exception (a traceback), and never a partial output.

In-process for speed (the readers every command uses: the manifest, shard and model readers,
the CSV loader and data_prep's main, the config loader); a handful of real command runs check
that such an error reaches the user as one line and exit code 2.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_prep.shards import load_manifest, read_client, read_test
from data_prep.usercsv import load_user_table
from mpifc.cli import parse_args
from mpifc.cli.prep import main as prep_main
from mpifc.errors import UserError
from mpifc.federated.serialize import load_fc
from tests.mpi_util import run_mpi

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                database=None)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz") / "bc"
    assert prep_main(["--dataset", "breast-cancer", "--clients", "2", "--seed", "0", "--out", str(d)]) == 0
    return d


@pytest.fixture(scope="module")
def model(shards, tmp_path_factory) -> Path:
    m = tmp_path_factory.mktemp("fuzz-model") / "fc.h5"
    r = run_mpi(3, ["-m", "mpifc", "train", str(shards), "--learner", "factorized", "--model", str(m)], timeout=120)
    assert r.returncode == 0, r.stderr
    return m


def read_everything(d: Path) -> None:
    m = load_manifest(d)
    for i in range(m.n_clients):
        read_client(d, i)
    read_test(d)


# -- manifest.json --------------------------------------------------------------------------------
def _paths(raw: dict) -> list[tuple]:
    """The manifest fields the readers rely on, as key paths."""
    out = [(k,) for k in ("format", "dataset", "setting", "split", "seed", "n_clients", "target", "classes",
                          "features", "feature_order", "clients", "test", "preprocessing", "label_owner")]
    for i, _ in enumerate(raw["clients"]):
        out += [("clients", i, k) for k in ("index", "file", "features", "n_train", "n_test", "sha256")]
        out.append(("clients", i))
    out += [("test", k) for k in ("file", "n", "sha256")]
    out += [("features", f, "meta_type") for f in raw["features"]]
    out += [("feature_order", j) for j in range(len(raw["feature_order"]))]
    return out


OTHER_TYPES = [None, True, -3, 2.5, "zz", [], {}, [1, "a"], {"k": 1}]


def _same_type(a, b) -> bool:
    return type(a) is type(b) or (a is None and b is None)


@FUZZ
@given(data=st.data())
def test_mutated_manifest_is_a_user_error_naming_it(shards, data):
    raw = json.loads((shards / "manifest.json").read_text())
    how = data.draw(st.sampled_from(["retype", "delete", "truncate", "negative"]), label="how")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "bc"
        shutil.copytree(shards, d)
        text = (d / "manifest.json").read_text()
        if how == "truncate":
            text = text[: data.draw(st.integers(0, len(text) - 2), label="cut")]
        else:
            path = data.draw(st.sampled_from(_paths(raw)), label="path")
            doc = json.loads(text)
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            old = parent[path[-1]]
            if how == "delete":
                if isinstance(parent, list):
                    parent.pop(path[-1])
                else:
                    del parent[path[-1]]
            elif how == "negative" and path[-1] in ("n_clients", "n_train", "n_test", "n", "index", "label_owner") \
                    and isinstance(old, int) and not isinstance(old, bool):
                parent[path[-1]] = -1 - old
            else:
                nullable = path in (("target",), ("classes",))  # null is a valid value there
                parent[path[-1]] = data.draw(st.sampled_from([v for v in OTHER_TYPES if not _same_type(v, old)
                                                              and not (nullable and v is None)]), label="value")
            text = json.dumps(doc)
        (d / "manifest.json").write_text(text)
        with pytest.raises(UserError) as e:
            read_everything(d)
        assert str(d) in str(e.value)


# -- shard and model files ------------------------------------------------------------------------
def _damage(path: Path, data) -> None:
    blob = bytearray(path.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        del blob[data.draw(st.integers(0, len(blob) - 1), label="keep"):]
    else:
        at = data.draw(st.integers(0, len(blob) - 1), label="byte")
        blob[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    path.write_bytes(bytes(blob))


@FUZZ
@given(data=st.data())
def test_damaged_shard_is_a_user_error_naming_it(shards, data):
    name = data.draw(st.sampled_from(["client-0.h5", "client-1.h5", "test.h5"]), label="file")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "bc"
        shutil.copytree(shards, d)
        _damage(d / name, data)
        with pytest.raises(UserError) as e:
            read_everything(d)
        assert str(d / name) in str(e.value)


@FUZZ
@given(data=st.data())
def test_damaged_model_is_a_user_error_naming_it(model, data):
    with tempfile.TemporaryDirectory() as tmp:
        m = Path(tmp) / "fc.h5"
        shutil.copy(model, m)
        _damage(m, data)
        with pytest.raises(UserError) as e:
            load_fc(m, load_models=True)
        assert str(m) in str(e.value)


# -- CSV files and their schema -------------------------------------------------------------------
SCHEMA = {"columns": [{"name": "age", "type": "discrete"}, {"name": "score", "type": "real"},
                      {"name": "city", "type": "categorical"}, {"name": "label", "type": "categorical"}],
          "target": "label"}


def _rows(n: int) -> list[list[str]]:
    return [[str(20 + i), f"{i / 7:.4f}", "ab"[i % 2], "xy"[(i // 2) % 2]] for i in range(n)]


@FUZZ
@given(data=st.data())
def test_malformed_csv_or_schema_is_a_user_error_naming_it(tmp_path, data):
    rows = _rows(30)
    schema = json.loads(json.dumps(SCHEMA))
    defect = data.draw(st.sampled_from(["ragged", "not a number", "not finite", "fraction in discrete", "empty",
                                        "no data rows", "schema json", "schema type", "schema column"]),
                       label="defect")
    at = data.draw(st.integers(0, len(rows) - 1), label="row")
    schema_text = None
    if defect == "ragged":
        rows[at] = rows[at] + ["extra"] * data.draw(st.integers(1, 3)) if data.draw(st.booleans()) else rows[at][:-1]
    elif defect == "not a number":
        rows[at][data.draw(st.sampled_from([0, 1]))] = data.draw(st.sampled_from(["x", "1,2", "--", "0x1g", "1e"]))
    elif defect == "not finite":
        rows[at][1] = data.draw(st.sampled_from(["inf", "-inf", "Infinity"]))
    elif defect == "fraction in discrete":
        rows[at][0] = data.draw(st.sampled_from(["2.5", "0.1", "-7.25"]))
    elif defect == "schema json":
        text = json.dumps(schema)
        schema_text = text[: data.draw(st.integers(0, len(text) - 2))]
    elif defect == "schema type":
        schema["columns"][data.draw(st.integers(0, 3))]["type"] = data.draw(st.sampled_from(["float", "", 3, None]))
    elif defect == "schema column":
        schema["columns"][data.draw(st.integers(0, 3))]["name"] = "nonexistent"
    csv_path = tmp_path / f"d{data.draw(st.integers(0, 10 ** 6))}.csv"
    if defect == "empty":
        body = ""
    else:
        body = "age,score,city,label\n" + ("" if defect == "no data rows" else
                                           "".join(",".join(r) + "\n" for r in rows))
    csv_path.write_text(body)
    csv_path.with_name(csv_path.stem + ".schema.json").write_text(
        schema_text if schema_text is not None else json.dumps(schema))
    with pytest.raises(UserError) as e:
        load_user_table("csv", csv_path)
    assert str(csv_path.with_suffix("")) in str(e.value)  # the data file or its schema


def test_data_prep_of_a_bad_csv_leaves_no_output(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("age,score,city,label\n" + "".join(",".join(r) + "\n" for r in _rows(30)) + "1,2\n")
    (tmp_path / "d.schema.json").write_text(json.dumps(SCHEMA))
    assert prep_main(["--dataset", "csv", "--path", str(data), "--clients", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{data} line 32: expected 4 fields, got 2" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "d.schema.json"]


# -- TOML config files ----------------------------------------------------------------------------
BASE_TOML = 'deadline = 120.0\nseed = 3\n\n[train]\nlearner = "factorized"\nclusters = 2\njson = true\n'


@FUZZ
@given(data=st.data())
def test_mutated_config_is_a_user_error_naming_it(tmp_path, data):
    how = data.draw(st.sampled_from(["retype", "unknown key", "unknown section", "syntax", "duplicate"]), label="how")
    text = BASE_TOML
    if how == "retype":
        key, new = data.draw(st.sampled_from([
            ("deadline = 120.0", 'deadline = "soon"'), ("deadline = 120.0", "deadline = [1, 2]"),
            ("seed = 3", "seed = 2.5"), ("seed = 3", 'seed = "3"'), ("seed = 3", "seed = true"),
            ('learner = "factorized"', "learner = 7"), ('learner = "factorized"', 'learner = "nope"'),
            ("clusters = 2", "clusters = {a = 1}"), ("json = true", 'json = "yes"')]), label="retype")
        text = text.replace(key, new)
    elif how == "unknown key":
        text += data.draw(st.sampled_from(["epochz = 3\n", "[evaluate]\nsed = 1\n"]))
    elif how == "unknown section":
        text += data.draw(st.sampled_from(["[trian]\nseed = 1\n", "[[train]]\nseed = 1\n", "[train.sub]\nx = 1\n"]))
    elif how == "syntax":
        text = text.replace(data.draw(st.sampled_from(['"factorized"', "[train]", "= 3", "120.0"])),
                            data.draw(st.sampled_from(['"factorized', "[train", "== 3", "120.0.0"])), 1)
    else:  # a key or a table given twice
        text += data.draw(st.sampled_from(["[train]\nclusters = 3\n", "clusters = 3\n"]))
    cfg = tmp_path / f"c{data.draw(st.integers(0, 10 ** 6))}.toml"
    cfg.write_text(text)
    with pytest.raises(UserError) as e:
        parse_args(["train", "--config", str(cfg), "DIR", "--model", "m.h5"])
    assert str(cfg) in str(e.value)


# -- the same errors through the real commands ----------------------------------------------------
@pytest.mark.mpi
def test_real_commands_report_malformed_inputs_in_one_line(shards, model, tmp_path):
    d = tmp_path / "bc"
    shutil.copytree(shards, d)
    blob = bytearray((d / "client-1.h5").read_bytes())
    blob[len(blob) // 2] ^= 0x10
    (d / "client-1.h5").write_bytes(bytes(blob))
    cases = [
        (3, ["-m", "mpifc", "train", str(d), "--learner", "factorized", "--model", str(tmp_path / "m1.h5")],
         "client-1.h5: checksum mismatch", tmp_path / "m1.h5"),
    ]
    m = tmp_path / "cut.h5"
    m.write_bytes(model.read_bytes()[:1000])
    cases.append((1, ["-m", "mpifc", "evaluate", str(shards), "--model", str(m), "--json"], f"model file {m}: ",
                  None))
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[train]\nclusters = \"two\"\n")
    cases.append((3, ["-m", "mpifc", "train", str(shards), "--config", str(cfg), "--model", str(tmp_path / "m2.h5")],
                  f"config file {cfg}: key [train].clusters: expected an integer", tmp_path / "m2.h5"))
    for n, args, needle, output in cases:
        r = run_mpi(n, args, timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mpifc:")]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert output is None or not output.exists()
    np.testing.assert_equal(sorted(p.name for p in tmp_path.iterdir()), ["bad.toml", "bc", "cut.h5"])
