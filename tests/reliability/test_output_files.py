"""Output files: a failed write leaves nothing behind, an output replaces only an earlier output of
its own kind, and the files the data came from are never replaced; bad files are refused.

A user's folder (``examples/patients.csv``, its schema, rows to ask about, shards made from them
and a model trained on them) meets every output flag of every command. Full disks are met twice:
through the ``MPIFC_FAULT_DISK_FULL`` hook (everywhere) and on a real 64 KiB tmpfs (where the
test may mount one). Refusals come before any rank starts, so most cases run the console entry
point in this process; the jobs that fail mid-way run under ``mpiexec``. Every failure must be
exit code 2 with exactly one ``mpifc:`` line naming the flag or file, and no traceback.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifc.atomic import DISK_FULL_ENV
from mpifc.cli import main as mpifc_main
from mpifc.cli.prep import main as prep_main
from mpifc.errors import UserError
from mpifc.federated.serialize import load_fc, seal
from tests.mpi_util import REPO, run_mpi

pytestmark = pytest.mark.mpi

EXAMPLES = REPO / "examples"


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, hidden ones included (a left temp file shows)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(code: int, err: str, *needles: str) -> None:
    """Exit code 2, no traceback, exactly one ``mpifc:`` line, holding every needle."""
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(("mpifc:", "data_prep:"))]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def run_here(argv: list[str], capsys) -> tuple[int, str]:
    """The ``mpifc`` console entry point in this process: exit code and stderr."""
    try:
        code = mpifc_main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def gone_soon(*paths: Path, timeout: float = 60.0) -> bool:
    """True once none of ``paths`` exists (a killed rank's partial files are the node sentinel's
    to remove, just after the job ends)."""
    until = time.monotonic() + timeout
    while any(p.exists() for p in paths):
        if time.monotonic() > until:
            return False
        time.sleep(0.1)
    return True


PATIENTS_SCHEMA = {
    "columns": [{"name": "id", "type": "skip"}, {"name": "age", "type": "discrete"},
                {"name": "city", "type": "categorical"}, {"name": "bmi", "type": "real"},
                {"name": "pressure", "type": "real"}, {"name": "visits", "type": "discrete"},
                {"name": "readmitted", "type": "categorical"}],
    "target": "readmitted", "header": True, "delimiter": ",", "missing": ["", "?", "NA"]}


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    """A user's folder: the example CSV, its schema, rows to ask about, shards made from the CSV
    (``pat``), a model trained on them (``m.h5``) with its ledger (``l.csv``), and notes."""
    d = tmp_path_factory.mktemp("user")
    for name in ("patients.csv", "patients-ask.csv"):
        shutil.copy(EXAMPLES / name, d / name)
    # a schema the user wrote beside the CSV (it wins over the inferred types)
    (d / "patients.schema.json").write_text(json.dumps(PATIENTS_SCHEMA, indent=1))
    (d / "notes.txt").write_text("a user's notes\n")
    assert prep_main(["--dataset", "csv", "--path", str(d / "patients.csv"), "--setting", "vertical",
                      "--clients", "2", "--out", str(d / "pat")]) == 0
    r = run_mpi(3, ["-m", "mpifc", "train", str(d / "pat"), "--model", str(d / "m.h5"), "--ledger",
                    str(d / "l.csv"), "--refine", "none", "--quiet"], timeout=120)
    assert r.returncode == 0, r.stderr
    return d


# -- every output flag at every kind of input --------------------------------------------------
# (command, the flag, its kind of target: "file" or "folder"); {pat}, {m}, {ask}, {new} are the
# user's shards, model, rows and a fresh folder, {X} the target.
OUTPUT_FLAGS = [
    ("train {pat} --model {X}", "--model", "file"),
    ("train {pat} --model {new}/m.h5 --ledger {X}", "--ledger", "file"),
    ("train {pat} --model {new}/m.h5 --refine em --em-initial-model {X}", "--em-initial-model", "file"),
    ("train {pat} --model {new}/m.h5 --audit {X}", "--audit", "folder"),
    ("train {pat} --model-family ngm --model {X}", "--model", "file"),
    ("train {pat} --model-family ngm --model {new}/m.h5 --save-local {X}", "--save-local", "folder"),
    ("evaluate {pat} --model {m} --ledger {X}", "--ledger", "file"),
    ("evaluate {pat} --model {m} --output-npz {X}", "--output-npz", "file"),
    ("evaluate {pat} --model {m} --query mpe --out {X}", "--out", "file"),
    ("evaluate {pat} --model {m} --audit {X}", "--audit", "folder"),
    ("query {m} --data {ask} --what ll --out {X}", "--out", "file"),
    ("query {m} --data {ask} --what ll --out {new}/a.csv --distributed --ledger {X}", "--ledger", "file"),
    ("baseline fedavg {pat} --save-params {X}", "--save-params", "file"),
    ("baseline splitnn {pat} --ledger {X}", "--ledger", "file"),
    ("baseline splitnn {pat} --save-params {X}", "--save-params", "folder"),
    ("baseline decentralized dl {pat} --out {X}", "--out", "folder"),
    ("experiment table3 --quick --out {X}", "--out", "folder"),
]

# The user's files, and which of them a command must never replace: the shard set and the files
# it was made from (every command that reads the shards or a model trained on them), the model
# and the rows asked about (the commands that read them).
SOURCES = ["patients.csv", "patients.schema.json", "pat/client-0.h5", "pat/manifest.json", "pat/test.h5"]
TARGETS = SOURCES + ["m.h5", "patients-ask.csv", "notes.txt", "l.csv"]


def _argv(template: str, user: Path, target: Path, new: Path) -> list[str]:
    return template.format(pat=user / "pat", m=user / "m.h5", ask=user / "patients-ask.csv", new=new,
                           X=target).split()


def _expected(template: str, flag: str, kind: str, name: str) -> str | None:
    """What the refusal says about ``name`` (None: the output may replace it)."""
    command = template.split()[0]
    if name in SOURCES and command != "experiment":  # every other command reads the shards
        return "refusing to overwrite it, even with --overwrite"
    if (name == "m.h5" and command in ("evaluate", "query")) or (name == "patients-ask.csv" and command == "query"):
        return "is an input of this job"
    if kind == "folder":
        return "is a file, not a folder"
    same_kind = {"m.h5": ("--model", "--em-initial-model"), "l.csv": ("--ledger",)}
    if flag in same_kind.get(name, ()):
        return None
    return "exists and is not"


@pytest.mark.parametrize("template,flag,kind", OUTPUT_FLAGS,
                         ids=[" ".join(w for w in t.split() if not w.startswith("{"))[:60] for t, _, _ in OUTPUT_FLAGS])
def test_every_output_flag_at_every_input_file_is_refused_in_one_line(user, tmp_path, capsys, template, flag, kind):
    before = digests(user)
    for name in TARGETS:
        want = _expected(template, flag, kind, name)
        if want is None:
            continue
        # --overwrite lets an output replace a file of another kind (tested below), nothing else
        extra = [] if want == "exists and is not" else ["--overwrite"]
        code, err = run_here(_argv(template, user, user / name, tmp_path / "new") + extra, capsys)
        one_line(code, err, flag, name, want)
    assert digests(user) == before
    assert not (tmp_path / "new").exists()


def test_data_prep_out_at_every_input_file_and_at_the_folder_holding_them(user, capsys):
    before = digests(user)
    prep = ["--dataset", "csv", "--path", str(user / "patients.csv"), "--out"]
    for name in TARGETS:
        code = prep_main(prep + [str(user / name), "--overwrite"])
        one_line(code, capsys.readouterr().err, "--out", name, "is a file, not a folder")
    for extra in ([], ["--overwrite"]):  # the folder holding the CSV: its files are never replaced
        code = prep_main(prep + [str(user)] + extra)
        one_line(code, capsys.readouterr().err, f"--out {user}", "patients.csv", "even with --overwrite")
    assert digests(user) == before


def test_the_users_csv_as_a_model_is_refused_under_mpiexec(user, tmp_path):
    """``mpiexec -n 3 mpifc train DIR --model patients.csv`` once replaced the user's CSV."""
    before = digests(user)
    r = run_mpi(3, ["-m", "mpifc", "train", str(user / "pat"), "--model", str(user / "patients.csv"), "--overwrite"],
                timeout=60)
    one_line(r.returncode, r.stderr, "--model", "patients.csv", "source", "even with --overwrite")
    assert digests(user) == before


def test_the_schema_as_an_answer_file_and_a_ledger_inside_the_audit_are_refused(user, tmp_path, capsys):
    before = digests(user)
    code, err = run_here(["query", str(user / "m.h5"), "--data", str(user / "patients-ask.csv"), "--what", "predict",
                          "--out", str(user / "patients.schema.json"), "--overwrite"], capsys)
    one_line(code, err, "--out", "patients.schema.json", "source", "even with --overwrite")
    aud = tmp_path / "aud"
    code, err = run_here(["train", str(user / "pat"), "--model", str(tmp_path / "m.h5"), "--ledger",
                          str(aud / "audit-summary.json"), "--audit", str(aud)], capsys)
    one_line(code, err, "--ledger", "audit-summary.json", "--audit")
    aud.mkdir()
    (aud / "audit-summary.json").write_text("a user's own summary\n")
    code, err = run_here(["train", str(user / "pat"), "--model", str(tmp_path / "m.h5"), "--audit", str(aud)], capsys)
    one_line(code, err, "--audit", "audit-summary.json", "exists and is not an audit file")
    assert (aud / "audit-summary.json").read_text() == "a user's own summary\n"
    assert digests(user) == before and sorted(p.name for p in tmp_path.iterdir()) == ["aud"]


def test_experiment_out_at_a_file_or_a_folder_of_other_files(tmp_path, capsys):
    (tmp_path / "results.txt").write_text("x")
    code, err = run_here(["experiment", "table3", "--quick", "--out", str(tmp_path / "results.txt")], capsys)
    one_line(code, err, "--out", "results.txt", "is a file, not a folder")
    code, err = run_here(["experiment", "table3", "--quick", "--out", str(tmp_path)], capsys)
    one_line(code, err, "--out", "not experiment results", "--overwrite")
    assert [p.name for p in tmp_path.iterdir()] == ["results.txt"]


def test_an_answer_replaces_an_earlier_answer_and_overwrite_replaces_a_users_file(user, tmp_path, capsys):
    ask = ["query", str(user / "m.h5"), "--data", str(user / "patients-ask.csv"), "--quiet"]
    out = tmp_path / "answers.csv"
    assert run_here(ask + ["--what", "ll", "--out", str(out)], capsys)[0] == 0
    assert run_here(ask + ["--what", "predict", "--out", str(out)], capsys)[0] == 0  # an answer: replaced
    assert out.read_text().startswith("row,readmitted,")
    out.write_text("a,users,table\n1,2,3\n")
    code, err = run_here(ask + ["--what", "ll", "--out", str(out)], capsys)
    one_line(code, err, "--out", "exists and is not an answer file", "--overwrite")
    assert run_here(ask + ["--what", "ll", "--out", str(out), "--overwrite"], capsys)[0] == 0
    assert out.read_text().startswith("row,log_likelihood\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answers.csv"]


# -- full disks ------------------------------------------------------------------------------------
def test_a_failed_ledger_write_leaves_no_model_no_audit_and_no_temp_file(user, tmp_path):
    """The ledger is the job's last write: the model and audit files already written go too."""
    out = tmp_path / "out"
    r = run_mpi(3, ["-m", "mpifc", "train", str(user / "pat"), "--learner", "factorized", "--model", str(out / "m.h5"),
                    "--ledger", str(out / "l.csv"), "--audit", str(out / "aud"), "--quiet"], timeout=120,
                env={DISK_FULL_ENV: "l.csv"})
    one_line(r.returncode, r.stderr, f"--ledger {out / 'l.csv'}: cannot be written (No space left on device)")
    assert gone_soon(out), sorted(map(str, out.rglob("*")))


def test_a_failed_audit_write_in_evaluate_leaves_no_ledger_npz_or_audit(user, tmp_path):
    out = tmp_path / "out"
    r = run_mpi(3, ["-m", "mpifc", "evaluate", str(user / "pat"), "--model", str(user / "m.h5"), "--distributed",
                    "--ledger", str(out / "l.csv"), "--output-npz", str(out / "o.npz"), "--audit", str(out / "aud"),
                    "--quiet"], timeout=120, env={DISK_FULL_ENV: "audit-summary.json"})
    one_line(r.returncode, r.stderr, "--audit", "audit-summary.json: cannot be written (No space left on device)")
    assert gone_soon(out), sorted(map(str, out.rglob("*")))


def test_a_distributed_query_whose_answer_fails_leaves_no_ledger(user, tmp_path):
    answers, ledger = tmp_path / "a.csv", tmp_path / "q.csv"
    r = run_mpi(3, ["-m", "mpifc", "query", str(user / "m.h5"), "--data", str(user / "patients-ask.csv"), "--what",
                    "ll", "--out", str(answers), "--distributed", "--ledger", str(ledger)], timeout=120,
                env={DISK_FULL_ENV: "a.csv"})
    one_line(r.returncode, r.stderr, f"--out {answers}: cannot be written (No space left on device)")
    assert gone_soon(answers, ledger) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["query", "{m}", "--data", "{ask}", "--what", "sample", "--out", "{out}/s/a.csv"],
    ["experiment", "table3", "--quick", "--out", "{out}/results"],
], ids=["query --out", "experiment --out"])
def test_one_process_commands_on_a_full_disk(user, tmp_path, capsys, monkeypatch, argv):
    monkeypatch.setenv(DISK_FULL_ENV, "0")
    argv = [a.format(m=user / "m.h5", ask=user / "patients-ask.csv", out=tmp_path) for a in argv]
    code, err = run_here(argv, capsys)
    one_line(code, err, "--out", "cannot be written (No space left on device)")
    assert list(tmp_path.iterdir()) == []


def test_data_prep_on_a_full_disk(user, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(DISK_FULL_ENV, "test.h5")  # the shards are written, the test set is not
    code = prep_main(["--dataset", "csv", "--path", str(user / "patients.csv"), "--out", str(tmp_path / "a" / "pat")])
    one_line(code, capsys.readouterr().err, "--out", "cannot be written (No space left on device)")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB tmpfs (CI runs as root); skipped where this process cannot mount one."""
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip() or r.returncode})")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_real_full_disk(user, tiny_disk, capsys):
    """A model bigger than the room left: one line and exit 2, where rank 0 once died inside HDF5."""
    (tiny_disk / "filler").write_bytes(b"\0" * 32 * 1024)  # a ~40 kB model does not fit in the 32 KiB left
    r = run_mpi(3, ["-m", "mpifc", "train", str(user / "pat"), "--learner", "factorized", "--model",
                    str(tiny_disk / "m.h5"), "--ledger", str(tiny_disk / "l.csv"), "--quiet"], timeout=120)
    one_line(r.returncode, r.stderr, f"--model {tiny_disk / 'm.h5'}: cannot be written (No space left on device)")
    assert gone_soon(*(p for p in tiny_disk.iterdir() if p.name != "filler"))
    with open(tiny_disk / "filler", "ab", buffering=0) as f:  # fill the disk to the last block
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:
            pass
    code, err = run_here(["query", str(user / "m.h5"), "--data", str(user / "patients-ask.csv"), "--what", "mpe",
                          "--out", str(tiny_disk / "a.csv")], capsys)
    one_line(code, err, "--out", "No space left on device")
    assert [p.name for p in tiny_disk.iterdir()] == ["filler"]


# -- bad files ---------------------------------------------------------------------------------------
def _edited(model: Path, to: Path, dataset: str, index: int, value: float) -> Path:
    """A copy of ``model`` with one parameter set and the checksum sealed again (as a user who
    edits a model on purpose would)."""
    shutil.copy(model, to)
    with h5py.File(to, "r+") as f:
        ds = f[dataset]
        data = ds[()]
        data.reshape(-1)[index] = value
        ds[...] = data
    seal(to)
    return to


def _leaf_group(model: Path, leaf_type: str) -> str:
    with h5py.File(model, "r") as f:
        for name in sorted(f["fc/leaves"], key=int):
            if f"fc/leaves/{name}/model/leaves/{leaf_type}" in f:
                return f"fc/leaves/{name}/model"
    raise AssertionError(f"no {leaf_type} leaf in {model}")


@pytest.mark.parametrize("leaf_type,param,index,value,needle", [
    ("gaussian", "var", 0, -0.5, "'var' = -0.5: a variance must be finite and > 0"),
    ("gaussian", "var", 1, 0.0, "'var' = 0.0"),
    ("gaussian", "mean", 0, np.inf, "'mean' = inf: a mean must be finite"),
    ("bernoulli", "p", 0, 1.7, "'p' = 1.7: a probability must be in [0, 1]"),
    ("categorical", "probs", 0, 0.9, "'probs' sum to"),
    ("categorical", "probs", 1, -0.1, "'probs'[1] = -0.1"),
    ("histogram", "breaks", 1, -1e9, "'breaks'[1] = -1000000000.0: edges must be strictly increasing"),
    ("histogram", "densities", 0, np.nan, "'densities'[0] = nan"),
    (None, "sum_weights", 0, 3.0, "sum_weights of the sum node"),
    (None, "fc/nodes/child_idx", 0, 10 ** 6, "has a child that is not a node before it"),
])
def test_a_resealed_model_with_a_parameter_out_of_its_domain_is_refused(user, tmp_path, leaf_type, param, index,
                                                                        value, needle):
    model = user / "m.h5"
    if param.startswith("fc/"):
        dataset = param
    elif leaf_type is None:
        dataset = f"{_leaf_group(model, 'gaussian')}/{param}"
    else:
        dataset = f"{_leaf_group(model, leaf_type)}/leaves/{leaf_type}/{param}"
    bad = _edited(model, tmp_path / "bad.h5", dataset, index, value)
    with pytest.raises(UserError) as e:
        load_fc(bad)
    assert str(bad) in str(e.value) and needle in str(e.value), str(e.value)


def test_models_with_a_variance_below_0_or_p_17_no_longer_answer(user, tmp_path, capsys):
    """Both were accepted and answered (evaluate: test_inputs_outputs' NaN case)."""
    model = user / "m.h5"
    for leaf, param, value, needle in (("gaussian", "var", -0.5, "'var' = -0.5"), ("bernoulli", "p", 1.7, "'p' = 1.7")):
        bad = _edited(model, tmp_path / f"{param}.h5", f"{_leaf_group(model, leaf)}/leaves/{leaf}/{param}", 0, value)
        code, err = run_here(["query", str(bad), "--data", str(user / "patients-ask.csv"), "--what", "predict",
                              "--out", str(tmp_path / "a.csv")], capsys)
        one_line(code, err, str(bad), needle)
    assert not (tmp_path / "a.csv").exists()


def test_a_non_utf8_csv_and_an_hdf5_file_as_path_are_one_line(user, tmp_path, capsys):
    bad = tmp_path / "latin1.csv"
    lines = (user / "patients.csv").read_text().splitlines()
    lines[5] = "\xe9" + lines[5]  # an accented id on line 6, saved as Latin-1
    bad.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    shutil.copy(user / "patients.schema.json", tmp_path / "latin1.schema.json")
    shutil.copy(user / "m.h5", tmp_path / "model.csv")
    shutil.copy(user / "patients.schema.json", tmp_path / "model.schema.json")
    for path, needle in ((bad, f"{bad}: line 6: not UTF-8 text"), (tmp_path / "model.csv", "an HDF5 file")):
        code = prep_main(["--dataset", "csv", "--path", str(path), "--out", str(tmp_path / "o")])
        one_line(code, capsys.readouterr().err, needle)
    assert not (tmp_path / "o").exists()


def test_json_stays_strict_when_a_number_is_not_finite():
    from mpifc.cli.summary import json_line

    def strict(token: str):
        raise ValueError(f"not JSON: {token}")

    out = json.loads(json_line({"test_ll": float("nan"), "accuracy": 0.5}), parse_constant=strict)
    assert out["test_ll"] is None and "NaN" in out["test_ll_null_reason"] and out["accuracy"] == 0.5
