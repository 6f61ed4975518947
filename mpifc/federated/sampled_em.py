"""Sampled EM on vertical data: the class glue's tie between classes and clusters, learned on a
seeded sample of the aligned rows, with values sent as float32 (and, when the PCs move, flows as
float16).

Exact vertical EM (:func:`mpifc.federated.em.em_step`, ``--refine em``) sends, every iteration,
one float64 log-value per training row for every leaf up to the server and one flow per row back
down: ``2 · 8 · n · leaves`` bytes an iteration, 13 MB for ten iterations on 13,000 rows. What
the class glue needs from EM is far less: the weights of the root's products (which of another
client's clusters go with which class). Those are sums over rows, which a sample of a few
thousand rows estimates well. Sampled EM therefore differs from exact EM in four ways, all fixed
by the plan and the job's settings, so every rank and :func:`mpifc.simulate` compute the same
thing without a message about it:

* **rows**: a seeded sample of ``rows`` of the aligned training rows (:func:`sample_rows`; the
  same positions on every client, since vertical clients hold the same ids in the same order);
  every row when ``rows`` is at least the row count;
* **fewer bits**: values travel as float32 and flows (shares in ``[0, 1]``) as float16
  (:func:`on_the_wire`); each side computes in float64 from what it received, as the
  single-process run does from the same rounded numbers;
* **fixed leaves**: by default every client keeps its PCs (``leaves=False``): each sends the
  values of its PCs on the sample rows once, and the server runs every iteration on them alone,
  moving the sum weights (how the classes and the other clients' clusters go together). No flow
  travels and no PC is sent again, so the phase costs ``4 · rows · PCs`` bytes whatever the
  iterations. With ``leaves=True`` (``--em-leaves``) the PCs of the clients without the target
  move too: they send their values every iteration and get their flows back for an M-step on
  their sample rows, then send the refined PCs (the target's holders keep theirs: their class
  PCs' flows would be the class indicator they already know);
* **stopping**: the iterations end early when the mean log-likelihood of the sample rises by less
  than :data:`STOP_TOL` nats per row (:func:`should_stop`).

Each iteration: the clients whose leaves move send the float32 values of those leaves on the
sample rows (every client in the first); the server combines them with the fixed values into
every inner node, records the sample's mean log-likelihood, decides whether to go on, and if so
updates the sum weights and sends each moving client the float16 flows of its leaves, which it
uses for its leaves' M-step on its own sample rows (:func:`mpifc.federated.em.update_leaf`). What
crosses ranks: per-sample likelihood values (``fc.query.values``) and, with moving leaves, flows
(``fc.em.flows``) of the sampled rows only, never a row, a label or a raw value.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from mpifc.federated.evaluate import Columns, _model_ll, combine
from mpifc.federated.structure import LEAF, FederatedCircuit

WIRE_DTYPE = np.float32
"""dtype of the log-values sampled EM sends (their differences between PCs decide the flows)."""

FLOW_DTYPE = np.float16
"""dtype of the flows sampled EM sends: shares in ``[0, 1]``, to about 5e-4 of their size."""

STOP_TOL = 1e-3
"""Sampled EM ends once an iteration raises the sample's mean log-likelihood by less than this
(nats per row)."""

SAMPLE_SEED = 0x73616D70
"""Seed part of the row sample (with the job's seed): the same rows on every rank."""


def sample_rows(n: int, rows: int | None, seed: int) -> np.ndarray | None:
    """Sorted positions of the ``rows`` aligned training rows sampled EM runs on (of ``n``), or
    ``None`` (every row) when ``rows`` is unset or at least ``n``."""
    from mpifc.federated.one_pass import derive_seed

    if rows is None or int(rows) <= 0 or int(rows) >= int(n):
        return None
    rng = np.random.default_rng(derive_seed(int(seed), SAMPLE_SEED))
    return np.sort(rng.choice(int(n), int(rows), replace=False))


def take_rows(cols: Columns, idx: np.ndarray | None) -> Columns:
    """``cols`` restricted to the sampled positions ``idx`` (``None``: all)."""
    return dict(cols) if idx is None else {f: np.asarray(v)[idx] for f, v in cols.items()}


def on_the_wire(a: np.ndarray, dtype: Any = WIRE_DTYPE) -> np.ndarray:
    """``a`` as it travels (``dtype``: :data:`WIRE_DTYPE` for values, :data:`FLOW_DTYPE` for
    flows; contiguous, flat)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64).reshape(-1), dtype=dtype)


def from_the_wire(a: np.ndarray) -> np.ndarray:
    """What the receiver computes with: the float32 values as float64."""
    return np.asarray(a, dtype=np.float64)


def fixed_clients(fc: FederatedCircuit, leaves: bool = True) -> set[int]:
    """Client indices whose leaves sampled EM keeps: every client unless ``leaves`` (the PCs
    move); then the target's holders (all clients when the circuit has no target)."""
    if fc.target is None or not leaves:
        return set(fc.clients)
    return {c for c, info in fc.clients.items() if fc.target in info.features}


def client_leaves(fc: FederatedCircuit, client: int) -> list[int]:
    """Ids of ``client``'s reachable leaves, ascending (the order of its value and flow bundles)."""
    return sorted(nid for nid in fc.reachable() if fc.nodes[nid].op == LEAF and fc.nodes[nid].leaf.client == client)


def pc_input(features: Sequence[str], cols: Columns) -> np.ndarray:
    """A PC's input ``(batch, d)`` over ``features`` from ``cols`` (absent features NaN), as
    :func:`mpifc.federated.evaluate.leaf_input` builds it."""
    n = len(next(iter(cols.values())))
    out = np.full((n, len(features)), np.nan)
    for j, f in enumerate(features):
        if f in cols:
            out[:, j] = cols[f]
    return out


def leaf_bundle(pcs: Sequence[tuple[Any, Sequence[str]]], cols: Columns, guard: Any | None = None) -> np.ndarray:
    """The float32 bundle of the PCs ``pcs`` (``(model, features)`` pairs) on ``cols``: their
    log-values, PC after PC. ``guard``: the sending client's
    :class:`~mpifc.circuit.privacy.MomentGuard`, which moves a value that happens to equal one
    of the client's rare values (bit for bit in float32) by a unit in the last place."""
    if not pcs:
        return np.zeros(0, dtype=WIRE_DTYPE)
    out = on_the_wire(np.concatenate([_model_ll(model, pc_input(feats, cols)) for model, feats in pcs]))
    if guard is not None:
        guard.move_off(out)
    return out


def leaf_mstep(model: Any, features: Sequence[str], cols: Columns, flow: np.ndarray) -> None:
    """One PC's M-step on the rows ``cols`` weighted by ``flow`` (as
    :func:`mpifc.federated.em.update_leaf`)."""
    model.apply_em(model.em_statistics(pc_input(features, cols), sample_weight=flow), step_size=1.0)


def split_bundle(bundle: np.ndarray, ids: list[int], m: int) -> dict[int, np.ndarray]:
    """Inverse of :func:`leaf_bundle` / a flow bundle: ``{leaf id: (m,) float64}``."""
    flat = from_the_wire(bundle)
    if flat.size != m * len(ids):
        raise ValueError(f"EM bundle of {flat.size} values, expected {m} rows x {len(ids)} leaves")
    return {nid: flat[i * m:(i + 1) * m] for i, nid in enumerate(ids)}


def server_pass(fc: FederatedCircuit, leaf_vals: dict[int, np.ndarray]
                ) -> tuple[float, dict[int, np.ndarray], dict[int, np.ndarray]]:
    """The server's E-step from every leaf's values ``{leaf id: (m,)}``: the sample's mean
    log-likelihood, the flows ``{id: (m,)}`` of every node and the sums' edge statistics."""
    from mpifc.federated.em import downward

    m = len(next(iter(leaf_vals.values())))
    values: dict[int, np.ndarray] = {}
    nodes = fc.reachable()
    for nid in nodes:
        node = fc.nodes[nid]
        values[nid] = (np.asarray(leaf_vals[nid], dtype=np.float64).reshape(-1, 1) if node.op == LEAF
                       else combine(node, [values[c] for c in node.children]))
    flows = {fc.root: np.ones(m)}
    stats = downward(fc, values, flows, nodes)
    return float(values[fc.root][:, 0].mean()), flows, stats


def should_stop(trace: list[float], tol: float | None) -> bool:
    """Whether sampled EM ends before another M-step: the last log-likelihood rose by less than
    ``tol`` nats per row over the one before (``tol`` None: never early)."""
    return tol is not None and len(trace) >= 2 and trace[-1] - trace[-2] < float(tol)


def run_single_process(fc: FederatedCircuit, cols: Columns, iters: int, rows: int | None, seed: int,
                       tol: float | None = STOP_TOL, progress: Callable[[int, float], None] | None = None,
                       leaves: bool = False, guards: dict[int, Any] | None = None) -> list[float]:
    """Sampled EM in one process, the arithmetic of the MPI job's (module doc) on ``cols``
    (every client's training columns, aligned rows): the same sample, the same float32 values
    and flows, the same stopping; ``leaves``: the PCs of the clients without the target move
    too; ``guards``: per client, the guard its values go through (:func:`leaf_bundle`). Returns
    the sample's mean log-likelihood before each M-step."""
    from mpifc.federated.em import update_sums

    n = len(next(iter(cols.values())))
    sample = take_rows(cols, sample_rows(n, rows, seed))
    m = len(next(iter(sample.values())))
    fixed = fixed_clients(fc, leaves)
    leaf_ids = {c: client_leaves(fc, c) for c in sorted(fc.clients)}
    pcs = {c: [(fc.nodes[nid].leaf.model, fc.nodes[nid].leaf.features) for nid in ids] for c, ids in leaf_ids.items()}
    vals: dict[int, np.ndarray] = {}
    trace: list[float] = []
    for it in range(int(iters)):
        for c, ids in leaf_ids.items():
            if it == 0 or c not in fixed:
                vals.update(split_bundle(leaf_bundle(pcs[c], sample, (guards or {}).get(c)), ids, m))
        ll, flows, stats = server_pass(fc, vals)
        trace.append(ll)
        if progress is not None:
            progress(it, ll)
        if should_stop(trace, tol):
            break
        update_sums(fc, stats)
        for c, ids in leaf_ids.items():
            if c in fixed or not ids:
                continue
            got = split_bundle(on_the_wire(np.concatenate([flows.get(nid, np.zeros(m)) for nid in ids]), FLOW_DTYPE),
                               ids, m)
            for nid, (model, feats) in zip(ids, pcs[c]):
                leaf_mstep(model, feats, sample, got[nid])
    return trace


__all__ = ["FLOW_DTYPE", "SAMPLE_SEED", "STOP_TOL", "WIRE_DTYPE", "client_leaves", "fixed_clients", "from_the_wire", "leaf_bundle", "leaf_mstep", "pc_input",
           "on_the_wire", "run_single_process", "sample_rows", "server_pass", "should_stop", "split_bundle",
           "take_rows"]
