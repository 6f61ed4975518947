"""``--hp``: every key is one a learner takes, every value of its type and range, checked early."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from mpifc.errors import UserError
from mpifc.federated.hyperparameters import LEARNER_PARAMS, check_hyperparameters
from tests.mpi_util import REPO

# Arguments of the fit functions that the plan, the data or the rank (its device) fill in, never ``--hp``.
DATA_ARGS = {"x", "data", "meta_types", "seed", "n_categories", "var_min_var", "target_index", "leaf_kwargs",
             "device", "_"}


def _signature_params(learner: str) -> set[str]:
    from mpifc.federated import learners as L

    if learner == "learnspn":
        from mpifc.circuit.learnspn import learn_spn as fn
    elif learner == "einet":
        from mpifc.circuit.einet import fit_einet as fn
    elif learner == "dt":
        from mpifc.federated.fcdt import fit_tree_learner as fn
    else:
        fn = {"ratspn": L._fit_ratspn, "factorized": L._fit_factorized}[learner]
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n not in DATA_ARGS}


@pytest.mark.parametrize("learner", sorted(LEARNER_PARAMS))
def test_the_table_is_the_learners_signature(learner):
    from mpifc.federated.learners import learner_names

    assert learner in learner_names()
    assert set(LEARNER_PARAMS[learner]) == _signature_params(learner)


def test_values_are_coerced_and_checked():
    hp = check_hyperparameters({"threshold": 0.4, "min_instances_slice": "30", "col_split": "gtest",
                                "cluster_first": "true", "cluster_without_target": 1}, ["learnspn"])
    assert hp == {"threshold": 0.4, "min_instances_slice": 30, "col_split": "gtest", "cluster_first": True,
                  "cluster_without_target": True}
    assert check_hyperparameters({"max_var": "none"}, ["einet"]) == {"max_var": None}


@pytest.mark.parametrize("hp, learners, message", [
    ({"min_instance_slice": 5}, ["learnspn"], r"--hp min_instance_slice: unknown hyperparameter .*did you mean min_instances_slice"),
    ({"foo": 1}, ["learnspn"], r"--hp foo: unknown hyperparameter of learner learnspn \(known: "),
    ({"min_var": "abc"}, ["learnspn"], r"--hp min_var=abc: not a number; expected a number > 0"),
    ({"threshold": 1.5}, ["learnspn"], r"--hp threshold=1.5: out of range; expected a number in \[0, 1\]"),
    ({"min_instances_slice": 2.5}, ["learnspn"], r"not an integer"),
    ({"col_split": "pearson"}, ["learnspn"], r"--hp col_split=pearson: unknown value; expected one of rdc, gtest"),
    ({"epochs": -1}, ["einet"], r"--hp epochs=-1: out of range"),
    ({"threshold": 0.3}, ["factorized"], r"--hp threshold: unknown hyperparameter of learner factorized"),
    ({"min_var": float("nan")}, ["learnspn"], r"not a finite number"),
])
def test_bad_keys_and_values_name_the_key(hp, learners, message):
    with pytest.raises(UserError, match=message):
        check_hyperparameters(hp, learners)


def test_a_key_of_any_chosen_learner_is_accepted():
    # --learner learnspn with --client-learner 1=einet: einet's keys are known too
    assert check_hyperparameters({"epochs": 2, "threshold": 0.4}, ["learnspn", "einet"]) == {"epochs": 2,
                                                                                             "threshold": 0.4}


@pytest.mark.parametrize("args, needle", [
    (["--hp", "foo=1"], "--hp foo: unknown hyperparameter"),
    (["--hp", "min_instance_slice=5"], "did you mean min_instances_slice"),
    (["--hp", "min_var=abc"], "--hp min_var=abc: not a number"),
])
def test_the_command_refuses_before_any_work_in_one_line(tmp_path, args, needle):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    model = tmp_path / "m.h5"
    r = subprocess.run([sys.executable, "-m", "mpifc", "train", str(tmp_path / "no-shards"), "--model", str(model),
                        *args], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert not model.exists()
