"""Evaluation of a trained FC on the held-out test set: distributed upward pass or gathered model.

Distributed: clients evaluate their own leaves. In vertical data each client reads its own
``test/x`` (its features of every test row) and first sends a digest of its test ids so the
server can check alignment. In horizontal and hybrid data a client holds only some test rows, so
the querier (rank 0) sends each client the query rows over its features (``fc.query.evidence``,
counted as query traffic), with the target blanked. ``--evidence local|querier`` overrides this.

One pass per batch computes ``log p(x_{-y}, y = c)`` for every class ``c``: the test
log-likelihood is the entry of the true class, the prediction the arg-max.
"""
from __future__ import annotations

import io
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.shards import load_manifest, read_client, read_test
import mpifc.progress as progress
from mpifc.errors import UserError
from mpifc.federated.evaluate import Query, upward
from mpifc.federated.one_pass import ids_digest
from mpifc.federated.serialize import load_fc
from mpifc.federated.structure import FederatedCircuit
from mpifc.fedpc import protocol as P
from mpifc.atomic import OutputKind, atomic_write_bytes
from mpifc.federated.placement import place_models
from mpifc.fedpc.checks import check_model_matches, check_root_on_querier
from mpifc.fedpc.class_terms import ClassTerms, uses_class_terms
from mpifc.fedpc.devices import device_for, place_for_rank
from mpifc.fedpc.query import await_sends, batches, own_evidence, post_evidence, receive_evidence, upward_pass, warm_up

EVIDENCE_AHEAD = 1  # batches of evidence the querier posts beyond the one being answered (see below)


def make_query(fc: FederatedCircuit) -> Query:
    t = fc.target
    if t is None or int(fc.n_categories.get(t, 0)) < 2:
        return Query()
    return Query(t, int(fc.n_categories[t]))


def evaluate_rank(ctx: Any, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """This rank's part of ``evaluate``; returns the metrics on rank 0."""
    ctx.enter("read")
    manifest = load_manifest(cfg["dir"])
    distributed = bool(cfg["distributed"])
    if not distributed:
        if ctx.rank != 0:
            return None
        return evaluate_gathered(cfg, device_for(ctx, load_fc(cfg["model"], load_models=False), gathered=True))
    fc = load_fc(cfg["model"], load_models={ctx.rank})
    place_for_rank(ctx, fc)
    check_model_matches(fc, manifest, cfg["model"])
    fc.validate()  # ψ read from a file may have been edited: a leaf away from its data fails here
    check_root_on_querier(fc, cfg["model"])
    query = make_query(fc)
    n = int(cfg.get("query_rows") or manifest.test["n"])
    # Vertical clients hold every test row (their features); horizontal and data_prep's hybrid
    # clients hold only some test rows, so the querier supplies the evidence there.
    mode = cfg.get("evidence") or "auto"
    evidence_from_querier = mode == "querier" or (mode == "auto" and manifest.setting != "vertical")
    client_at = {c.rank: c for c in fc.clients.values()}
    t = ctx.transport
    test = tiled_test(read_test(cfg["dir"]), cfg) if ctx.rank == 0 else None
    own = None
    if ctx.rank in client_at and not evidence_from_querier:
        own = read_client(cfg["dir"], client_at[ctx.rank].index)
        if cfg.get("query_rows"):
            own.x_test, own.ids_test = _tile(own.x_test, n), _tile(own.ids_test, n)
    # Many classes: nodes carried as terms (mpifc.fedpc.class_terms), their program built here.
    terms = ClassTerms(fc, ctx.rank, query) if uses_class_terms(query) and ctx.rank in fc.ranks() else None
    # First-call set-up (imports, kernels) before the clock, as in a process that evaluated before.
    warm_up(fc, ctx.rank, query, terms=terms)
    # Everyone has loaded its models and rows: from here on the clock measures queries only.
    t.barrier()
    if ctx.rank not in fc.ranks():
        return None
    ctx.ledger.set_phase("query-setup")
    if terms is not None:
        terms.plan(t)
    if ctx.rank == 0 and not evidence_from_querier:
        want = ids_digest(test.ids)
        for c in sorted(fc.clients.values(), key=lambda c: c.index):
            got = t.recv_obj(c.rank, P.QUERY_DECLARE)
            if got["n_test"] != n or got["ids_digest"] != want:
                raise UserError(f"client {c.index} (rank {c.rank}) holds {got['n_test']} test rows whose ids "
                                f"do not match {cfg['dir']}/test.h5 ({n} rows) in order")
    if own is not None:
        t.send_obj({"n_test": int(own.x_test.shape[0]), "ids_digest": ids_digest(own.ids_test)}, 0, P.QUERY_DECLARE)
    ctx.ledger.set_phase("query")
    ctx.enter("query")
    clients = sorted(fc.clients.values(), key=lambda c: c.index)
    mine = client_at.get(ctx.rank)
    todo = batches(n, int(cfg["batch"]))
    # Pipelined: the querier posts batch b+1's evidence before it waits for batch b's values, and
    # a rank sends its values without waiting for delivery, so no rank idles between batches
    # waiting for a round trip. Message order within one kind and sender is MPI's, so the
    # results are those of one batch at a time. One batch of look-ahead: clients may run at most
    # one batch ahead of the querier, which keeps each batch's interval close to its real cost
    # (deeper look-ahead lets a late batch be followed by a near-instant one).
    in_flight: deque[list[Any]] = deque()
    posted = 0
    sends: list[Any] = []
    t_start = time.perf_counter()
    roots = []
    batch_seconds = []
    t_last = t_start
    progress.phase(lambda: f"evaluating {n} test rows: {len(roots)} of {len(todo)} batches done")
    for b, (lo, hi) in enumerate(todo):
        if ctx.rank == 0 and evidence_from_querier:
            while posted < min(len(todo), b + 1 + EVIDENCE_AHEAD):
                in_flight.append(post_evidence(t, clients, test, *todo[posted], query.expand_target))
                posted += 1
        if mine is None:
            cols: dict[str, np.ndarray] = {}
        elif evidence_from_querier:
            cols = receive_evidence(t, mine)
        else:
            cols = own_evidence(own, lo, hi)
        done, sends = sends, []
        root = upward_pass(t, fc, ctx.rank, cols, hi - lo, query, sends=sends, terms=terms)
        await_sends(t, done)  # the previous batch's values
        if in_flight and ctx.rank == 0:
            await_sends(t, in_flight.popleft())  # batch b's evidence (its values came back)
        if root is not None:
            roots.append(root)
        now = time.perf_counter()
        batch_seconds.append(now - t_last)  # querier: the interval between two batches' answers
        t_last = now
    await_sends(t, sends)
    if ctx.rank != 0:
        return None
    seconds = time.perf_counter() - t_start  # the queries only, as in evaluate_gathered
    out = _metrics(fc, np.concatenate(roots), test, query, cfg, "distributed")
    out["query_seconds"] = seconds
    out["batch_seconds"] = batch_seconds  # wall seconds from one batch's answer to the next, on the querier
    return out


def _tile(a: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` rows of ``a`` repeated (``n`` may exceed ``len(a)``)."""
    return np.resize(a, (n,) + a.shape[1:]) if len(a) else a


def tiled_test(test: Any, cfg: dict[str, Any]) -> Any:
    """The test set, its rows repeated to ``cfg["query_rows"]`` if given (throughput runs: a
    batch of that many queries even when the test set is smaller)."""
    n = cfg.get("query_rows")
    if not n:
        return test
    return type(test)(features=test.features, x=_tile(test.x, int(n)), ids=_tile(test.ids, int(n)))


def evaluate_gathered(cfg: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    """Single-process evaluation of the whole gathered model (no MPI needed).

    Args:
        cfg: ``dir`` (shards), ``model`` (file), ``batch``; optional ``output_npz``, ``query_rows``
            (:func:`tiled_test`).
        device: where its torch leaf PCs compute (``"cuda:0"``); None: the CPU.
    """
    manifest = load_manifest(cfg["dir"])
    fc = load_fc(cfg["model"], load_models=True)
    place_models(fc, device)
    check_model_matches(fc, manifest, cfg["model"])
    fc.validate(require_models=True)
    test = tiled_test(read_test(cfg["dir"]), cfg)
    query = make_query(fc)
    t_start = time.perf_counter()
    roots = []
    batch_seconds = []
    todo = batches(len(test.x), int(cfg["batch"]))
    progress.phase(lambda: f"evaluating {len(test.x)} test rows: {len(roots)} of {len(todo)} batches done")
    from mpifc.federated.flat import SEPARABLE_CLASSES, FlatCircuit

    program = None
    if query.n_classes >= SEPARABLE_CLASSES:
        # many classes: the flat program's one pass for every class (the reference's per-class
        # leaf values cost classes x class PCs); equal to it up to floating-point rounding
        program = FlatCircuit(fc, query.expand_target)
        order = [test.features.index(f) for f in fc.features]
    for lo, hi in todo:
        t_batch = time.perf_counter()
        cols = {f: test.x[lo:hi, j].copy() for j, f in enumerate(test.features)}
        if query.expand_target is not None:
            cols[query.expand_target][:] = np.nan
        if program is not None:
            roots.append(program.root_values(np.stack([cols[test.features[j]] for j in order], axis=1)))
        else:
            roots.append(upward(fc, cols, query)[fc.root])
        batch_seconds.append(time.perf_counter() - t_batch)
    seconds = time.perf_counter() - t_start
    out = _metrics(fc, np.concatenate(roots), test, query, cfg, "gathered")
    out["query_seconds"] = seconds
    out["batch_seconds"] = batch_seconds
    return out


def _metrics(fc: FederatedCircuit, joint: np.ndarray, test: Any, query: Query, cfg: dict[str, Any],
             mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": mode, "n_test": int(joint.shape[0])}
    manifest = load_manifest(cfg["dir"]).raw
    if query.expand_target is not None:
        y = test.x[:, test.features.index(query.expand_target)].astype(np.int64)
        ll = joint[np.arange(len(y)), y]
        pred = np.argmax(joint, axis=1)
        out["accuracy"] = float((pred == y).mean())
        per_class = _f1_per_class(y, pred, query.n_classes)
        out["f1_macro"] = _f1_macro(y, pred, query.n_classes)  # the paper's Table 7 F1
        labels = manifest.get("classes") if query.expand_target == manifest.get("target") else None
        if not labels or len(labels) != len(per_class):
            labels = list(range(len(per_class)))
        out["f1_per_class"] = {str(lab): f for lab, f in zip(labels, per_class)}
    else:
        ll = joint[:, 0]
        out["accuracy"] = None
        out["f1_macro"] = None
        out["f1_per_class"] = None
    out["test_ll"] = float(ll.mean())
    from mpifc.federated.bpd import image_bpd, ll_measure  # bpd: null unless pixels are levels

    measure = ll_measure(manifest)
    out["ll_measure"], out["ll_units"] = measure["measure"], measure["text"]
    out["bpd"] = image_bpd(manifest, joint, query.expand_target)
    train = fc.meta.get("train", {})
    out["bytes_train"] = train.get("bytes_train")
    out["train_seconds_critical_path"] = train.get("train_seconds_critical_path")
    if cfg.get("output_npz"):
        buf = io.BytesIO()
        np.savez(buf, joint=joint, ll=ll)
        atomic_write_bytes(cfg.get("_stage", Path)(cfg["output_npz"]), buf.getvalue())
    return out


def is_npz_output(path: str | Path) -> bool:
    """Whether ``path`` is an earlier ``--output-npz`` file: an ``.npz`` archive holding exactly
    the arrays ``joint`` and ``ll``."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return sorted(z.namelist()) == ["joint.npy", "ll.npy"]
    except (OSError, zipfile.BadZipFile):
        return False


NPZ_OUTPUT = OutputKind("an --output-npz file (arrays joint and ll)", is_npz_output)


def _f1_per_class(y: np.ndarray, pred: np.ndarray, n_classes: int) -> list[float | None]:
    """Each class's F1, for classes ``0..n_classes-1``; None for a class neither among the rows
    nor predicted (its F1 is undefined)."""
    f1s: list[float | None] = []
    for k in range(n_classes):
        tp = int(np.count_nonzero((y == k) & (pred == k)))
        denom = int(np.count_nonzero(y == k)) + int(np.count_nonzero(pred == k))
        f1s.append(2.0 * tp / denom if denom else None)
    return f1s


def _f1_macro(y: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Macro-averaged F1: the mean of :func:`_f1_per_class` over the classes among the rows or
    predicted, as ``sklearn.metrics.f1_score(average="macro")`` (0 without any). A
    majority-class predictor on two classes scores about 0.48 on credit, the value Table 7 gives
    FedAvg/SplitNN there, hence the paper's F1 is read as this one."""
    f1s = [f for f in _f1_per_class(y, pred, n_classes) if f is not None]
    return float(np.mean(f1s)) if f1s else 0.0
