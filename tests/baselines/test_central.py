"""Centralized references (in-process): the joined table, gradient boosting and the MLP."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.baselines.central import run_central
from mpifc.baselines.data import central_train_xy
from mpifc.errors import UserError
from tests.baselines.fixtures import make_shards, real_data_or_skip


def test_joined_vertical_table_equals_the_union_of_horizontal_shards(bc_dirs):
    """The same rows, split by samples or by features, join back to the same table."""
    _, v = central_train_xy(bc_dirs["v2"])
    _, h = central_train_xy(bc_dirs["h3"])
    assert v.features == h.features and "diagnosis" not in v.features
    assert np.array_equal(v.ids, h.ids) and np.array_equal(v.y, h.y)
    assert not np.isnan(v.x).any()
    np.testing.assert_array_equal(v.x, h.x)


@pytest.mark.parametrize("model", ["hgb", "mlp"])
def test_central_references_on_breast_cancer(bc_dirs, model):
    res = run_central(str(bc_dirs["h3"]), model, epochs=20)
    assert res["accuracy"] >= 0.9 and res["f1"] >= 0.9
    assert res["n_train"] + res["n_test"] == 569


def test_unknown_model_is_a_user_error(bc_dirs):
    with pytest.raises(UserError, match="--model"):
        run_central(str(bc_dirs["h1"]), "svm")


def test_central_hgb_on_adult(tmp_path):
    root = real_data_or_skip("adult")
    d = make_shards(tmp_path / "adult", dataset="adult", data_root=str(root), setting="hybrid", clients=2,
                    seed=0, max_rows=4000)
    res = run_central(str(d), "hgb")
    # adult's majority class is 76%: the ceiling must beat it clearly
    assert res["accuracy"] >= 0.8
