"""Neural Graph Revealer: the path sparsity reveals the chain without an input graph."""
from __future__ import annotations

import torch

from mpifc.ngm.ngr import fit_ngr, revealed_graph

from .conftest import CHAIN_GRAPH, CHAIN_SCHEMA, SMALL


def test_ngr_reveals_the_chain(chain_train):
    model = fit_ngr(chain_train, CHAIN_SCHEMA, hidden=(16, 16), config=SMALL, sparsity=0.01)
    assert revealed_graph(model, threshold=0.1).edges() == CHAIN_GRAPH.edges()
    with torch.no_grad():
        p = model.net.path_matrix()
    # No feature predicts itself: the self paths are a small part of all paths.
    assert float((p * model.penalty_mask()).sum()) < 0.05 * float(p.sum())
