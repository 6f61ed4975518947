"""Outputs never destroy inputs or each other, and bad values are refused before any work.

Each case a user met (an output path on an input, two outputs on one path, data_prep into a
folder holding other files, unwritable outputs, infinite values in a shard or a query row, a
discrete column holding 2.7, values that silently meant something else) is run with the real
command on real files: exit code 2, one line naming the path or field, no traceback, and every
input byte for byte as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from data_prep.shards import sha256_file
from mpifc.atomic import write_problem
from mpifc.cli.prep import main as prep_main
from mpifc.federated.learners import learner_names
from tests.mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def prep(out: Path, *extra: str) -> int:
    return prep_main(["--dataset", "breast-cancer", "--setting", "horizontal", "--clients", "2", "--seed", "0",
                      "--out", str(out), *extra])


def digests(*paths: Path) -> dict[str, str]:
    """SHA-256 of every file under ``paths`` (files or folders)."""
    out = {}
    for p in paths:
        for f in ([p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())):
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("io") / "bc"
    assert prep(d) == 0
    return d


@pytest.fixture(scope="module")
def model(shards, tmp_path_factory) -> Path:
    m = tmp_path_factory.mktemp("io-model") / "fc.h5"
    r = train(shards, "--model", str(m))
    assert r.returncode == 0, r.stderr
    return m


def train(shards: Path, *args: str):
    return run_mpi(3, ["-m", "mpifc", "train", str(shards), "--learner", "factorized", "--seed", "0", *args],
                   timeout=120)


def evaluate(shards: Path, model: Path, *args: str, n: int = 3):
    return run_mpi(n, ["-m", "mpifc", "evaluate", str(shards), "--model", str(model), *args], timeout=120)


def one_line(r, *needles: str) -> None:
    """Exit code 2, no traceback, exactly one ``mpifc:`` line, containing every needle."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mpifc:")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    if write_problem(Path("/sys") / "x") is None:
        pytest.skip("running as root with no read-only folder to use")
    return Path("/sys")


# -- files destroyed silently -----------------------------------------------------------------
def test_model_on_a_shard_is_refused_and_the_shard_kept(shards, tmp_path):
    before = digests(shards)
    r = train(shards, "--model", str(shards / "client-0.h5"))
    one_line(r, "--model", "client-0.h5", "is an input of this job")
    assert digests(shards) == before
    r = train(shards, "--model", str(tmp_path / "ok.h5"))  # the shards still train: checksums intact
    assert r.returncode == 0, r.stderr


def test_model_and_ledger_on_one_path_are_refused(shards, tmp_path):
    before = digests(shards)
    same = tmp_path / "x.h5"
    r = train(shards, "--model", str(same), "--ledger", str(same))
    one_line(r, "--model", "--ledger", "the same file")
    assert not same.exists() and digests(shards) == before


def test_evaluate_outputs_must_not_overwrite_the_model(shards, model):
    before = digests(shards, model)
    r = evaluate(shards, model, "--output-npz", str(model))
    one_line(r, "--output-npz", "is an input of this job (the model")
    assert digests(shards, model) == before


def test_data_prep_keeps_a_folder_with_other_files(tmp_path, capsys):
    out = tmp_path / "bc"
    assert prep(out) == 0
    (out / "notes.txt").write_text("a user's notes")
    before = digests(out)
    assert prep(out, "--clients", "3") == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "refusing to overwrite" in err and err.count("\n") == 1
    assert digests(out) == before
    (out / "notes.txt").unlink()
    assert prep(out, "--clients", "3") == 0  # a shard set alone is replaced, as a whole
    assert sorted(p.name for p in out.iterdir()) == ["client-0.h5", "client-1.h5", "client-2.h5",
                                                     "manifest.json", "test.h5"]


# -- unwritable outputs ------------------------------------------------------------------------
def test_data_prep_out_that_cannot_be_written(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file" / "bc", read_only_folder(tmp_path) / "bc"):
        assert prep(out) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"data_prep: error: --out {out}: cannot be written") and err.count("\n") == 1, err
        assert not out.exists()


@pytest.mark.parametrize("flag", ["--model", "--ledger"])
def test_train_outputs_that_cannot_be_written_fail_before_any_work(shards, tmp_path, flag):
    (tmp_path / "file").write_text("x")
    before = digests(shards)
    paths = {"--model": tmp_path / "m.h5", "--ledger": tmp_path / "l.csv"}
    paths[flag] = tmp_path / "file" / "out"
    r = train(shards, "--model", str(paths["--model"]), "--ledger", str(paths["--ledger"]))
    one_line(r, flag, "cannot be written", "is a file, not a folder")
    assert not paths["--model"].exists() and not paths["--ledger"].exists()  # no model without its ledger
    assert digests(shards) == before
    ro = read_only_folder(tmp_path)
    r = train(shards, "--model", str(ro / "m.h5"))
    one_line(r, "--model", "cannot be written")


@pytest.mark.parametrize("flag", ["--out", "--output-npz", "--ledger"])
def test_evaluate_outputs_that_cannot_be_written(shards, model, tmp_path, flag):
    (tmp_path / "file").write_text("x")
    before = digests(shards, model)
    extra = ["--query", "mpe"] if flag == "--out" else []
    r = evaluate(shards, model, "--distributed", flag, str(tmp_path / "file" / "o"), *extra)
    one_line(r, flag, "cannot be written")
    assert digests(shards, model) == before


# -- non-finite data ----------------------------------------------------------------------------
def _with_value(shards: Path, tmp_path: Path, file: str, dataset: str, row: int, col: int, value: float) -> Path:
    """A copy of the shard folder with one value replaced (manifest checksum updated, as a user
    who edits a shard on purpose would)."""
    import shutil

    d = tmp_path / "edited"
    shutil.copytree(shards, d)
    with h5py.File(d / file, "r+") as f:
        f[dataset][row, col] = value
    m = json.loads((d / "manifest.json").read_text())
    entry = m["test"] if file == "test.h5" else next(c for c in m["clients"] if c["file"] == file)
    entry["sha256"] = sha256_file(d / file)
    (d / "manifest.json").write_text(json.dumps(m))
    return d


@pytest.mark.parametrize("learner", learner_names())
def test_an_infinite_training_value_is_refused_by_every_learner(shards, tmp_path, learner):
    d = _with_value(shards, tmp_path, "client-1.h5", "train/x", 5, 3, np.inf)
    feature = json.loads((d / "manifest.json").read_text())["clients"][1]["features"][3]
    before = digests(d)
    r = run_mpi(3, ["-m", "mpifc", "train", str(d), "--learner", learner, "--model", str(tmp_path / "m.h5")],
                timeout=120)
    one_line(r, "client-1.h5", "'train/x'", f"column {feature!r}", "row 5", "not finite")
    assert not (tmp_path / "m.h5").exists() and digests(d) == before


@pytest.mark.parametrize("distributed", [True, False])
def test_an_infinite_query_value_is_refused(shards, model, tmp_path, distributed):
    d = _with_value(shards, tmp_path, "test.h5", "x", 7, 2, -np.inf)
    feature = json.loads((d / "manifest.json").read_text())["feature_order"][2]
    before = digests(d, model)
    r = evaluate(d, model, *(["--distributed"] if distributed else []), "--json", n=3 if distributed else 1)
    one_line(r, "test.h5", "'x'", f"column {feature!r}", "row 7", "not finite")
    assert digests(d, model) == before


def test_a_model_holding_nan_is_refused_naming_the_parameter(shards, model, tmp_path):
    """A model whose parameters hold NaN (e.g. one trained before infinite values were refused)
    is refused on load, in one line naming the file and the parameter."""
    from mpifc.federated.serialize import seal

    bad = tmp_path / "nan.h5"
    bad.write_bytes(model.read_bytes())
    with h5py.File(bad, "r+") as f:
        leaves = f["fc/leaves"]
        mean = leaves[sorted(leaves)[0]]["model/mean"]
        mean[0] = np.nan
    seal(bad)  # a consistent file: only its content is bad
    r = evaluate(shards, bad, "--json", n=1)
    one_line(r, str(bad), "'mean'[0] = nan: a mean must be finite")


# -- values that were silently accepted ---------------------------------------------------------
def test_em_iters_and_client_learner_indices_are_checked(shards, tmp_path):
    r = train(shards, "--model", str(tmp_path / "m.h5"), "--refine", "em", "--em-iters", "-1")
    one_line(r, "--em-iters must be >= 1, got -1")
    r = train(shards, "--model", str(tmp_path / "m.h5"), "--client-learner", "7=dt")
    one_line(r, "--client-learner 7=dt: there is no client 7", "clients 0..1")
    assert not (tmp_path / "m.h5").exists()


def test_a_discrete_csv_column_holding_a_fraction_is_refused(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("age,score,label\n30,1.5,a\n41,2.5,b\n2.7,0.5,a\n" + "".join(
        f"{20 + i},{i / 3:.3f},{'ab'[i % 2]}\n" for i in range(40)))
    (tmp_path / "d.schema.json").write_text(json.dumps({"columns": [
        {"name": "age", "type": "discrete"}, {"name": "score", "type": "real"},
        {"name": "label", "type": "categorical"}], "target": "label"}))
    before = digests(data)
    code = prep_main(["--dataset", "csv", "--path", str(data), "--clients", "2", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{data} line 4, field 'age': '2.7' is not an integer" in err
    assert not (tmp_path / "o").exists() and digests(data) == before

