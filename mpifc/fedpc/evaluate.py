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
from mpifc.errors import UserError
from mpifc.federated.evaluate import Query, upward
from mpifc.federated.one_pass import ids_digest
from mpifc.federated.serialize import load_fc
from mpifc.federated.structure import FederatedCircuit
from mpifc.fedpc import protocol as P
from mpifc.atomic import OutputKind, atomic_write_bytes
from mpifc.fedpc.checks import check_model_matches, check_root_on_querier
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
        return evaluate_gathered(cfg) if ctx.rank == 0 else None
    fc = load_fc(cfg["model"], load_models={ctx.rank})
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
    # First-call set-up (imports, kernels) before the clock, as in a process that evaluated before.
    warm_up(fc, ctx.rank, query)
    # Everyone has loaded its models and rows: from here on the clock measures queries only.
    t.barrier()
    if ctx.rank not in fc.ranks():
        return None
    ctx.ledger.set_phase("query-setup")
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
        root = upward_pass(t, fc, ctx.rank, cols, hi - lo, query, sends=sends)
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


def evaluate_gathered(cfg: dict[str, Any]) -> dict[str, Any]:
    """Single-process evaluation of the whole gathered model (no MPI needed).

    Args:
        cfg: ``dir`` (shards), ``model`` (file), ``batch``; optional ``output_npz``, ``query_rows``
            (:func:`tiled_test`).
    """
    manifest = load_manifest(cfg["dir"])
    fc = load_fc(cfg["model"], load_models=True)
    check_model_matches(fc, manifest, cfg["model"])
    fc.validate(require_models=True)
    test = tiled_test(read_test(cfg["dir"]), cfg)
    query = make_query(fc)
    t_start = time.perf_counter()
    roots = []
    batch_seconds = []
    for lo, hi in batches(len(test.x), int(cfg["batch"])):
        t_batch = time.perf_counter()
        cols = {f: test.x[lo:hi, j].copy() for j, f in enumerate(test.features)}
        if query.expand_target is not None:
            cols[query.expand_target][:] = np.nan
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
    if query.expand_target is not None:
        y = test.x[:, test.features.index(query.expand_target)].astype(np.int64)
        ll = joint[np.arange(len(y)), y]
        pred = np.argmax(joint, axis=1)
        out["accuracy"] = float((pred == y).mean())
        out["f1"] = _f1(y, pred, query.n_classes)
        out["f1_macro"] = _f1_macro(y, pred, query.n_classes)  # mean per-class F1 (the paper's Table 7)
    else:
        ll = joint[:, 0]
        out["accuracy"] = None
        out["f1"] = None
        out["f1_macro"] = None
    out["test_ll"] = float(ll.mean())
    from mpifc.federated.bpd import image_bpd, ll_measure  # bpd: null unless pixels are levels

    manifest = load_manifest(cfg["dir"]).raw
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


def _f1_macro(y: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Macro-averaged F1: the mean over classes ``0..n_classes-1`` of each class's F1 (0 for a
    class neither present nor predicted). A majority-class predictor on two classes scores about
    0.48 on credit, the value Table 7 gives FedAvg/SplitNN there, hence the paper's F1 is read
    as this one."""
    f1s = []
    for k in range(n_classes):
        tp = int(np.count_nonzero((y == k) & (pred == k)))
        denom = int(np.count_nonzero(y == k)) + int(np.count_nonzero(pred == k))
        f1s.append(2.0 * tp / denom if denom else 0.0)
    return float(np.mean(f1s)) if f1s else 0.0


def _f1(y: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """``sklearn.metrics.f1_score`` (binary for two classes, else macro), without importing
    sklearn (seconds of start-up on rank 0) in the common binary case.

    For labels in {0, 1} and ``2·tp + fp + fn > 0`` sklearn computes exactly
    ``2·tp / ((tp + fn) + (tp + fp))``, one float64 division of two exact integers, so the
    result is bit-identical; every other case (multi-class, other labels, an undefined score
    and its warning) goes to sklearn itself.
    """
    if n_classes == 2 and len(y) and np.isin(y, (0, 1)).all() and np.isin(pred, (0, 1)).all():
        tp = int(np.count_nonzero((y == 1) & (pred == 1)))
        denom = int(np.count_nonzero(y == 1)) + int(np.count_nonzero(pred == 1))
        if denom > 0:
            return float(np.float64(2 * tp) / np.float64(denom))
    from sklearn.metrics import f1_score

    return float(f1_score(y, pred, average="binary" if n_classes == 2 else "macro"))
