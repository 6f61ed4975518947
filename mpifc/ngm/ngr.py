"""Neural Graph Revealer (NGR, paper eqs. 4-5): no input graph; path sparsity reveals one.

An NGR is an NGM trained on the complete graph (so only self paths are forbidden) with an extra
l1 term on the feature-level path matrix, which drives most paths to zero. The surviving
paths, made symmetric, are the revealed dependency graph.

Eq. 5 optionally scales the structure terms by ``log``; we do not: the gradient of
``log(1 + s)`` fades as ``1 / (1 + s)``, and on our tests the self paths then won over the
penalty (the network learned to copy its inputs). Loss: ``fit + lam * ||P * I||_1 +
sparsity * ||sym(P) - diag||_1`` at feature level.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.model import NGM
from mpifc.ngm.schema import Schema
from mpifc.ngm.training import TrainConfig, train


def complete_graph(names: Sequence[str]) -> DependencyGraph:
    d = len(names)
    return DependencyGraph(tuple(names), ~np.eye(d, dtype=bool))


def _feature_paths(model: NGM) -> torch.Tensor:
    """``(d, d)`` differentiable feature-level path matrix (sum over each feature's units)."""
    owner = torch.as_tensor(model.schema.unit_owner())
    d = model.schema.n_features
    onehot = torch.nn.functional.one_hot(owner, d).to(model.net.path_matrix().dtype)  # (units, d)
    return onehot.T @ model.net.path_matrix() @ onehot


def fit_ngr(x: np.ndarray, schema: Schema, hidden: Sequence[int] = (32, 32), activation: str = "elu",
            config: TrainConfig = TrainConfig(), sparsity: float = 0.01) -> NGM:
    """Train an NGR on ``x`` ``(n, d)``.

    Args:
        sparsity: weight of the (log-scaled) l1 term on the symmetric path matrix; the self-path
            term uses ``config.lam``.
    """
    if sparsity < 0:
        raise UserError(f"NGR: sparsity must be >= 0, got {sparsity}")
    model = NGM.create(schema, complete_graph(schema.names), hidden, activation, seed=config.seed)

    lam = max(config.lam, 1e-12)

    def penalty() -> torch.Tensor:  # train() multiplies by lam
        p = _feature_paths(model)
        self_paths = torch.diagonal(p).sum()
        off_diagonal = (p + p.T).sum() - 2.0 * self_paths
        return self_paths + (sparsity / lam) * off_diagonal

    train(model, x, config, penalty=penalty, init_output_bias=False)
    return model


def revealed_graph(model: NGM, threshold: float = 0.1) -> DependencyGraph:
    """The graph an NGR's paths reveal.

    Args:
        threshold: an edge where the symmetric feature path strength exceeds ``threshold`` times
            the strongest off-diagonal one.
    """
    with torch.no_grad():
        p = _feature_paths(model).numpy().astype(np.float64)
    sym = p + p.T
    np.fill_diagonal(sym, 0.0)
    top = sym.max()
    adj = sym > threshold * top if top > 0 else np.zeros_like(sym, dtype=bool)
    return DependencyGraph(model.schema.names, adj)
