"""Global distillation, stitching and the release rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifc.errors import UserError
from mpifc.ngm.federation import (ReleaseRefused, ReleaseRule, distill_global, sample_counts, stitch,
                                  to_stitched_columns, train_stitched)
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.inference import InferenceSettings, predict_feature
from mpifc.ngm.schema import Schema, categorical, real
from mpifc.ngm.training import TrainConfig, fit_ngm

from .conftest import CHAIN_GRAPH, CHAIN_SCHEMA, chain_data

TINY = TrainConfig(epochs=12, batch_size=32, lam=1.0, seed=0, calib_rows=300,
                   inference=InferenceSettings(steps=10))
GLOBAL = TrainConfig(epochs=16, batch_size=64, lam=1.0, seed=0, calib_rows=300,
                     inference=InferenceSettings(steps=10))


def test_release_rule_refuses_below_k():
    rule = ReleaseRule(min_clients=3)
    with pytest.raises(ReleaseRefused, match="only 2 client.*at least 3"):
        rule.check(["c1", "c2"])
    with pytest.raises(ReleaseRefused, match="global graph"):
        rule.check(["c1", "c1", "c2", "c2"], what="global graph")  # repeats do not count
    rule.check(["c1", "c2", "c3"])  # enough: no exception
    assert issubclass(ReleaseRefused, UserError)  # the CLI prints it as one line, exit 2
    with pytest.raises(UserError, match="min-clients"):
        ReleaseRule(min_clients=0)


def test_sample_counts():
    assert sample_counts([5, 5, 5], 10) == [4, 3, 3]
    assert sum(sample_counts([1, 2, 7], 1001, proportional=True)) == 1001
    assert sample_counts([100, 300], 400, proportional=True) == [100, 300]
    with pytest.raises(UserError, match="client 1"):
        sample_counts([3, 0], 10, proportional=True)


@pytest.fixture(scope="module")
def clients(chain_model, chain_train):
    """Two clients on the chain: the shared chain model (1500 rows) and one that over-represents
    large c (a shifted segment, 600 rows)."""
    big = chain_data(3000, seed=11)
    x2 = np.concatenate([big[big[:, 2] > 0.5][:400], big[:200]])
    return [chain_model, fit_ngm(x2, CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(16, 16), config=TINY)], (chain_train, x2)


def test_global_model_distils_the_clients(clients, chain_test):
    models, _ = clients
    glob, counts = distill_global(models, CHAIN_GRAPH, 800, hidden=(16, 16), config=GLOBAL)
    assert counts == [400, 400]
    assert glob.n_parameters() == models[0].n_parameters()  # size independent of the client count
    off, on = glob.path_norm_split()
    assert off < 0.05 * on
    pred = predict_feature(glob, chain_test, "b")
    assert np.mean((pred - chain_test[:, 1]) ** 2) < 0.5  # marginal variance ~1, optimum 0.22
    _, prop = distill_global(models, CHAIN_GRAPH, 100, proportional=True, hidden=(4,),
                             config=TrainConfig(epochs=1, calib_rows=0))
    assert prop == [71, 29]  # 1500 and 600 rows


def test_public_data_term_is_used(clients, chain_test):
    models, _ = clients
    cfg = TrainConfig(epochs=1, batch_size=128, seed=0, calib_rows=0)  # one epoch shows the term acts
    a, _ = distill_global(models, CHAIN_GRAPH, 300, hidden=(8,), config=cfg)
    b, _ = distill_global(models, CHAIN_GRAPH, 300, hidden=(8,), config=cfg, public=chain_test[:300])
    assert not torch.equal(a.net.layers[0].weight, b.net.layers[0].weight)


def test_global_model_rejects_mismatched_clients(clients):
    models, _ = clients
    other = fit_ngm(np.zeros((10, 1)) + np.arange(10)[:, None], Schema((real("a"),)),
                    DependencyGraph.from_edges("a", []), hidden=(2,), config=TrainConfig(epochs=1, calib_rows=0))
    with pytest.raises(UserError, match="client 1"):
        distill_global([models[0], other], CHAIN_GRAPH, 10)


def test_stitching_keeps_global_weights_bit_identical(clients):
    models, (x1, _) = clients
    glob = models[1]
    frozen = [(layer.weight.detach().clone(), layer.bias.detach().clone()) for layer in glob.net.layers]
    # The client also holds e = 2c + noise and a binary f driven by e.
    rng = np.random.default_rng(0)
    e = 2.0 * x1[:, 2] + 0.3 * rng.standard_normal(len(x1))
    f = (e + rng.standard_normal(len(x1)) > 0).astype(float)
    client_schema = Schema((real("e"),) + CHAIN_SCHEMA.features + (categorical("f", 2),))
    xc = np.column_stack([e, x1, f])
    client_graph = DependencyGraph.from_edges(client_schema.names,
                                              [("a", "b"), ("b", "c"), ("c", "d"), ("c", "e"), ("e", "f")])
    st = stitch(glob, client_schema, client_graph, extra_hidden=6, seed=1)
    assert st.schema.names == ("a", "b", "c", "d", "e", "f")
    assert st.graph.edges() == CHAIN_GRAPH.edges() | {frozenset("ce"), frozenset("ef")}
    xs = to_stitched_columns(xc, client_schema, st)
    u = st.encode(xs)
    with torch.no_grad():  # new R blocks start at zero: the old outputs are unchanged at first
        assert torch.allclose(st.forward(u)[:, :6], glob.forward(glob.encode(xs[:, :4])), atol=1e-6)
    # Half the rows train (e and f are simple functions of c); all rows are scored below.
    train_stitched(st, xs[: len(xs) // 2], TINY)
    for layer, (w, b) in zip(st.net.layers, frozen):
        assert torch.equal(layer.frozen_w, w) and torch.equal(layer.frozen_b, b)
        o, i = w.shape
        assert torch.equal(layer.weight[:o, :i], w)
    # The original global model object is untouched as well.
    for layer, (w, b) in zip(glob.net.layers, frozen):
        assert torch.equal(layer.weight, w)
    pred_e = predict_feature(st, xs, "e")
    assert np.mean((pred_e - e) ** 2) < 0.25 * e.var()
    off, on = st.path_norm_split()
    assert off < 0.1 * on


def test_stitching_rejects_a_client_without_the_global_features(clients):
    models, _ = clients
    s = Schema((real("a"), real("b"), real("e")))
    with pytest.raises(UserError, match="'c'"):
        stitch(models[0], s, DependencyGraph.from_edges(s.names, []))
