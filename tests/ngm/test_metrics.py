"""Metrics of the paper's Tables 2-4."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.ngm.metrics import binary_metrics, evaluate_feature, multiclass_metrics, regression_metrics


def test_regression_metrics():
    m = regression_metrics(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 1.0, 2.0, 1.0]))
    assert m["mae"] == pytest.approx(0.75)
    assert m["rmse"] == pytest.approx(np.sqrt(5 / 4))


def test_binary_metrics():
    y = np.array([0, 0, 1, 1, 0, 1])
    assert binary_metrics(y, y * 0.8 + 0.1) == {"auc": 1.0, "aupr": 1.0}
    flipped = binary_metrics(y, 1.0 - y)
    assert flipped["auc"] == 0.0
    with pytest.raises(UserError, match="'income'"):
        binary_metrics(np.zeros(4), np.ones(4), name="income")


def test_multiclass_metrics():
    y = np.array([0, 0, 0, 0, 1, 2])
    pred = np.array([0, 0, 0, 0, 0, 2])
    m = multiclass_metrics(y, pred, 3)
    assert m["micro_precision"] == pytest.approx(5 / 6)  # micro = accuracy for single-label data
    assert m["micro_recall"] == pytest.approx(5 / 6)
    assert m["macro_recall"] == pytest.approx((1 + 0 + 1) / 3)
    assert m["macro_precision"] == pytest.approx((4 / 5 + 0 + 1) / 3)


def test_evaluate_feature_dispatches_on_type(chain_model, chain_test):
    real_m = evaluate_feature(chain_model, chain_test, "b")
    assert set(real_m) == {"mae", "rmse"} and real_m["rmse"] < 0.7
    cat_m = evaluate_feature(chain_model, chain_test, "d")
    assert set(cat_m) == {"micro_precision", "micro_recall", "macro_precision", "macro_recall"}
    assert cat_m["micro_recall"] > 0.6
