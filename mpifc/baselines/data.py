"""Shards as classifier inputs: features apart from the target column, labels, metrics.

The target is an ordinary feature column (``manifest.target``) holding class codes ``0..k-1``.
A client that holds it (every client in horizontal FL, the label owner in vertical FL) gets its
labels from it; the column is never a feature of its own model. Level-coded columns (``discrete``
with more than two levels: counts, categoricals ordered by class rate) enter as
``code / (levels - 1)``, in [0, 1], so that no column's raw code range outweighs the standardised
real columns in an MLP's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.shards import ClientShard, Manifest, load_manifest, read_client, read_test
from mpifc.errors import UserError


@dataclass
class XY:
    """Classifier inputs of one party.

    Attributes:
        features: names of the columns of ``x`` (target excluded).
        x: ``(n, d)`` float64, NaN only where the shard had missing values.
        y: ``(n,)`` int64 class codes, or ``None`` when this party does not hold the target.
        ids: ``(n,)`` int64 global sample ids.
    """

    features: list[str]
    x: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray


def n_classes(manifest: Manifest) -> int:
    """Number of classes of the target; UserError when the dataset has none."""
    if manifest.target is None:
        raise UserError(f"{manifest.directory}: the shards have no target column (manifest 'target' is null); "
                        "the baselines are classifiers")
    return max(2, len(manifest.classes or []))


def _labels(col: np.ndarray, where: str, k: int) -> np.ndarray:
    if np.isnan(col).any():
        raise UserError(f"{where}: the target column has missing values")
    y = col.astype(np.int64)
    if (y != col).any() or y.min(initial=0) < 0 or y.max(initial=0) >= k:
        raise UserError(f"{where}: target values must be class codes 0..{k - 1}")
    return y


def split_xy(features: list[str], x: np.ndarray, ids: np.ndarray, target: str, k: int, where: str) -> XY:
    """Separate the target column (if present) from the features of one table."""
    if target in features:
        j = features.index(target)
        keep = [i for i in range(len(features)) if i != j]
        return XY([features[i] for i in keep], x[:, keep], _labels(x[:, j], where, k), ids)
    return XY(list(features), x, None, ids)


def _unit_levels(manifest: Manifest, xy: XY) -> XY:
    """``xy`` with its level-coded columns divided by ``levels - 1`` (see the module doc)."""
    div = np.ones(len(xy.features))
    for j, f in enumerate(xy.features):
        meta = manifest.features.get(f) or {}
        k = int(meta.get("n_categories") or 0)
        if meta.get("meta_type") == "discrete" and k > 2:
            div[j] = k - 1
    if np.all(div == 1.0):
        return xy
    return XY(xy.features, xy.x / div, xy.y, xy.ids)


def client_xy(manifest: Manifest, index: int, part: str = "train") -> XY:
    """Client ``index``'s train or test rows, target split off; sorted by sample id.

    Sorting makes vertical clients agree on row order from the ids alone (alignment by ids).
    """
    shard: ClientShard = read_client(manifest.directory, index)
    x, ids = (shard.x_train, shard.ids_train) if part == "train" else (shard.x_test, shard.ids_test)
    order = np.argsort(ids, kind="stable")
    where = f"{manifest.directory}: client {index} ({part})"
    return _unit_levels(manifest, split_xy(shard.features, x[order], ids[order], manifest.target,
                                           n_classes(manifest), where))


def test_xy(manifest: Manifest) -> XY:
    """The held-out test set over every feature, target split off."""
    t = read_test(manifest.directory)
    return _unit_levels(manifest, split_xy(t.features, t.x, t.ids, manifest.target, n_classes(manifest),
                                           f"{manifest.directory}: test set"))


def central_train_xy(directory: str | Path) -> tuple[Manifest, XY]:
    """Every client's training rows joined into one table over ``feature_order`` (the centralized
    reference sees what the federation holds together).

    Rows are the union of sample ids; a cell no client holds is NaN (hybrid FL). Every row must
    have a label.
    """
    m = load_manifest(directory)
    k = n_classes(m)
    cols = [f for f in m.feature_order if f != m.target]
    col_of = {f: j for j, f in enumerate(cols)}
    shards = [read_client(m.directory, i) for i in range(m.n_clients)]
    ids = np.unique(np.concatenate([s.ids_train for s in shards]))
    row_of = {int(v): i for i, v in enumerate(ids)}
    x = np.full((len(ids), len(cols)), np.nan)
    y = np.full(len(ids), -1, dtype=np.int64)
    for s in shards:
        rows = np.fromiter((row_of[int(v)] for v in s.ids_train), dtype=np.int64, count=len(s.ids_train))
        part = split_xy(s.features, s.x_train, s.ids_train, m.target, k, f"{m.directory}: client {s.index}")
        x[np.ix_(rows, [col_of[f] for f in part.features])] = part.x
        if part.y is not None:
            y[rows] = part.y
    if (y < 0).any():
        raise UserError(f"{m.directory}: {int((y < 0).sum())} training rows have no label on any client")
    return m, _unit_levels(m, XY(cols, x, y, ids))


def scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy and macro F1 (the paper's Table 7 F1 is macro: a constant predictor on credit
    scores 0.48 there)."""
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0))}
