"""The NGM: graph-constrained path norm (eq. 1), training, determinism, transport."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.model import NGM
from mpifc.ngm.schema import Schema, categorical, real
from mpifc.ngm.training import TrainConfig, fit_ngm, train

from .conftest import CHAIN_GRAPH, CHAIN_SCHEMA


def graph_respecting_model(schema: Schema, graph: DependencyGraph, per_feature: int = 3, seed: int = 0) -> NGM:
    """An NGM whose weights route every path along a graph edge.

    Each feature owns ``per_feature`` units in both hidden layers. First layer: a unit of
    feature ``o`` reads only the inputs of ``o``'s neighbours; second layer: only units of the
    same owner; last layer: output ``o`` reads only its own hidden units.
    """
    d = schema.n_features
    h = per_feature * d
    model = NGM.create(schema, graph, hidden=(h, h), seed=seed)
    rng = np.random.default_rng(seed)
    hid_owner = np.repeat(np.arange(d), per_feature)
    unit_owner = schema.unit_owner()
    adj = graph.adjacency
    masks = [adj[np.ix_(hid_owner, unit_owner)],
             hid_owner[:, None] == hid_owner[None, :],
             unit_owner[:, None] == hid_owner[None, :]]
    with torch.no_grad():
        for layer, mask in zip(model.net.layers, masks):
            w = rng.uniform(0.5, 1.5, mask.shape) * rng.choice([-1, 1], mask.shape) * mask
            layer.w_bottom.copy_(torch.as_tensor(w))
    return model


def test_path_norm_is_zero_iff_weights_respect_the_graph():
    schema = Schema((real("a"), categorical("k", 3), real("b"), real("c")))
    graph = DependencyGraph.from_edges(schema.names, [("a", "k"), ("k", "b")])
    model = graph_respecting_model(schema, graph)
    off, on = model.path_norm_split()
    assert off == 0.0 and on > 1.0
    assert float(model.path_norm().detach()) == 0.0
    # One weight from input c (not adjacent to anything) into a hidden unit of feature a opens
    # the forbidden path c -> a.
    with torch.no_grad():
        model.net.layers[0].w_bottom[0, schema.n_units - 1] = 0.7
    assert float(model.path_norm().detach()) > 0.0
    dep = model.feature_dependence()
    assert dep[schema.index("a"), schema.index("c")] > 0


def test_self_paths_are_forbidden():
    schema = Schema((real("a"), real("b")))
    graph = DependencyGraph.from_edges(schema.names, [("a", "b")])
    model = graph_respecting_model(schema, graph)
    with torch.no_grad():
        # A hidden unit of a that also reads input a: a path a -> a.
        model.net.layers[0].w_bottom[0, 0] = 1.0
    assert float(model.path_norm().detach()) > 0.0


def test_fresh_network_violates_the_graph():
    model = NGM.create(CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(8, 8))
    off, on = model.path_norm_split()
    assert off > on  # a dense random MLP connects everything, most of it forbidden


def test_trained_paths_respect_the_graph(chain_model):
    off, on = chain_model.path_norm_split()
    assert off < 0.05 * on
    dep = chain_model.feature_dependence()
    dep = dep / dep.max()
    # Each output's strongest input is one of its neighbours, never itself.
    for o, name in enumerate(CHAIN_SCHEMA.names):
        allowed = set(CHAIN_GRAPH.neighbours(name))
        assert CHAIN_SCHEMA.names[int(np.argmax(dep[o]))] in allowed
        assert dep[o, o] < 0.05


def test_same_seed_same_model_and_no_nan(chain_train):
    cfg = TrainConfig(epochs=2, batch_size=256, seed=3, calib_rows=0)
    m1 = fit_ngm(chain_train[:400], CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(8,), config=cfg)
    m2 = fit_ngm(chain_train[:400], CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(8,), config=cfg)
    for l1, l2 in zip(m1.net.layers, m2.net.layers):
        assert torch.equal(l1.weight, l2.weight) and torch.equal(l1.bias, l2.bias)
        assert torch.isfinite(l1.weight).all()
    m3 = fit_ngm(chain_train[:400], CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(8,),
                 config=TrainConfig(epochs=2, batch_size=256, seed=4, calib_rows=0))
    assert not torch.equal(m1.net.layers[0].weight, m3.net.layers[0].weight)


def test_constant_feature_trains_without_nan():
    rng = np.random.default_rng(0)
    x = np.stack([rng.standard_normal(200), np.full(200, 7.0), np.zeros(200)], 1)
    schema = Schema((real("a"), real("const"), categorical("k", 2)))
    g = DependencyGraph.from_edges(schema.names, [("a", "const"), ("const", "k")])
    history = train(NGM.create(schema, g, hidden=(4,)), x, TrainConfig(epochs=2, calib_rows=50))
    assert np.isfinite(history).all()


def test_bad_training_data_names_the_feature(chain_train):
    x = chain_train[:50].copy()
    x[3, 2] = np.nan
    with pytest.raises(UserError, match="'c'"):
        fit_ngm(x, CHAIN_SCHEMA, CHAIN_GRAPH, config=TrainConfig(epochs=1))
    x = chain_train[:50].copy()
    x[0, 3] = 3.0
    with pytest.raises(UserError, match="'d'"):
        fit_ngm(x, CHAIN_SCHEMA, CHAIN_GRAPH, config=TrainConfig(epochs=1))
    with pytest.raises(UserError, match="graph features"):
        NGM.create(CHAIN_SCHEMA, DependencyGraph.from_edges("abcz", []))
    with pytest.raises(UserError, match="lam"):
        TrainConfig(lam=-1.0)


def test_payload_round_trip_gives_the_same_function(chain_model, chain_test):
    meta, arrays = chain_model.to_payload()
    copy = NGM.from_payload(meta, arrays)
    u = chain_model.encode(chain_test)
    with torch.no_grad():
        assert torch.equal(chain_model.forward(u), copy.forward(u))
    assert copy.calibration.order == chain_model.calibration.order
    assert chain_model.payload_nbytes() > chain_model.n_parameters() * 4
