"""Centralized references (no federation, no MPI): gradient boosting as the ceiling and an MLP.

Both train on every client's training rows joined into one table
(:func:`mpifc.baselines.data.central_train_xy`) and score on the held-out test set. The MLP is
trained exactly like a FedAvg client (:func:`mpifc.baselines.mlp.sgd_epochs`, shuffled by the
generator of party 0), so with one client FedAvg and it must agree.

Run: ``mpifc baseline central DIR [--model hgb|mlp] --json``.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from mpifc.errors import UserError


def train_mlp(x: np.ndarray, y: np.ndarray, n_classes: int, hidden: Sequence[int], epochs: int,
              batch_size: int, lr: float, seed: int, dtype: str = "float32") -> Any:
    """A centralized MLP trained with plain SGD; returns the torch model.

    Args:
        x: ``(n, d)`` features (NaN -> 0, the standardized mean); y: ``(n,)`` class codes.
        epochs: passes; for FedAvg equivalence use ``rounds * local_epochs``.
    """
    import torch

    from mpifc.baselines.fedavg import shuffle_generator
    from mpifc.baselines.mlp import make_mlp, sgd_epochs, torch_dtype

    tdtype = torch_dtype(dtype)
    model = make_mlp(x.shape[1], hidden, n_classes, seed, tdtype)
    xt = torch.from_numpy(np.nan_to_num(x)).to(tdtype)
    sgd_epochs(model, xt, torch.from_numpy(y.astype(np.int64)), epochs, batch_size, lr, shuffle_generator(seed, 0))
    return model


def run_central(directory: str, model: str = "hgb", seed: int = 0, hidden: Sequence[int] = (64, 32),
                epochs: int = 50, batch_size: int = 32, lr: float = 0.1) -> dict[str, Any]:
    """Train a centralized model on the joined shards and score it on the test set.

    Args:
        model: ``"hgb"`` (scikit-learn HistGradientBoostingClassifier, default settings, NaN
            handled natively) or ``"mlp"``.

    Returns:
        ``{"method": "central-hgb"|"central-mlp", "accuracy", "f1", "n_train", "n_test",
        "wall_seconds", ...}``; no bytes: nothing crosses a network.
    """
    from mpifc.baselines.data import central_train_xy, n_classes, scores, test_xy

    m, train = central_train_xy(directory)
    test = test_xy(m)
    cols = [test.features.index(f) for f in train.features]
    x_test = test.x[:, cols]
    if model == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        t0 = time.perf_counter()
        clf = HistGradientBoostingClassifier(random_state=seed).fit(train.x, train.y)
        y_pred = clf.predict(x_test).astype(np.int64)
    elif model == "mlp":
        import torch

        from mpifc.baselines.mlp import predict

        t0 = time.perf_counter()
        net = train_mlp(train.x, train.y, n_classes(m), hidden, epochs, batch_size, lr, seed)
        y_pred = predict(net, torch.from_numpy(np.nan_to_num(x_test)).to(torch.float32))
    else:
        raise UserError(f"--model must be 'hgb' or 'mlp', not {model!r}")
    return {"method": f"central-{model}", "dataset": m.dataset, "setting": m.setting, **scores(test.y, y_pred),
            "n_train": int(len(train.y)), "n_test": int(len(test.y)), "seed": seed,
            "wall_seconds": time.perf_counter() - t0, "bytes_train": 0}
