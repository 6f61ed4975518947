"""Local sparse graph recovery on one client's data (the client sends only the graph).

Default method: scikit-learn's graphical lasso on the standardised, one-hot-expanded features.
A feature pair gets an edge when any pair of their expanded columns has a nonzero partial
correlation in the recovered precision matrix.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
from sklearn.covariance import graphical_lasso
from sklearn.exceptions import ConvergenceWarning

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.schema import Schema


def expand_for_recovery(x: np.ndarray, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """One-hot expand and standardise ``x`` for graph recovery.

    A categorical with ``k`` values contributes ``k - 1`` indicator columns (the last value is the
    reference, since all ``k`` indicators sum to one and would make the covariance singular).
    Constant columns are dropped: they carry no dependency and would divide by zero.

    Args:
        x: ``(n, d)`` validated data.
        schema: the ``d`` features.

    Returns:
        ``(z, owner)``: ``z`` is ``(n, m)`` standardised columns, ``owner`` ``(m,)`` the feature
        index of each column.
    """
    cols, owner = [], []
    for j, f in enumerate(schema.features):
        if f.is_categorical:
            codes = x[:, j].astype(np.int64)
            for c in range(f.n_categories - 1):
                cols.append((codes == c).astype(np.float64))
                owner.append(j)
        else:
            cols.append(x[:, j])
            owner.append(j)
    z = np.stack(cols, axis=1) if cols else np.zeros((x.shape[0], 0))
    sd = z.std(axis=0)
    keep = sd > 1e-12 * np.maximum(1.0, np.abs(z).max(axis=0))
    z = (z[:, keep] - z[:, keep].mean(axis=0)) / sd[keep]
    return z, np.asarray(owner, dtype=np.int64)[keep]


def recover_graph(x: np.ndarray, schema: Schema, alpha: float = 0.05, tol: float = 0.02,
                  max_iter: int = 200) -> DependencyGraph:
    """Sparse dependency graph of one client's data by the graphical lasso.

    Args:
        x: ``(n, d)`` data, no NaN.
        schema: the ``d`` features.
        alpha: l1 penalty of the graphical lasso on the correlation matrix; larger = sparser.
        tol: an absolute partial correlation above ``tol`` counts as an edge. Not 0: the lasso
            shrinks true edges and leaves small compensating entries elsewhere (e.g. between
            the ends of a chain), which are not dependencies.
        max_iter: graphical lasso iterations.

    Returns:
        Graph over ``schema.names``.
    """
    if alpha <= 0:
        raise UserError(f"graph recovery: alpha must be > 0, got {alpha}")
    x = schema.validate(x, what="graph recovery data")
    if x.shape[0] < 2:
        raise UserError(f"graph recovery: needs at least 2 rows, got {x.shape[0]}")
    z, owner = expand_for_recovery(x, schema)
    d = schema.n_features
    adj = np.zeros((d, d), dtype=bool)
    if z.shape[1] < 2:
        return DependencyGraph(schema.names, adj)
    cov = (z.T @ z) / z.shape[0]
    precision = _glasso_with_fallback(cov, alpha, max_iter)
    dg = np.sqrt(np.diag(precision))
    partial = np.abs(precision) / np.outer(dg, dg)
    hit = partial > tol
    np.fill_diagonal(hit, False)
    a, b = np.nonzero(hit)
    adj[owner[a], owner[b]] = True
    adj |= adj.T
    np.fill_diagonal(adj, False)  # two indicator columns of one categorical are not a self loop
    return DependencyGraph(schema.names, adj)


def _glasso_with_fallback(cov: np.ndarray, alpha: float, max_iter: int) -> np.ndarray:
    """Graphical lasso precision; shrinks the covariance towards the identity when the solver breaks down.

    Near-collinear indicator columns can make coordinate descent fail on the raw correlation
    matrix; a little shrinkage keeps it positive definite without changing the sparsity much.
    """
    for shrink in (0.0, 0.01, 0.05, 0.2):
        c = (1.0 - shrink) * cov + shrink * np.eye(cov.shape[0])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                _, prec = graphical_lasso(c, alpha=alpha, max_iter=max_iter)
            if np.isfinite(prec).all():
                return prec
        except FloatingPointError:
            continue
    raise UserError(f"graph recovery: the graphical lasso did not converge even with shrinkage; "
                    f"try a larger alpha than {alpha}")


def expert_graph(names: Sequence[str], adjacency: np.ndarray, symmetrize: bool = False) -> DependencyGraph:
    """A graph given by an expert as a ``(d, d)`` 0/1 adjacency over ``names``.

    The diagonal is ignored (no self loops). With ``symmetrize`` a directed adjacency (e.g. a
    Bayesian network's) is turned into its undirected skeleton; otherwise it must be symmetric.
    """
    a = np.asarray(adjacency)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise UserError(f"expert graph: adjacency must be square, got shape {a.shape}")
    if not np.isin(a, (0, 1)).all():
        raise UserError("expert graph: adjacency entries must be 0/1 or boolean")
    a = a.astype(bool)
    if symmetrize:
        a = a | a.T
    a = a.copy()
    np.fill_diagonal(a, False)
    return DependencyGraph(tuple(names), a)
