"""Tiny federated data sets for the federated tests, and a writer for data_prep-format shards."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mpifc.federated.one_pass import ClientDeclaration, ids_digest

FEATURES = ("a", "b", "c", "d", "y")


def binary_table(n: int, seed: int = 0) -> np.ndarray:
    """``(n, 5)`` dependent binary columns a,b,c,d,y (y depends on a and c)."""
    rng = np.random.default_rng(seed)
    a = rng.random(n) < 0.4
    b = np.where(rng.random(n) < 0.8, a, rng.random(n) < 0.5)
    c = rng.random(n) < 0.5
    d = np.where(rng.random(n) < 0.7, ~c, c)
    y = np.where(rng.random(n) < 0.85, a ^ c, rng.random(n) < 0.5)
    return np.stack([a, b, c, d, y], axis=1).astype(np.float64)


# client index -> (features, row selector) per setting; rows are "all" or a half.
LAYOUTS = {
    "horizontal": [(FEATURES, slice(0, None, 3)), (FEATURES, slice(1, None, 3)), (FEATURES, slice(2, None, 3))],
    "vertical": [(("a", "b"), slice(None)), (("c", "d"), slice(None)), (("y",), slice(None))],
    "hybrid": [(("a", "b", "y"), slice(0, None, 2)), (("c", "d", "y"), slice(1, None, 2))],
}


def split(x: np.ndarray, setting: str, ids: np.ndarray | None = None):
    """``[(declaration, x_client, ids_client)]`` for ``setting`` over :data:`FEATURES`."""
    ids = np.arange(len(x), dtype=np.int64) if ids is None else ids
    out = []
    for i, (feats, rows) in enumerate(LAYOUTS[setting]):
        cols = [FEATURES.index(f) for f in feats]
        xi, ii = x[rows][:, cols], ids[rows]
        decl = ClientDeclaration(i, tuple(feats), ("discrete",) * len(feats), (2,) * len(feats), len(xi),
                                 ids_digest(ii))
        out.append((decl, xi, ii))
    return out


class _Source:
    """A data_prep ``ShardSource`` over an in-memory table split by :data:`LAYOUTS`."""

    def __init__(self, setting: str, x_train: np.ndarray, x_test: np.ndarray, meta_type: str,
                 features: tuple[str, ...], layouts: list | None) -> None:
        self.setting, self.x_train, self.x_test, self.meta_type = setting, x_train, x_test, meta_type
        self.features = features
        self.layout = layouts or LAYOUTS[setting]
        self.n_clients = len(self.layout)
        self.test_ids = np.arange(10_000, 10_000 + len(x_test), dtype=np.int64)

    def _meta(self, f: str) -> str:
        return "discrete" if f == "y" else self.meta_type

    def client_shard(self, index: int):
        from data_prep.shards import ClientShard

        feats, rows = self.layout[index]
        cols = [self.features.index(f) for f in feats]
        ids = np.arange(len(self.x_train), dtype=np.int64)
        return ClientShard(index, list(feats), [self._meta(f) for f in feats], self.x_train[rows][:, cols],
                           ids[rows], self.x_test[:, cols], self.test_ids)

    def test_set(self):
        from data_prep.shards import TestSet

        return TestSet(list(self.features), self.x_test, self.test_ids)

    def manifest_fields(self) -> dict:
        return {"dataset": "tiny", "setting": self.setting, "split": "iid", "seed": 0, "target": "y",
                "classes": [0, 1],
                "features": {f: {"meta_type": self._meta(f), "raw_meta_type": self._meta(f),
                                 "n_categories": 2 if self._meta(f) != "real" else None} for f in self.features},
                "feature_order": list(self.features), "preprocessing": {}, "label_owner": "all"}


def write_shards(root: Path, setting: str, x_train: np.ndarray, x_test: np.ndarray,
                 meta_type: str = "discrete", features: tuple[str, ...] = FEATURES,
                 layouts: list | None = None) -> Path:
    """Write a data_prep shard directory (``manifest.json``, ``client-<i>.h5``, ``test.h5``)."""
    from data_prep.shards import write_shards as write

    write(_Source(setting, x_train, x_test, meta_type, features, layouts), root)
    return root


def real_table(n: int, seed: int = 0) -> np.ndarray:
    """``(n, 5)``: four correlated Gaussian columns a..d and a binary y (real-valued data for
    the audit: raw rows cannot appear by chance in other bytes)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 1))
    x = z + 0.5 * rng.normal(size=(n, 4))
    y = (z[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.float64)
    return np.column_stack([x, y])


def all_binary(d: int) -> np.ndarray:
    """Every binary vector of length d, ``(2**d, d)``."""
    return ((np.arange(2 ** d)[:, None] >> np.arange(d)[::-1]) & 1).astype(np.float64)
