"""Single-process evaluation of a federated circuit: the reference every distributed pass must match.

Node values are log-values (nats) of shape ``(batch, m)``: ``m = 1`` for an ordinary query and
``m = n_classes`` for nodes whose scope holds the target when a conditional is asked for all classes
at once (only those nodes carry the class axis; the rest broadcast). The runtime reuses
:func:`leaf_values` and :func:`combine` so that both paths do the same arithmetic in the same order.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.structure import AVERAGE, LEAF, PRODUCT, SUM, FederatedCircuit, Node

if TYPE_CHECKING:
    import torch

Columns = dict[str, np.ndarray]


# torch and scipy are imported on first use only: an MPI rank that evaluates numpy leaves
# (factorised, decision trees) or combines no sums pays for neither at start-up.
def logsumexp(a: Any, **kwargs: Any) -> Any:
    """:func:`scipy.special.logsumexp`, imported on first call."""
    from scipy.special import logsumexp as _logsumexp

    return _logsumexp(a, **kwargs)


@dataclass(frozen=True)
class Query:
    """What an upward pass computes.

    Attributes:
        expand_target: if set, nodes whose scope holds this (discrete) feature return one column
            per category ``0..n_classes-1`` with the feature set to that category.
        n_classes: number of categories of ``expand_target``.
    """

    expand_target: str | None = None
    n_classes: int = 1


def as_columns(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray,
               features: tuple[str, ...] | None = None) -> Columns:
    """Normalise input to ``{feature: (batch,) float64}``.

    Args:
        x: a mapping feature → values, or an array ``(batch, len(features))``.
        features: column names of an array ``x`` (default: ``fc.features``).
    """
    if isinstance(x, Mapping):
        cols = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in x.items()}
    else:
        arr = np.asarray(x, dtype=np.float64)
        names = features or fc.features
        if arr.ndim != 2 or arr.shape[1] != len(names):
            raise UserError(f"input has shape {arr.shape}, expected (batch, {len(names)}) over {list(names)}")
        cols = {f: arr[:, j] for j, f in enumerate(names)}
    lens = {len(v) for v in cols.values()}
    if len(lens) > 1:
        raise UserError(f"input columns have different lengths {sorted(lens)}")
    return cols


def batch_size(cols: Columns) -> int:
    return len(next(iter(cols.values()))) if cols else 0


def leaf_input(node: Node, cols: Columns) -> np.ndarray:
    """The leaf PC's input ``(batch, d)`` in its training column order; absent features are NaN."""
    n = batch_size(cols)
    out = np.full((n, len(node.leaf.features)), np.nan)
    for j, f in enumerate(node.leaf.features):
        if f in cols:
            out[:, j] = cols[f]
    return out


def _to_numpy(v: torch.Tensor | np.ndarray) -> np.ndarray:
    torch = sys.modules.get("torch")  # not imported yet: v cannot be a tensor
    if torch is not None and isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    return np.asarray(v, dtype=np.float64).reshape(-1)


def _model_ll(model: Any, x: np.ndarray) -> np.ndarray:
    """``model.log_likelihood(x)`` as float64 ``(n,)``; a model's ``log_likelihood_numpy`` (the
    same values without a torch round trip) is used when it has one."""
    fast = getattr(model, "log_likelihood_numpy", None)
    return _to_numpy(fast(x) if fast is not None else model.log_likelihood(x))


def leaf_values(node: Node, cols: Columns, query: Query = Query()) -> np.ndarray:
    """Log-value of one leaf PC, ``(batch, m)`` nats."""
    model = node.leaf.model
    if model is None:
        raise UserError(f"leaf node {node.id} (client {node.leaf.client}) has no model on this rank")
    x = leaf_input(node, cols)
    t = query.expand_target
    if t is None or t not in node.leaf.features:
        return _model_ll(model, x).reshape(-1, 1)
    j = node.leaf.features.index(t)
    n, k = x.shape[0], query.n_classes
    rep = np.repeat(x, k, axis=0)
    rep[:, j] = np.tile(np.arange(k, dtype=np.float64), n)
    return _model_ll(model, rep).reshape(n, k)


def combine(node: Node, child_values: list[np.ndarray]) -> np.ndarray:
    """ω of an inner node on log-values, ``(batch, m)`` from children ``(batch, m_i)``."""
    m = max(v.shape[1] for v in child_values)
    b = child_values[0].shape[0]
    if node.op == PRODUCT:
        out = np.zeros((b, m))
        for v in child_values:
            out = out + v
        return out
    stacked = np.stack([np.broadcast_to(v, (b, m)) for v in child_values], axis=0)
    if node.op == SUM:
        with np.errstate(divide="ignore"):
            logw = np.log(node.weights)
        return logsumexp(stacked + logw[:, None, None], axis=0)
    if node.op == AVERAGE:
        return logsumexp(stacked, axis=0) - np.log(len(child_values))
    raise ValueError(f"node {node.id}: cannot combine op {node.op!r}")


def upward(fc: FederatedCircuit, cols: Columns, query: Query = Query(),
           leaf_fn: Callable[[Node, Columns, Query], np.ndarray] = leaf_values) -> dict[int, np.ndarray]:
    """Values of every node reachable from the root, ``{id: (batch, m)}`` log-values."""
    values: dict[int, np.ndarray] = {}
    for nid in fc.reachable():
        n = fc.nodes[nid]
        if n.op == LEAF:
            values[nid] = leaf_fn(n, cols, query)
        else:
            values[nid] = combine(n, [values[c] for c in n.children])
    return values


def log_likelihood(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray) -> np.ndarray:
    """``log p(x)`` per sample, ``(batch,)`` nats; NaN (or absent) features are marginalised."""
    cols = as_columns(fc, x)
    return upward(fc, cols)[fc.root][:, 0]


def class_log_joint(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray,
                    target: str | None = None) -> np.ndarray:
    """``log p(target = c, evidence)`` for every class ``c``, ``(batch, n_classes)`` nats."""
    target = target or fc.target
    k = _n_classes(fc, target)
    cols = as_columns(fc, x)
    return upward(fc, cols, Query(target, k))[fc.root]


def predict_log_proba(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray,
                      target: str | None = None) -> np.ndarray:
    """``log p(target = c | evidence)``, ``(batch, n_classes)``; the target column is ignored."""
    joint = class_log_joint(fc, x, target)
    return joint - logsumexp(joint, axis=1, keepdims=True)


def predict(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray,
            target: str | None = None) -> np.ndarray:
    """Most probable class per sample, ``(batch,)`` int64."""
    return np.argmax(class_log_joint(fc, x, target), axis=1).astype(np.int64)


def _n_classes(fc: FederatedCircuit, target: str | None) -> int:
    if target is None:
        raise UserError("no target feature: the manifest names none and none was given")
    if target not in fc.features:
        raise UserError(f"target {target!r} is not a feature of the circuit")
    k = int(fc.n_categories.get(target, 0))
    if k < 2:
        raise UserError(f"target {target!r} is not discrete (n_categories={k}); conditionals need classes")
    return k


def mpe(fc: FederatedCircuit, x: Mapping[str, np.ndarray] | np.ndarray) -> np.ndarray:
    """Most probable completion (max-product), ``(batch, n_features)`` in ``fc.features`` order.

    Sums take the best weighted child; a leaf's max-value is its log-likelihood at its own MPE
    completion. Observed (non-NaN) entries are returned unchanged.
    """
    cols = as_columns(fc, x)
    n = batch_size(cols)
    completions: dict[int, np.ndarray] = {}
    values: dict[int, np.ndarray] = {}
    for nid in fc.reachable():
        node = fc.nodes[nid]
        if node.op == LEAF:
            xi = leaf_input(node, cols)
            comp = np.asarray(node.leaf.model.mpe(xi), dtype=np.float64)
            completions[nid] = comp
            values[nid] = _model_ll(node.leaf.model, comp)
        elif node.op == PRODUCT:
            values[nid] = np.sum([values[c] for c in node.children], axis=0)
        elif node.op == SUM:
            with np.errstate(divide="ignore"):
                stacked = np.stack([values[c] for c in node.children]) + np.log(node.weights)[:, None]
            values[nid] = stacked.max(axis=0)
        else:
            raise UserError(f"MPE is not defined for {node.op} node {nid}")
    out = np.full((n, len(fc.features)), np.nan)
    col = {f: j for j, f in enumerate(fc.features)}
    # Top-down: route each sample along its arg-max induced tree.
    routed: dict[int, np.ndarray] = {fc.root: np.arange(n)}
    for nid in reversed(fc.reachable()):
        idx = routed.pop(nid, None)
        if idx is None or len(idx) == 0:
            continue
        node = fc.nodes[nid]
        if node.op == LEAF:
            for j, f in enumerate(node.leaf.features):
                out[idx, col[f]] = completions[nid][idx, j]
        elif node.op == PRODUCT:
            for c in node.children:
                routed[c] = np.union1d(routed.get(c, np.zeros(0, dtype=np.int64)), idx)
        else:
            with np.errstate(divide="ignore"):
                scores = np.stack([values[c][idx] for c in node.children]) + np.log(node.weights)[:, None]
            best = np.argmax(scores, axis=0)
            for i, c in enumerate(node.children):
                sel = idx[best == i]
                if len(sel):
                    routed[c] = np.union1d(routed.get(c, np.zeros(0, dtype=np.int64)), sel)
    observed = np.stack([cols.get(f, np.full(n, np.nan)) for f in fc.features], axis=1)
    return np.where(np.isnan(observed), out, observed)


def sample(fc: FederatedCircuit, n: int, rng: np.random.Generator,
           evidence: Mapping[str, np.ndarray] | np.ndarray | None = None) -> np.ndarray:
    """Ancestral samples ``(n, n_features)``; with evidence, from the conditional given it.

    At a sum, a sample picks child ``i`` with probability ``∝ w_i · p_i(evidence)`` (the exact
    posterior over the latent sum choice), so conditioning is exact for valid FedPCs.
    """
    if evidence is None:
        cols = {f: np.full(n, np.nan) for f in fc.features}
    else:
        cols = as_columns(fc, evidence)
        if batch_size(cols) != n:
            raise UserError(f"evidence has {batch_size(cols)} rows, expected {n}")
    values = upward(fc, cols)
    out = np.full((n, len(fc.features)), np.nan)
    col = {f: j for j, f in enumerate(fc.features)}
    routed: dict[int, list[np.ndarray]] = {fc.root: [np.arange(n)]}
    for nid in reversed(fc.reachable()):
        parts = routed.pop(nid, None)
        if not parts:
            continue
        idx = np.sort(np.concatenate(parts))
        if len(idx) == 0:
            continue
        node = fc.nodes[nid]
        if node.op == LEAF:
            ev = leaf_input(node, {k: v[idx] for k, v in cols.items()})
            s = np.asarray(node.leaf.model.sample(len(idx), rng, evidence=ev), dtype=np.float64)
            for j, f in enumerate(node.leaf.features):
                out[idx, col[f]] = s[:, j]
        elif node.op == PRODUCT:
            for c in node.children:
                routed.setdefault(c, []).append(idx)
        else:
            w = node.weights if node.op == SUM else np.full(len(node.children), 1.0 / len(node.children))
            with np.errstate(divide="ignore"):
                logits = np.stack([values[c][idx, 0] for c in node.children], axis=1) + np.log(w)
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            u = rng.random(len(idx))
            choice = np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), len(node.children) - 1)
            for i, c in enumerate(node.children):
                sel = idx[choice == i]
                if len(sel):
                    routed.setdefault(c, []).append(sel)
    return out
