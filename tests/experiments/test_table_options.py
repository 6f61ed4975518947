"""Table 1 / Table 7 options: --methods, image-set names, the paper's LearnSPN settings (no MPI)."""
from __future__ import annotations

import argparse
import json

import pytest

from mpifc.errors import UserError
from mpifc.experiments import paper
from mpifc.experiments.jobs import capped_hp, fc_train_args
from mpifc.cli.experiment import add_experiment_arguments, main, options_from_args
from mpifc.experiments.table7 import is_image_set, paper_matches


def _opts(argv):
    p = argparse.ArgumentParser()
    add_experiment_arguments(p)
    return options_from_args(p.parse_args(argv))


def test_methods_and_image_sets_parse(capsys):
    assert _opts(["table7", "--methods", "fc-pc,hgb"])["methods"] == ["fc-pc", "hgb"]
    assert _opts(["table2", "--datasets", "mnist,imagenet32,imagenet32:2"])["datasets"] == \
        ["mnist", "imagenet32", "imagenet32:2"]
    assert main(["table7", "--methods", "tabnet"]) == 2
    assert "tabnet" in capsys.readouterr().err
    with pytest.raises(UserError, match="'adult:3'"):
        _opts(["table7", "--datasets", "adult:3"])  # only image sets take a suffix
    assert is_image_set("imagenet32:2") and is_image_set("mnist") and not is_image_set("credit")


def _shards(tmp_path, n_train):
    (tmp_path / "manifest.json").write_text(json.dumps({"clients": [{"n_train": n} for n in n_train]}))
    return tmp_path


def test_learnspn_settings_are_the_papers_with_spflow_rdc(tmp_path, monkeypatch):
    import data_prep.shards as shards

    class M:
        def __init__(self, d):
            self.clients = json.loads((d / "manifest.json").read_text())["clients"]
            self.n_clients = len(self.clients)

    monkeypatch.setattr(shards, "load_manifest", lambda d: M(d))
    d = _shards(tmp_path, [90, 400])
    hp, glue = paper.learnspn_hp("vertical", "credit")
    assert (hp["threshold"], hp["min_instances_slice"], glue) == (0.5, 50, "combinatorial")
    capped = capped_hp(hp, d)
    assert capped["min_instances_slice"] == 10 and capped["min_instances_slice_paper"] == 50
    assert capped["rdc_ties"] == "ordinal" and capped["rdc_k"] == 20
    # experiments building Table 4's values by hand get the same job arguments (shared cached runs)
    bare = capped_hp({"threshold": 0.5, "min_instances_slice": 50}, d)
    assert fc_train_args(d, hp=bare) == fc_train_args(d, hp=capped)
    args, ranks = fc_train_args(d, hp=capped)
    assert ranks == 3 and "rdc_ties=ordinal" in args and "rdc_k=20" in args
    assert not any("_paper" in a for a in args)
    # an explicit RDC choice is kept
    assert capped_hp({**hp, "rdc_ties": "max"}, d)["rdc_ties"] == "max"


def test_paper_matches_counts_seeds_and_uses_the_larger_std():
    agg = [{"dataset": "credit", "setting": "horizontal", "clients": 5, "method": "fc-pc", "status": "ok",
            "seeds": 5, "accuracy_mean": 0.92, "accuracy_std": 0.01, "f1_mean": 0.60, "f1_std": 0.05}]
    rows = paper_matches(agg, ["credit"], [("horizontal", 5)])
    # paper: accuracy 0.93 ± 0.02 (0.92 is within), F1 0.68 ± 0.02 (0.60 is not, even with our 0.05)
    assert [r[2:] for r in rows] == [["accuracy", "5", "0.92 ± 0.01", "0.93 ± 0.02", "yes"],
                                     ["f1", "5", "0.60 ± 0.05", "0.68 ± 0.02", "no"]]
