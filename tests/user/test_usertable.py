"""A user's own table from CSV to answers with no schema file and no flag beyond ``--target``:
column types inferred, a 4-class target with missing cells, text and numbers, in every setting,
through ``data_prep``, ``mpiexec ... mpifc train``, ``mpifc evaluate`` and ``mpifc query``."""
from __future__ import annotations

import csv
from collections import Counter
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.mpi_util import run_mpi

GRADES = ("A", "B", "C", "D")
DEPTS = ("north", "south", "east", "west")
SETTINGS = {"central": 1, "horizontal": 2, "vertical": 2, "hybrid": 2}


def grades_table(n: int, seed: int) -> list[dict[str, str]]:
    """Rows as a user's CSV holds them: an id, a row number, a real, a count, a year, a text column
    with empty cells, and a 4-class grade that depends on them."""
    rng = np.random.default_rng(seed)
    grade = rng.integers(0, 4, n)
    score = rng.normal(50 + 12 * grade, 6, n)
    visits = np.clip(rng.poisson(1 + grade), 0, 9)
    year = 2007 + (grade + rng.integers(0, 2, n)) % 3
    dept = (grade + (rng.random(n) < 0.25)) % 4
    rows = []
    for i in range(n):
        rows.append({"id": f"u{i:05d}", "row": str(i + 1), "score": f"{score[i]:.2f}", "visits": str(visits[i]),
                     "year": str(year[i]), "dept": "" if rng.random() < 0.06 else DEPTS[dept[i]],
                     "grade": GRADES[grade[i]]})
    return rows


def write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def prep(argv: list[str], capsys) -> tuple[int, str, str]:
    from mpifc.cli.prep import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- inference -----------------------------------------------------------------------------------
def test_column_types_are_inferred_printed_and_written(tmp_path, capsys):
    data = write(tmp_path / "grades.csv", grades_table(200, 0))
    code, out, err = prep(["--dataset", "csv", "--path", str(data), "--target", "grade", "--setting", "central",
                           "--clients", "1", "--out", str(tmp_path / "s")], capsys)
    assert code == 0, err
    types = {name: line.split()[1] for line in out.splitlines()
             for name in ("id", "row", "score", "visits", "year", "dept", "grade") if line.split()[:1] == [name]}
    assert types == {"id": "skip", "row": "skip", "score": "real", "visits": "discrete", "year": "discrete",
                     "dept": "categorical", "grade": "categorical"}, out
    assert "an id: text unique per row" in out and "a row id" in out and "the target, 4 classes" in out
    schema = json.loads((tmp_path / "s" / "schema.json").read_text())
    assert schema["target"] == "grade" and [c["type"] for c in schema["columns"]][:2] == ["skip", "skip"]
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["schema"] == "schema.json" and m["classes"] == list(GRADES)
    assert m["features"]["dept"]["raw_meta_type"] == "categorical" and "id" not in m["features"]
    assert "categorical columns (1): one code per label (the target has 4 classes)" in out


def test_an_edited_schema_passes_back_and_one_beside_the_csv_wins(tmp_path, capsys):
    data = write(tmp_path / "grades.csv", grades_table(120, 1))
    base = ["--dataset", "csv", "--path", str(data), "--setting", "central", "--clients", "1"]
    assert prep([*base, "--target", "grade", "--out", str(tmp_path / "a")], capsys)[0] == 0
    schema = json.loads((tmp_path / "a" / "schema.json").read_text())
    for c in schema["columns"]:
        if c["name"] == "visits":
            c["type"] = "real"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(schema))
    assert prep([*base, "--schema", str(edited), "--out", str(tmp_path / "b")], capsys)[0] == 0
    feats = json.loads((tmp_path / "b" / "manifest.json").read_text())["features"]
    assert feats["visits"]["raw_meta_type"] == "real"
    (tmp_path / "grades.schema.json").write_text(json.dumps(schema))
    code, out, _ = prep([*base, "--out", str(tmp_path / "c")], capsys)
    assert code == 0 and f"schema: {tmp_path / 'grades.schema.json'}" in out
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["features"]["visits"]["raw_meta_type"] == "real"


@pytest.mark.parametrize("rows, args, needle", [
    ([{"a": "1", "y": "x"}] * 5, ["--target", "z"], "--target 'z': not a column of"),
    ([{"a": str(i), "y": "x"} for i in range(5)], ["--target", "y"], "holds 1 distinct value(s)"),
    ([{"a": str(i % 3), "y": str(i)} for i in range(1200)], ["--target", "y"], "1,200 distinct values"),
], ids=["unknown target", "one class", "too many classes"])
def test_a_target_that_cannot_be_predicted_is_one_line_and_exit_2(tmp_path, capsys, rows, args, needle):
    data = write(tmp_path / "t.csv", rows)
    code, out, err = prep(["--dataset", "csv", "--path", str(data), *args, "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "s").exists()


def test_a_target_that_disagrees_with_the_schema_beside_the_csv_is_refused(tmp_path, capsys):
    data = write(tmp_path / "g.csv", grades_table(50, 2))
    (tmp_path / "g.schema.json").write_text(json.dumps(
        {"columns": [{"name": k, "type": "categorical"} for k in grades_table(1, 0)[0]], "target": "dept"}))
    code, _, err = prep(["--dataset", "csv", "--path", str(data), "--target", "grade", "--out", str(tmp_path / "s")],
                        capsys)
    assert code == 2 and "names the target 'dept'" in err


# -- every setting, real jobs ----------------------------------------------------------------------
MPI_SETTINGS = ("horizontal", "vertical")
"""Trained by the real ``mpiexec`` job here; the other two by :func:`mpifc.simulate`, which gives the
same model (``tests/user/test_api.py``), to keep the suite short. ``launch/bench/usertables.py``
runs the real commands in all four settings on three public tables."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per setting: shards of a 4-class CSV prepared with ``--target`` alone, and a model trained
    with every default: ``mpiexec -n C+1 mpifc train DIR --model M --json`` (horizontal: one rank
    too many, to see the warning) or :func:`mpifc.simulate`.
    ``{setting: {"shards", "model", "summary", "stderr", "wall", "ask"}}``."""
    import mpifc
    from mpifc.cli.prep import main

    d = tmp_path_factory.mktemp("grades")
    data = write(d / "grades.csv", grades_table(320, 3))
    write(d / "ask.csv", grades_table(40, 4))
    out = {}
    for setting, clients in SETTINGS.items():
        shards = d / setting
        assert main(["--dataset", "csv", "--path", str(data), "--target", "grade", "--setting", setting,
                     "--out", str(shards)]) == 0
        model = d / f"{setting}.h5"
        out[setting] = {"shards": shards, "model": model, "ask": d / "ask.csv"}
        if setting not in MPI_SETTINGS:
            mpifc.simulate(shards, model=model)
            continue
        ranks = clients + 1 + (setting == "horizontal")
        t0 = time.perf_counter()
        r = run_mpi(ranks, ["-m", "mpifc", "train", str(shards), "--model", str(model), "--json"], timeout=300)
        wall = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr
        out[setting].update(summary=json.loads(r.stdout.strip().splitlines()[-1]), stderr=r.stderr, wall=wall)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_four_classes_train_evaluate_and_query_in_every_setting(trained, setting, capsys, tmp_path):
    from mpifc.cli import main

    t = trained[setting]
    assert main(["evaluate", str(t["shards"]), "--model", str(t["model"]), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "f1" not in ev and set(ev["f1_per_class"]) == set(GRADES)
    assert ev["accuracy"] >= 0.6 and ev["f1_macro"] >= 0.55, ev  # chance is 0.25
    ans = tmp_path / "answers.csv"
    assert main(["query", str(t["model"]), "--data", str(t["ask"]), "--what", "predict", "--out", str(ans),
                 "--json"]) == 0
    q = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with ans.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:2] == ["row", "grade"] and {r["grade"] for r in rows} <= set(GRADES)
    assert q["accuracy"] >= 0.6, q
    assert q["skipped_columns"] == ["id", "row"]  # the user's own rows, ids and all, are accepted


@pytest.mark.mpi
def test_train_reports_the_jobs_wall_time_and_warns_of_idle_ranks(trained):
    for setting in MPI_SETTINGS:
        t = trained[setting]
        s = t["summary"]
        # rank 0's clock, from its process's start to the end: within the command's own wall time
        assert 0 < s["job_wall_seconds"] <= t["wall"], (setting, s["job_wall_seconds"], t["wall"])
        assert t["wall"] - s["job_wall_seconds"] < max(5.0, 0.5 * t["wall"]), (setting, s["job_wall_seconds"], t["wall"])
        warned = "mpifc: warning: mpiexec started 4 ranks, but training 2 clients uses 3; rank 3 will idle"
        assert (warned in t["stderr"]) == (setting == "horizontal"), t["stderr"]


# -- strict queries, typed answers ---------------------------------------------------------------
def ask(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ask.csv"
    p.write_text(text)
    return p


@pytest.mark.mpi
@pytest.mark.parametrize("text, needle", [
    ("year,score\n2031,60\n", "row 1, column 'year': 2031 is not a value the model knows (its levels 2007, 2008, "
                              "2009); --clip reads it as the nearest, 2009"),
    ("year\n2008\n2007.5\n", "row 2, column 'year': 2007.5 is not a value the model knows"),
    ("visits\n-3\n", "row 1, column 'visits': -3 is not a value the model knows"),
    ("dept\nnowhere\n", "row 1, column 'dept': category 'nowhere' was never seen in training"),
], ids=["year out of range", "fractional year", "negative count", "unseen category"])
def test_a_value_the_model_does_not_know_is_one_line_and_exit_2(trained, tmp_path, capsys, text, needle):
    from mpifc.cli import main

    data, out = ask(tmp_path, text), tmp_path / "ans.csv"
    for what in ("ll", "mpe", "predict"):
        with pytest.raises(SystemExit) as e:
            main(["query", str(trained["central"]["model"]), "--data", str(data), "--what", what, "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and needle in err[0] and str(data) in err[0], err
        assert not out.exists()


@pytest.mark.mpi
def test_every_value_of_the_training_rows_is_one_the_model_knows(trained, tmp_path, capsys):
    """Values fewer than 5 training rows held are no level of their column (the k-rows rule);
    training read them as their nearest level, and a query may give them too."""
    from mpifc.cli import main

    t = trained["central"]
    train_csv = t["shards"].parent / "grades.csv"
    counts = Counter(r["visits"] for r in csv.DictReader(train_csv.open()))
    assert min(counts.values()) < 5  # the table holds rare counts: the case is real
    out = tmp_path / "ans.csv"
    assert main(["query", str(t["model"]), "--data", str(train_csv), "--what", "ll", "--out", str(out),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 320


@pytest.mark.mpi
def test_clip_reads_the_nearest_known_value_and_mpe_shows_the_value_used(trained, tmp_path, capsys):
    from mpifc.cli import main

    data, out = ask(tmp_path, "year,visits,score,dept\n2031,3,61.5,\n2007.4,,55,east\n"), tmp_path / "mpe.csv"
    assert main(["query", str(trained["central"]["model"]), "--data", str(data), "--what", "mpe", "--out", str(out),
                 "--clip"]) == 0
    assert "2 cells read as the nearest value the model knows (--clip)" in capsys.readouterr().out
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["year"] for r in rows] == ["2009", "2007"]  # the values used, not 2031 and 2007.4
    assert rows[0]["score"] == "61.5" and rows[1]["dept"] == "east"  # the user's own text elsewhere
    assert rows[1]["visits"].isdigit() and rows[0]["dept"] in DEPTS and rows[0]["grade"] in GRADES


@pytest.mark.mpi
def test_the_api_is_as_strict_and_keeps_discrete_answers_whole(trained):
    import mpifc
    from mpifc.errors import UserError

    fc = mpifc.load(trained["central"]["model"])
    with pytest.raises(UserError, match="2031 is not a value the model knows"):
        fc.mpe({"year": [2031]})
    done = fc.mpe({"year": [2008, None], "dept": ["east", None]})
    for row in done:
        year, visits, grade = (row[fc.features.index(k)] for k in ("year", "visits", "grade"))
        assert type(year) is int and type(visits) is int and year in (2007, 2008, 2009), row  # not 2008.0
        assert isinstance(grade, str) and grade in GRADES
    assert done[0][fc.features.index("year")] == 2008
    sampled = fc.sample(20, seed=1)
    assert all(type(v) is int for v in sampled[:, fc.features.index("visits")])
    assert mpifc.load(trained["central"]["model"], clip=True).mpe({"year": [2031]})[0][fc.features.index("year")] == 2009


def test_integer_class_labels_come_back_as_ints(tmp_path, capsys):
    import mpifc

    rows = [{**r, "grade": str(GRADES.index(r["grade"]) + 1)} for r in grades_table(160, 5)]
    data = write(tmp_path / "g.csv", rows)
    code, _, err = prep(["--dataset", "csv", "--path", str(data), "--target", "grade", "--setting", "central",
                         "--clients", "1", "--out", str(tmp_path / "s")], capsys)
    assert code == 0, err
    fc = mpifc.simulate(tmp_path / "s")
    assert fc.classes == [1, 2, 3, 4]
    pred = fc.predict({"score": [40.0, 90.0]})
    assert all(type(p) is int for p in pred)
