"""``mpifc train``'s presets: flags not given stay out of the settings (the client's rule fills
them), ``--preset paper`` reads Table 4 from mpifc.experiments.paper, explicit flags win."""
from __future__ import annotations

import pytest

from data_prep.prepare import prepare
from data_prep.shards import write_shards
from mpifc.cli import build_parser, parse_args
from mpifc.cli.train import train_config
from mpifc.errors import UserError
from mpifc.experiments.paper import SPFLOW_RDC, TABLE4


@pytest.fixture(scope="module")
def bc(tmp_path_factory):
    root = tmp_path_factory.mktemp("bc")
    for setting in ("horizontal", "vertical"):
        write_shards(prepare(dataset="breast-cancer", setting=setting, clients=2, seed=0), root / setting)
    return root


def _cfg(*argv: str) -> dict:
    return train_config(parse_args(["train", *argv, "--model", "m.h5"]))


def test_no_flags_leave_everything_to_the_adaptive_rule(bc):
    cfg = _cfg(str(bc / "horizontal"))
    assert cfg["hyperparameters"] == {} and cfg["clusters"] is None and cfg["glue"] is None and cfg["refine"] is None
    assert (cfg["preset"], cfg["defaults"]) == ("adaptive", "adaptive")
    explicit = _cfg(str(bc / "horizontal"), "--threshold", "0.4", "--clusters", "3", "--hp", "alpha=0.5")
    assert explicit["hyperparameters"] == {"threshold": 0.4, "alpha": 0.5} and explicit["clusters"] == 3


def test_learner_preset_is_the_learners_own_defaults(bc):
    cfg = _cfg(str(bc / "horizontal"), "--preset", "learner")
    assert cfg["hyperparameters"] == {} and cfg["clusters"] == 2 and cfg["defaults"] == "learner"


def test_paper_preset_reads_table4_and_flags_win(bc):
    thr, mis, glue = TABLE4["vertical"]["breast-cancer"]
    cfg = _cfg(str(bc / "vertical"), "--preset", "paper")
    assert cfg["hyperparameters"] == {"threshold": thr, "min_instances_slice": mis, **SPFLOW_RDC}
    assert (cfg["glue"], cfg["clusters"], cfg["defaults"]) == (glue, 2, "learner")
    over = _cfg(str(bc / "vertical"), "--preset", "paper", "--min-instances-slice", "30", "--glue", "random")
    assert over["hyperparameters"]["min_instances_slice"] == 30 and over["glue"] == "random"
    assert _cfg(str(bc / "horizontal"), "--preset", "paper")["glue"] == TABLE4["horizontal"]["breast-cancer"][2]


def test_paper_preset_without_a_table4_cell_is_a_clear_error(tmp_path):
    write_shards(prepare(dataset="breast-cancer", setting="central", clients=1, seed=0), tmp_path / "c")
    with pytest.raises(UserError, match="--preset paper: Table 4 has no settings for dataset 'breast-cancer' "
                                        "in the central setting"):
        _cfg(str(tmp_path / "c"), "--preset", "paper")


def test_help_states_the_rule():
    _, subs = build_parser()
    text = " ".join(subs["train"].format_help().split())
    for phrase in ("0.05 / (d-1) from 2,000 rows", "0.05 / (d(d-1)/2)",
                   "min_instances_slice = n/10 clipped to [10, 100]", "target_first",
                   "--preset learner", "With --setting central shards"):
        assert phrase in text
