"""Sampled EM over MPI (vertical data, the class glue's default refinement): the protocol of
:mod:`mpifc.federated.sampled_em`, whose single-process run it equals.

Per iteration (ledger phase ``em``):

1. ``fc.query.values`` (client -> server, float32 ``(rows x leaves,)``): the log-values of the
   client's PCs on the sampled rows, PC after PC in the order of its counts. A client whose PCs
   stay as learned (every client by default; with ``--em-leaves``, those that hold the target)
   sends its values in the first iteration only.
2. The server combines them into every inner node, records the sample's mean log-likelihood,
   decides whether to go on (:func:`~mpifc.federated.sampled_em.should_stop`) and updates the
   sum weights.
3. With ``--em-leaves`` only: ``fc.em.flows`` (server -> each client without the target, float16
   ``(rows x leaves,)``): the flows of its PCs, for their M-step on its sampled rows. An empty
   bundle says the iterations ended early (no M-step). After the last iteration each such client
   sends its refined PCs (``fc.train.model``).

By default, then, the phase is one message per client; the iterations run on the server alone. The sample is drawn from the job's seed by every rank alike, so no row
position travels. No structure is sent either: a client's values and flows follow the order of
the PCs it reported.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from mpifc.federated.one_pass import ClientReport, insert_models
from mpifc.federated.sampled_em import (
    FLOW_DTYPE,
    STOP_TOL,
    fixed_clients,
    leaf_bundle,
    leaf_mstep,
    on_the_wire,
    sample_rows,
    server_pass,
    should_stop,
    split_bundle,
    take_rows,
)
from mpifc.federated.structure import FederatedCircuit
from mpifc.federated.wire_format import model_from_bytes, model_to_bytes, release_guard
from mpifc.fedpc import protocol as P

def _leaf_ids(fc: FederatedCircuit, report: ClientReport) -> list[int]:
    """Node ids of a client's PCs in the order of its report."""
    by_key = {(n.leaf.client, n.leaf.subspace, n.leaf.cluster): n.id for n in fc.leaves}
    return [by_key[(report.client, r.subspace, r.cluster)] for r in report.leaves]


def server_sampled_em(ctx: Any, cfg: dict[str, Any], fc: FederatedCircuit, ranks: dict[int, int],
                      reports: list[ClientReport], n: int) -> list[float]:
    """Server side; returns the sample's mean log-likelihood before each M-step."""
    from mpifc.federated.em import update_sums

    t = ctx.transport
    idx = sample_rows(n, cfg.get("em_rows"), int(cfg["seed"]))
    m = n if idx is None else len(idx)
    fixed = fixed_clients(fc, bool(cfg.get("em_leaves")))
    ids = {r.client: _leaf_ids(fc, r) for r in reports}
    moving = [c for c in sorted(ids) if c not in fixed and ids[c]]
    iters = int(cfg["em_iters"])
    vals: dict[int, np.ndarray] = {}
    trace: list[float] = []
    t0 = time.perf_counter()
    beat = Heartbeat(bool(cfg.get("progress")))
    for it in range(iters):
        with beat.while_waiting(lambda: f"EM iteration {it + 1}/{iters}: the clients evaluate and update their "
                                        f"PCs on {m} sampled rows [{time.perf_counter() - t0:.1f} s]"):
            for c in sorted(ids):
                if it == 0 or c in moving:
                    vals.update(split_bundle(t.recv(ranks[c], P.VALUES), ids[c], m))
        ll, flows, stats = server_pass(fc, vals)
        trace.append(ll)
        stop = should_stop(trace, STOP_TOL)
        if cfg.get("progress"):  # one line an iteration, and one every few seconds of waiting
            _progress(f"EM iteration {it + 1}/{iters}: train LL {ll:.4f} nats per row on {m} sampled rows, "
                      f"{_sent_bytes(ctx) / 1e3:.1f} kB sent so far [{time.perf_counter() - t0:.1f} s]"
                      + ("; LL settled, stopping" if stop else ""))
        if stop:
            for c in moving:
                t.send(np.zeros(0, dtype=FLOW_DTYPE), ranks[c], P.FLOWS)
            break
        update_sums(fc, stats)
        for c in moving:
            t.send(on_the_wire(np.concatenate([flows.get(nid, np.zeros(m)) for nid in ids[c]]), FLOW_DTYPE),
                   ranks[c], P.FLOWS)
    models = {}
    with beat.while_waiting(lambda: f"EM: receiving the refined PCs [{time.perf_counter() - t0:.1f} s]"):
        for rep in reports:
            if rep.client not in moving:
                continue
            for leaf in rep.leaves:
                models[(rep.client, leaf.subspace, leaf.cluster)] = model_from_bytes(
                    t.recv(ranks[rep.client], P.MODEL), lazy=True,
                    source=f"client {rep.client} (rank {ranks[rep.client]})")
    insert_models(fc, models)
    return trace


def client_sampled_em(ctx: Any, cfg: dict[str, Any], index: int, data: Any, report: ClientReport,
                      holds_target: bool) -> None:
    """Client side: values of its PCs on the sampled rows; with ``--em-leaves`` and unless it
    holds the target, the M-step of its PCs from the flows the server sends, and the refined
    PCs at the end."""
    t = ctx.transport
    x = data.shard.x_train
    idx = sample_rows(x.shape[0], cfg.get("em_rows"), int(cfg["seed"]))
    cols = take_rows({f: x[:, j] for j, f in enumerate(data.shard.features)}, idx)
    m = len(next(iter(cols.values())))
    pcs = [(r.model, r.features) for r in report.leaves]
    if not pcs:
        return
    t.send(leaf_bundle(pcs, cols, release_guard()), 0, P.VALUES)
    if holds_target or not cfg.get("em_leaves"):
        return
    keys = list(range(len(pcs)))
    for it in range(int(cfg["em_iters"])):
        flat = t.recv(0, P.FLOWS)
        if flat.size == 0:
            break
        for (model, feats), flow in zip(pcs, split_bundle(flat, keys, m).values()):
            leaf_mstep(model, feats, cols, flow)
        if it + 1 < int(cfg["em_iters"]):
            t.send(leaf_bundle(pcs, cols, release_guard()), 0, P.VALUES)
    for r in report.leaves:
        t.send(model_to_bytes(r.model), 0, P.MODEL)


PROGRESS_SECONDS = 5.0
"""While the server waits on the clients, a progress line comes at least this often."""


class Heartbeat:
    """Progress lines while the server waits: :meth:`while_waiting` prints ``line()`` every
    :data:`PROGRESS_SECONDS` until its block ends (a thread that only writes to stderr; off when
    ``on`` is false, e.g. under ``--quiet`` or ``--json``)."""

    def __init__(self, on: bool, seconds: float = PROGRESS_SECONDS) -> None:
        self.on, self.seconds = on, float(seconds)

    @contextmanager
    def while_waiting(self, line: Callable[[], str]) -> Iterator[None]:
        if not self.on:
            yield
            return
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.seconds):
                _progress(line())

        thread = threading.Thread(target=beat, name="mpifc-em-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def _sent_bytes(ctx: Any) -> int:
    """Bytes the job has moved so far, as rank 0 counts them (what it received and sent)."""
    rows = ctx.ledger.rows
    sent = ctx.ledger.sent
    return int(rows["payload_bytes"].sum() + rows["header_bytes"].sum() + sent[:, 1].sum() + sent[:, 2].sum())


def _progress(line: str) -> None:
    sys.stderr.write(f"mpifc train: {line}\n")
    sys.stderr.flush()


__all__ = ["PROGRESS_SECONDS", "Heartbeat", "client_sampled_em", "server_sampled_em"]
