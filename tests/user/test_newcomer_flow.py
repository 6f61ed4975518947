"""The newcomer's flow, end to end: own CSV -> data_prep -> train with defaults -> mpifc query,
every question, in one process and distributed; answers in the user's units and labels."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from tests.user.conftest import CITIES, COLUMNS, QUERY_ARGS, QUESTIONS, cli, make_table, write_csv

def read(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.mpi
@pytest.mark.parametrize("what", QUESTIONS)
def test_one_process_and_distributed_answers_agree(answers, what):
    assert f"query {what}: 40 rows" in answers[what]["stdout"]
    a, b = read(answers[what]["one"]), read(answers[what]["dist"])
    assert len(a) == len(b) == (120 if what == "sample" else 40)
    assert list(a[0]) == list(b[0])
    for ra, rb in zip(a, b):
        for k in ra:
            if what in ("ll", "marginal", "predict") and k not in ("row", "outcome"):
                assert float(ra[k]) == pytest.approx(float(rb[k]), rel=0, abs=1e-9), k
            else:
                assert ra[k] == rb[k], k  # MPE and samples identically, labels exactly
    # the ledger counts the distributed pass: the querier's evidence went out, answers came back
    kinds = {row["kind"] for row in read(answers[what]["ledger"])}
    assert "fc.query.evidence" in kinds and ("fc.query.values" in kinds or "fc.query.answer" in kinds)


@pytest.mark.mpi
@pytest.mark.parametrize("what", QUESTIONS)
def test_answers_do_not_depend_on_how_the_rows_are_chunked(newcomer, tmp_path, monkeypatch, capsys, what):
    """A query read, answered and written 7 rows at a time (``sample``: whole passes of
    ``--batch 6``) writes the same file as one chunk; the summary gives the time and rows/s."""
    import mpifc.cli.query as query
    from mpifc.cli import main

    files = []
    for chunk in (query.CHUNK_ROWS, 7):
        monkeypatch.setattr(query, "CHUNK_ROWS", chunk)
        out = tmp_path / f"chunk-{chunk}.csv"
        assert main(["query", str(newcomer["model"]), "--data", str(newcomer["queries"]), "--what", what,
                     "--out", str(out), "--batch", "6", *QUERY_ARGS.get(what, [])]) == 0
        files.append(out.read_text())
    assert files[0] == files[1] and len(files[0].splitlines()) == 1 + (120 if what == "sample" else 40)
    assert " rows/s" in capsys.readouterr().out


@pytest.mark.mpi
def test_answers_are_in_the_users_units_and_labels(newcomer, one_process_answers):
    rows = read(newcomer["queries"])
    pred = read(one_process_answers["predict"]["one"])
    assert list(pred[0]) == ["row", "outcome", "p_no", "p_yes"]
    for p in pred:
        assert p["outcome"] in ("yes", "no")  # labels, not codes
        assert float(p["p_no"]) + float(p["p_yes"]) == pytest.approx(1.0, abs=1e-12)
    mpe = read(one_process_answers["mpe"]["one"])
    assert [m["row"] for m in mpe] == [str(i) for i in range(1, 41)]
    for given, done in zip(rows, mpe):
        assert done["city"] in CITIES and done["outcome"] in ("yes", "no")
        assert float(done["visits"]).is_integer()  # a discrete column comes back as a whole number
        for k in COLUMNS:
            assert done[k] != ""  # every empty cell is completed
            if given[k] == "":
                continue
            if k in ("city", "outcome"):
                assert done[k] == given[k]  # observed labels come back exactly
            else:
                assert float(done[k]) == pytest.approx(float(given[k]), rel=0, abs=1e-9)  # and numbers to 1e-9


@pytest.mark.mpi
def test_inverting_the_preprocessing_gives_the_input_back(newcomer, tmp_path):
    """Complete rows through encode and decode: reals to 1e-9, labels exactly, as strings; a
    count fewer than 5 training rows held is no level (the k-rows rule) and comes back as the
    level it is read as, its nearest."""
    import mpifc
    from data_prep.transforms import to_levels

    complete = [r for r in make_table(80, 7) if all(r[k] != "" for k in COLUMNS)]
    data = write_csv(tmp_path / "complete.csv", complete)
    fc = mpifc.load(newcomer["model"])
    from mpifc.cli.query import read_rows

    back = fc.decode(fc.encode(read_rows(str(data))))
    pre = fc.codec.preprocessor
    levels = pre.columns[pre.features.index("visits")].levels
    assert levels is not None
    for i, r in enumerate(complete):
        for k in ("age", "income"):
            assert back[k][i] == pytest.approx(float(r[k]), rel=0, abs=1e-9)
        v = float(r["visits"])
        assert back["visits"][i] == levels[int(to_levels(np.array([v]), levels)[0])]
        assert back["city"][i] == r["city"] and isinstance(back["city"][i], str)
        assert back["outcome"][i] == r["outcome"] and isinstance(back["outcome"][i], str)


BAD_ROWS = [
    ("age,height\n40,1.8\n", "unknown column 'height'"),
    ("age,city\nforty,Paris\n", "row 1, column 'age': 'forty' is not a number"),
    ("age,city\n40,Berlin\n", "row 1, column 'city': category 'Berlin' was never seen in training"),
    ("age,city\n40\n", "line 2: 1 fields, the header has 2"),
    ("", "empty file"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("content, needle", BAD_ROWS)
def test_bad_rows_are_one_line_exit_2_and_no_answer(newcomer, tmp_path, capsys, content, needle):
    from mpifc.cli import main

    data = tmp_path / "bad.csv"
    data.write_text(content)
    out = tmp_path / "ans.csv"
    with pytest.raises(SystemExit) as e:
        main(["query", str(newcomer["model"]), "--data", str(data), "--what", "ll", "--out", str(out)])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(data) in lines[0], lines
    assert not out.exists()


@pytest.mark.mpi
def test_the_command_refuses_a_bad_row_with_one_line_and_exit_2(newcomer, tmp_path):
    data = tmp_path / "bad.csv"
    data.write_text(BAD_ROWS[2][0])
    out = tmp_path / "ans.csv"
    r = cli("mpifc", "query", str(newcomer["model"]), "--data", str(data), "--what", "predict", "--out", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"mpifc: UserError: {data}: {BAD_ROWS[2][1]} (known: Oslo, Paris, Rome)"]
    assert not out.exists()


@pytest.mark.mpi
def test_a_file_that_is_not_a_model_is_refused(newcomer, tmp_path):
    out = tmp_path / "ans.csv"
    r = cli("mpifc", "query", str(newcomer["queries"]), "--data", str(newcomer["queries"]), "--what", "ll",
            "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(newcomer["queries"]) in r.stderr
    assert not out.exists()


@pytest.mark.mpi
def test_left_out_columns_and_empty_cells_are_marginalised(newcomer, tmp_path):
    import mpifc

    fc = mpifc.load(newcomer["model"])
    from mpifc.cli import main

    only_age = write_csv(tmp_path / "age.csv", [{"age": "41.5"}, {"age": ""}], columns=("age",))
    out = tmp_path / "ll.csv"
    assert main(["query", str(newcomer["model"]), "--data", str(only_age), "--what", "ll", "--out", str(out),
                 "--quiet"]) == 0
    ll = [float(r["log_likelihood"]) for r in read(out)]
    full = np.full((1, len(fc.features)), np.nan)
    full[0, fc.features.index("age")] = fc.encode({"age": ["41.5"]})[0, fc.features.index("age")]
    assert ll[0] == pytest.approx(float(fc.log_likelihood(full)[0]), abs=1e-12)
    assert ll[1] == pytest.approx(0.0, abs=1e-12)  # nothing observed: log 1
    assert all(math.isfinite(v) for v in ll)
