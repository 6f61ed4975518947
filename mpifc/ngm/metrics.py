"""The metrics of the FedNGM paper's Tables 2-4, and per-feature evaluation of an NGM.

* continuous and ordinal targets: MAE, RMSE (in the feature's units);
* binary: AUC and AUPR (average precision) of the predicted probability of code 1;
* multi-class: micro- and macro-averaged precision and recall of the argmax prediction.
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, precision_score, recall_score, roc_auc_score

from mpifc.errors import UserError
from mpifc.ngm.inference import InferenceSettings, predict_feature
from mpifc.ngm.model import NGM


def regression_metrics(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """``{"mae", "rmse"}`` of ``pred`` against ``y`` (both ``(n,)``)."""
    y, pred = np.asarray(y, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    if y.shape != pred.shape or y.size == 0:
        raise UserError(f"metrics: need equal non-empty shapes, got {y.shape} and {pred.shape}")
    err = pred - y
    return {"mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err ** 2)))}


def binary_metrics(y: np.ndarray, p1: np.ndarray, name: str = "target") -> dict[str, float]:
    """``{"auc", "aupr"}`` for 0/1 labels ``y`` ``(n,)`` and scores ``p1`` ``(n,)``.

    Raises:
        UserError: ``y`` holds only one class (both metrics are undefined).
    """
    y = np.asarray(y).astype(np.int64)
    if np.unique(y).size < 2:
        raise UserError(f"metrics: binary feature {name!r} has a single class in the test data; AUC is undefined")
    return {"auc": float(roc_auc_score(y, p1)), "aupr": float(average_precision_score(y, p1))}


def multiclass_metrics(y: np.ndarray, pred: np.ndarray, n_classes: int) -> dict[str, float]:
    """Micro/macro precision and recall of labels ``pred`` against ``y`` (both ``(n,)``).

    Macro averages run over the classes present in ``y`` or ``pred``; a class never predicted
    has precision 0 (it counts, since rare classes are what macro averages are for).
    """
    y, pred = np.asarray(y).astype(np.int64), np.asarray(pred).astype(np.int64)
    labels = np.union1d(np.unique(y), np.unique(pred))
    labels = labels[(labels >= 0) & (labels < n_classes)]
    out = {}
    for avg in ("micro", "macro"):
        out[f"{avg}_precision"] = float(precision_score(y, pred, labels=labels, average=avg, zero_division=0))
        out[f"{avg}_recall"] = float(recall_score(y, pred, labels=labels, average=avg, zero_division=0))
    return out


def evaluate_feature(model: NGM, x: np.ndarray, name: str,
                     settings: InferenceSettings = InferenceSettings()) -> dict[str, float]:
    """Predict ``name`` from the other features of ``x`` ``(n, d)`` and score it.

    Returns:
        MAE/RMSE for a real feature, AUC/AUPR for a binary one, micro/macro precision/recall for
        a multi-class one.
    """
    x = model.schema.validate(x, what="evaluation data")
    j = model.schema.index(name)
    f = model.schema.features[j]
    pred = predict_feature(model, x, name, settings)
    if not f.is_categorical:
        return regression_metrics(x[:, j], pred)
    if f.n_categories == 2:
        return binary_metrics(x[:, j], pred[:, 1], name)
    return multiclass_metrics(x[:, j], pred.argmax(1), f.n_categories)
