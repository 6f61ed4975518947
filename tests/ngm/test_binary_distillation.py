"""A global NGM distilled from weakly trained client NGMs must not invert a binary target.

Clients trained for a few hundred steps rank the binary target well from full evidence, but
their softmax heads are still nearly flat; sampled without calibration the target came out almost
independent of the other features, and the global NGM fitted to those samples predicted it with
an arbitrary sign (this exact configuration gave AUC 0.12 before the sampler calibrated its
categorical heads).
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score

from mpifc.ngm.federation import distill_global
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.inference import InferenceSettings, predict_feature
from mpifc.ngm.sampling import fit_temperature, sample
from mpifc.ngm.schema import Schema, categorical, real
from mpifc.ngm.training import TrainConfig, fit_ngm

SCHEMA = Schema((real("a"), categorical("c", 4), categorical("e", 3), categorical("y", 2)))
GRAPH = DependencyGraph.from_edges(SCHEMA.names, [("a", "c"), ("a", "y"), ("c", "y"), ("a", "e")])


def strong_binary(n: int, seed: int) -> np.ndarray:
    """``(n, 4)``: ``y`` (about 35% ones) depends strongly on ``a`` and ``c``; ``a`` is the BFS root."""
    r = np.random.default_rng(seed)
    a = r.standard_normal(n)
    c = np.clip(np.round(a + 1.5 + 0.7 * r.standard_normal(n)), 0, 3)
    e = (a > 0).astype(float) + (r.random(n) < 0.3)
    y = (r.random(n) < 1 / (1 + np.exp(-(3.0 * (c >= 2) - 3.0 + 1.5 * a)))).astype(float)
    return np.stack([a, c, e, y], 1)


def test_fit_temperature_sharpens_flat_heads_and_fixes_the_marginal():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2.0 * s - 1.0)))).astype(int)
    flat = np.stack([np.zeros_like(s), 0.05 * s], 1)  # right ranking, 40x too flat, no bias
    t, c = fit_temperature(flat, y)
    assert 30 < t < 50  # the true scale is 2 / 0.05 = 40
    p1 = 1 / (1 + np.exp(-(t * (flat[:, 1] - flat[:, 0]) + c[1] - c[0])))
    assert abs(p1.mean() - y.mean()) < 0.01
    # A head that ranks backwards gets a negative temperature (fitted on the client's own data).
    assert fit_temperature(-flat, y)[0] < -30


def test_global_ngm_from_weak_clients_predicts_the_binary_target():
    cfg = TrainConfig(epochs=10, batch_size=128, seed=0, calib_rows=300, inference=InferenceSettings(steps=10))
    shards = [strong_binary(300, s) for s in range(3)]
    clients = [fit_ngm(x, SCHEMA, GRAPH, hidden=(16, 16), config=cfg) for x in shards]
    test = strong_binary(1500, 99)
    for m, x in zip(clients, shards):
        assert roc_auc_score(test[:, 3], predict_feature(m, test, "y")[:, 1]) > 0.8
        xs = sample(m, 1000, np.random.default_rng(1))
        assert abs(xs[:, 3].mean() - x[:, 3].mean()) < 0.1  # the sampled head keeps the client's marginal
        assert roc_auc_score(xs[:, 3], xs[:, 0]) > 0.51  # and the dependence's direction (0.50 before)
    glob, _ = distill_global(clients, GRAPH, 900, hidden=(16, 16),
                             config=TrainConfig(epochs=10, batch_size=128, seed=2, calib_rows=300,
                                                inference=InferenceSettings(steps=10)))
    assert roc_auc_score(test[:, 3], predict_feature(glob, test, "y")[:, 1]) > 0.75
