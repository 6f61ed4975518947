"""MPE and sampling on a federated circuit, split into the per-node steps a distributed pass needs.

Both queries are an upward pass (MPE only) and a downward pass of per-sample *decisions*: the
boolean mask of samples whose induced tree contains a node. The root is active for every sample;
a product passes its mask to every child; a sum passes each sample to ONE child: the arg-max of
``log w_i + v_i`` (MPE, first index on ties, as :func:`mpifc.federated.evaluate.mpe`) or a
sampled child (sampling). Each leaf then completes (MPE) or samples its features for its active
samples only. A node active through several parents takes the union of their masks.

Sampling uses one random stream per node and batch, ``default_rng([seed, batch_index, node_id])``,
so the draws do not depend on which rank evaluates a node (ψ): the distributed sampler
(:mod:`mpifc.fedpc.mpe`) equals :func:`sample_seeded` exactly. A sum draws one uniform per
sample of the batch (used only where the sample is active); a leaf draws ``model.sample(k, rng)``
for its ``k`` active samples in ascending sample order. Unconditional sampling needs no upward
pass: with no evidence every node's value is ``log 1``, so a sum picks child ``i`` with
probability ``w_i``.

Single-process references: :func:`mpe_reference` (must equal ``evaluate.mpe``) and
:func:`sample_seeded`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.evaluate import Columns, _model_ll, batch_size, leaf_input
from mpifc.federated.structure import LEAF, PRODUCT, SUM, FederatedCircuit, Node


# -- MPE -------------------------------------------------------------------------------------
def leaf_mpe(node: Node, cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """A leaf's MPE completion ``(batch, d_leaf)`` and its log-value there ``(batch,)``."""
    model = node.leaf.model
    if model is None:
        raise UserError(f"leaf node {node.id} (client {node.leaf.client}) has no model on this rank")
    comp = np.asarray(model.mpe(leaf_input(node, cols)), dtype=np.float64)
    return comp, _model_ll(model, comp)


def max_combine(node: Node, child_values: list[np.ndarray]) -> np.ndarray:
    """Max-product value of an inner node ``(batch,)`` from its children's ``(batch,)``."""
    if node.op == PRODUCT:
        return np.sum(child_values, axis=0)
    if node.op == SUM:
        with np.errstate(divide="ignore"):
            stacked = np.stack(child_values) + np.log(node.weights)[:, None]
        return stacked.max(axis=0)
    raise UserError(f"MPE is not defined for {node.op} node {node.id}")


def mpe_route(node: Node, child_values: list[np.ndarray], active: np.ndarray) -> list[np.ndarray]:
    """Per child, the mask of ``node``'s active samples its arg-max sends there."""
    if node.op == PRODUCT:
        return [active for _ in node.children]
    if node.op != SUM:
        raise UserError(f"MPE is not defined for {node.op} node {node.id}")
    with np.errstate(divide="ignore"):
        scores = np.stack(child_values) + np.log(node.weights)[:, None]
    best = np.argmax(scores, axis=0)
    return [active & (best == i) for i in range(len(node.children))]


# -- sampling --------------------------------------------------------------------------------
def node_rng(seed: int, batch_index: int, nid: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(batch_index), int(nid)])


def sample_route(node: Node, active: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Per child, the mask of ``node``'s active samples that choose it (unconditional)."""
    if node.op == PRODUCT:
        return [active for _ in node.children]
    if node.op != SUM:
        raise UserError(f"sampling is not defined for {node.op} node {node.id}")
    u = rng.random(len(active))
    k = len(node.children)
    choice = np.minimum((np.cumsum(node.weights)[None, :] < u[:, None]).sum(axis=1), k - 1)
    return [active & (choice == i) for i in range(k)]


def conditional_route(node: Node, child_values: list[np.ndarray], active: np.ndarray,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """Per child, the mask of ``node``'s active samples that choose it given the evidence: a sum
    picks child ``i`` with probability ``∝ w_i · p_i(evidence)`` (the exact posterior of its
    latent choice), from one uniform per sample of the batch. ``child_values`` are the children's
    ``(batch,)`` or ``(batch, 1)`` log-values of the upward pass."""
    if node.op == PRODUCT:
        return [active for _ in node.children]
    if node.op != SUM:
        raise UserError(f"sampling is not defined for {node.op} node {node.id}")
    u = rng.random(len(active))
    with np.errstate(divide="ignore"):
        logits = np.stack([np.asarray(v).reshape(-1) for v in child_values], axis=1) + np.log(node.weights)
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    k = len(node.children)
    choice = np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), k - 1)
    return [active & (choice == i) for i in range(k)]


def leaf_sample_given(node: Node, active: np.ndarray, rng: np.random.Generator, cols: Columns | None) -> np.ndarray:
    """Samples ``(n_active, d_leaf)`` of a leaf for its active samples (ascending order) from its
    conditional given their evidence in ``cols`` (observed entries are kept); ``cols`` None:
    unconditional samples."""
    k = int(active.sum())
    if k == 0:
        return np.zeros((0, len(node.leaf.features)))
    model = node.leaf.model
    if model is None:
        raise UserError(f"leaf node {node.id} (client {node.leaf.client}) has no model on this rank")
    kw = {} if cols is None else {"evidence": leaf_input(node, cols)[active]}
    return np.asarray(model.sample(k, rng, **kw), dtype=np.float64).reshape(k, len(node.leaf.features))


def leaf_sample(node: Node, active: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Samples ``(n_active, d_leaf)`` of a leaf for its active samples (ascending order)."""
    return leaf_sample_given(node, active, rng, None)


# -- shared downward pass (one process) --------------------------------------------------------
def route_down(fc: FederatedCircuit, nodes: list[int], active: dict[int, np.ndarray],
               route: Callable[[Node, np.ndarray], list[np.ndarray]]) -> None:
    """Push the masks of ``nodes`` (processed parents first) into their children, in place."""
    for nid in sorted(nodes, reverse=True):
        node = fc.nodes[nid]
        if node.op == LEAF or nid not in active:
            continue
        for c, m in zip(node.children, route(node, active[nid])):
            active[c] = active[c] | m if c in active else m.copy()


def write_leaf(out: np.ndarray, node: Node, col: dict[str, int], active: np.ndarray, part: np.ndarray,
               rows_are_active: bool) -> None:
    """Write a leaf's values into ``out`` ``(batch, n_cols)`` for its active samples."""
    idx = np.flatnonzero(active)
    if not len(idx):
        return
    vals = part if rows_are_active else part[idx]
    for j, f in enumerate(node.leaf.features):
        if f in col:
            out[idx, col[f]] = vals[:, j]


def mpe_reference(fc: FederatedCircuit, cols: Columns) -> np.ndarray:
    """Single-process MPE ``(batch, n_features)`` by the same steps as the distributed pass."""
    n = batch_size(cols)
    values: dict[int, np.ndarray] = {}
    comps: dict[int, np.ndarray] = {}
    nodes = fc.reachable()
    for nid in nodes:
        node = fc.nodes[nid]
        if node.op == LEAF:
            comps[nid], values[nid] = leaf_mpe(node, cols)
        else:
            values[nid] = max_combine(node, [values[c] for c in node.children])
    active = {fc.root: np.ones(n, dtype=bool)}
    route_down(fc, nodes, active, lambda node, a: mpe_route(node, [values[c] for c in node.children], a))
    col = {f: j for j, f in enumerate(fc.features)}
    out = np.full((n, len(fc.features)), np.nan)
    for nid in nodes:
        if fc.nodes[nid].op == LEAF and nid in active:
            write_leaf(out, fc.nodes[nid], col, active[nid], comps[nid], rows_are_active=False)
    observed = np.stack([cols.get(f, np.full(n, np.nan)) for f in fc.features], axis=1)
    return np.where(np.isnan(observed), out, observed)


def sample_seeded(fc: FederatedCircuit, n: int, seed: int, batch: int = 10_000) -> np.ndarray:
    """Single-process unconditional samples ``(n, n_features)`` with per-node streams (see the
    module docstring); equals the distributed sampler for the same ``seed`` and ``batch``."""
    col = {f: j for j, f in enumerate(fc.features)}
    out = np.full((n, len(fc.features)), np.nan)
    nodes = fc.reachable()
    for b, lo in enumerate(range(0, n, max(batch, 1))):
        hi = min(lo + batch, n)
        active = {fc.root: np.ones(hi - lo, dtype=bool)}
        route_down(fc, nodes, active, lambda node, a: sample_route(node, a, node_rng(seed, b, node.id)))
        part = out[lo:hi]
        for nid in nodes:
            node = fc.nodes[nid]
            if node.op == LEAF and nid in active:
                s = leaf_sample(node, active[nid], node_rng(seed, b, nid))
                write_leaf(part, node, col, active[nid], s, rows_are_active=True)
    return out


def sample_conditional_seeded(fc: FederatedCircuit, cols: Columns, seed: int, batch: int = 10_000,
                              first_batch: int = 0) -> np.ndarray:
    """Single-process samples ``(n, n_features)`` from the conditional given each row's evidence
    (NaN = free; observed entries are kept), with per-node streams: an upward pass, then the
    choices of :func:`conditional_route` and each leaf's :func:`leaf_sample_given`. Equals the
    distributed conditional sampler (:mod:`mpifc.fedpc.user_query`) for the same ``seed`` and
    ``batch``, whatever ψ. ``first_batch``: the number of the first pass, for rows that continue
    a longer list from a multiple of ``batch`` on (a query answered in chunks)."""
    from mpifc.federated.evaluate import upward

    n = batch_size(cols)
    col = {f: j for j, f in enumerate(fc.features)}
    out = np.full((n, len(fc.features)), np.nan)
    nodes = fc.reachable()
    for b, lo in enumerate(range(0, n, max(batch, 1)), start=first_batch):
        hi = min(lo + batch, n)
        part_cols = {f: np.asarray(v)[lo:hi] for f, v in cols.items()}
        values = upward(fc, part_cols)
        active = {fc.root: np.ones(hi - lo, dtype=bool)}
        route_down(fc, nodes, active, lambda node, a: conditional_route(
            node, [values[c] for c in node.children], a, node_rng(seed, b, node.id)))
        part = out[lo:hi]
        for nid in nodes:
            node = fc.nodes[nid]
            if node.op == LEAF and nid in active:
                s = leaf_sample_given(node, active[nid], node_rng(seed, b, nid), part_cols)
                write_leaf(part, node, col, active[nid], s, rows_are_active=True)
    observed = np.stack([np.asarray(cols[f], dtype=np.float64) if f in cols else np.full(n, np.nan)
                         for f in fc.features], axis=1) if n else out
    return np.where(np.isnan(observed), out, observed)
