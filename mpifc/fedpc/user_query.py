"""Distributed ``mpifc query --distributed``: a user's own rows answered by the circuit's ranks.

The querier (rank 0) holds the rows (already in model units, see :mod:`data_prep.codec`). It
tells every rank of the circuit how many rows come in which batches (``fc.query.rows``, no
values), then per batch sends each client the rows over that client's features
(``fc.query.evidence``: the querier's own query; the target blanked where it is predicted).
What runs then depends on the question:

* ``ll`` / ``marginal``: one upward pass (``fc.query.values``); the root's value per row.
* ``predict``: one upward pass with the target expanded over its classes; the root's class
  log-joints, normalised on the querier.
* ``mpe``: the max-product upward pass and the decision pass of :mod:`mpifc.fedpc.mpe`; each
  client sends the entries it completed (``fc.query.answer``).
* ``sample``: an upward pass, then a decision pass whose sums draw their child from the
  posterior given the evidence (:func:`mpifc.federated.mpe.conditional_route`, per-node
  streams), and each client samples its features for its active rows given their evidence.

Every answer equals the single-process one (:mod:`mpifc.api`): LL to floating-point summation
order, MPE and samples exactly for the same seed and batch size.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.federated.evaluate import Query
from mpifc.federated.mpe import (conditional_route, leaf_sample_given, mpe_route, node_rng,
                                 write_leaf)
from mpifc.federated.serialize import load_fc
from mpifc.federated.structure import LEAF, FederatedCircuit
from mpifc.fedpc import protocol as P
from mpifc.fedpc.checks import check_root_on_querier
from mpifc.fedpc.class_terms import ClassTerms, uses_class_terms
from mpifc.fedpc.devices import place_for_rank
from mpifc.fedpc.mpe import decision_pass, max_upward_pass
from mpifc.fedpc.query import await_sends, batches, post_evidence, receive_evidence, upward_pass

QUESTIONS = ("ll", "predict", "mpe", "sample", "marginal")


class _Rows:
    """The querier's rows as :func:`~mpifc.fedpc.query.post_evidence` reads them."""

    def __init__(self, features: list[str], x: np.ndarray) -> None:
        self.features = features
        self.x = x


def query_rank(ctx: Any, cfg: dict[str, Any], rows: np.ndarray | None) -> np.ndarray | None:
    """This rank's part of a distributed query; returns the answer on rank 0.

    Args:
        cfg: ``model``, ``what`` (one of :data:`QUESTIONS`), ``target`` (predict), ``batch``,
            ``seed`` (sample).
        rows: rank 0: ``(n, D)`` model rows over the model's features (NaN = missing; for
            ``marginal`` the other columns already blanked; for ``sample`` each row repeated
            once per sample); other ranks: None.

    Returns:
        On rank 0: ``ll``/``marginal`` ``(n,)`` log-likelihoods; ``predict`` ``(n, k)`` class
        log-joints; ``mpe``/``sample`` ``(n, D)`` completed rows. Elsewhere None.
    """
    what = cfg["what"]
    if what not in QUESTIONS:
        raise UserError(f"--what must be one of {', '.join(QUESTIONS)}, not {what!r}")
    fc = load_fc(cfg["model"], load_models={ctx.rank})
    place_for_rank(ctx, fc)
    fc.validate()
    check_root_on_querier(fc, cfg["model"])
    t = ctx.transport
    involved = sorted(fc.ranks())
    ctx.ledger.set_phase("query-setup")
    if ctx.rank == 0:
        plan = {"n": int(len(rows)), "batch": int(cfg["batch"]), "what": what}
        for r in involved:
            if r != 0:
                t.send_obj(plan, r, P.QUERY_ROWS)
    elif ctx.rank in involved:
        plan = t.recv_obj(0, P.QUERY_ROWS)
    else:
        return None
    n, batch = int(plan["n"]), int(plan["batch"])
    clients = sorted(fc.clients.values(), key=lambda c: c.index)
    mine = {c.rank: c for c in clients}.get(ctx.rank)
    target = cfg.get("target") if what == "predict" else None
    query = Query()
    if target is not None:
        k = int(fc.n_categories.get(target, 0) or 0)
        if k < 2:
            raise UserError(f"--target {target!r} is not a discrete column of the model")
        query = Query(target, k)
    terms = None
    if uses_class_terms(query):  # many classes: nodes carried as terms (mpifc.fedpc.class_terms)
        terms = ClassTerms(fc, ctx.rank, query)
        terms.plan(t)
    src = _Rows(list(fc.features), rows) if ctx.rank == 0 else None
    col = {f: j for j, f in enumerate(fc.features)}
    ctx.ledger.set_phase("query")
    parts: list[np.ndarray] = []
    for b, (lo, hi) in enumerate(batches(n, batch)):
        k = hi - lo
        if ctx.rank == 0:
            await_sends(t, post_evidence(t, clients, src, lo, hi, target))
        cols = receive_evidence(t, mine) if mine is not None else {}
        if what in ("ll", "marginal", "predict"):
            root = upward_pass(t, fc, ctx.rank, cols, k, query, terms=terms)
            if root is not None:
                parts.append(root[:, 0] if what != "predict" else root)
            continue
        if what == "mpe":
            values, comps = max_upward_pass(t, fc, ctx.rank, cols, k)
            active = decision_pass(t, fc, ctx.rank, k,
                                   lambda node, a: mpe_route(node, [values[c] for c in node.children], a))
        else:
            values: dict[int, np.ndarray] = {}
            upward_pass(t, fc, ctx.rank, cols, k, values=values)
            seed = int(cfg["seed"])
            active = decision_pass(t, fc, ctx.rank, k, lambda node, a: conditional_route(
                node, [values[c] for c in node.children], a, node_rng(seed, b, node.id)))
        if mine is not None:
            _answer(t, fc, mine, active, cols, k, what, comps if what == "mpe" else None, int(cfg.get("seed", 0)), b)
        if ctx.rank == 0:
            out = src.x[lo:hi].copy()
            for c in clients:
                got = t.recv(c.rank, P.ANSWER)
                for j, f in enumerate(c.features):
                    fill = ~np.isnan(got[:, j]) & np.isnan(out[:, col[f]])
                    out[fill, col[f]] = got[fill, j]
            parts.append(out)
    if ctx.rank != 0:
        return None
    if not parts:
        width = {"predict": (0, query.n_classes), "mpe": (0, len(fc.features)), "sample": (0, len(fc.features))}
        return np.zeros(width.get(what, (0,)))
    return np.concatenate(parts)


def _answer(t: Any, fc: FederatedCircuit, client: Any, active: dict[int, np.ndarray], cols: dict[str, np.ndarray],
            k: int, what: str, comps: dict[int, np.ndarray] | None, seed: int, b: int) -> None:
    """A client's features of the answer for its active leaves; entries it was given stay NaN
    (the querier has them)."""
    mycol = {f: j for j, f in enumerate(client.features)}
    part = np.full((k, len(client.features)), np.nan)
    for nid, a in sorted(active.items()):
        node = fc.nodes[nid]
        if node.op != LEAF:
            continue
        if what == "mpe":
            write_leaf(part, node, mycol, a, comps[nid], rows_are_active=False)
        else:
            write_leaf(part, node, mycol, a, leaf_sample_given(node, a, node_rng(seed, b, nid), cols),
                       rows_are_active=True)
    observed = np.stack([~np.isnan(cols.get(f, np.full(k, np.nan))) for f in client.features], axis=1)
    part[observed] = np.nan
    t.send(part, 0, P.ANSWER)
