"""What every baseline job reports: bytes and messages from the gathered ledger, per phase and per
payload class, plus the command-line options the baselines share."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mpifc.atomic import Output, OutputKind, check_outputs
from mpifc.runtime.jsonout import finite_json
from mpifc.runtime.kinds import kind_by_id


def save_array(path: str | Path, arr: np.ndarray) -> None:
    """Write ``arr`` as ``.npy`` atomically (a failed write: UserError naming the file)."""
    from mpifc.atomic import atomic_write_bytes

    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())


def is_params_file(path: str | Path) -> bool:
    """Whether ``path`` is an earlier ``--save-params`` file: a ``.npy`` holding one 1-D float array."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
    except (OSError, ValueError):
        return False
    return len(shape) == 1 and dtype.kind == "f"


PARAMS_FILE = OutputKind("a saved parameter array (.npy)", is_params_file)
"""FedAvg's ``--save-params FILE``."""
PARAMS_FOLDER = OutputKind("a saved parameter array (.npy)", is_params_file, members=r"(top|bottom-\d+)\.npy")
"""SplitNN's ``--save-params DIR``: ``top.npy`` and ``bottom-<c>.npy``."""


def check_baseline_outputs(directory: str, outputs: list[Output], overwrite: bool) -> int:
    """Refuse, before any work, outputs that would replace an input, a source or a file of
    another kind (:func:`mpifc.atomic.check_outputs`); returns the shard set's client count."""
    from data_prep.shards import input_files, load_manifest, source_files

    m = load_manifest(directory)
    check_outputs(outputs, input_files(m), source_files(m), overwrite=overwrite)
    return m.n_clients


def ledger_totals(table: Any) -> dict[str, Any]:
    """Byte and message totals of a gathered :class:`~mpifc.runtime.ledger.LedgerTable`.

    Returns:
        ``{"bytes_total", "payload_bytes_total", "messages_total", "phases": {phase: {...}},
        "payload_classes": {class: {...}}, "kinds": {kind: {...}}}`` where each inner dict has
        ``messages``, ``payload_bytes``, ``header_bytes`` and ``bytes`` (payload + header), bytes.
        The runtime's own ``teardown`` phase (end-of-job bookkeeping) is left out.
    """
    rows = table.rows
    phases = np.asarray(table.phases, dtype=object)[rows["phase"]] if len(rows) else np.zeros(0, object)
    keep = phases != "teardown"
    rows, phases = rows[keep], phases[keep]

    def add(acc: dict[str, dict[str, int]], key: str, pb: int, hb: int) -> None:
        d = acc.setdefault(key, {"messages": 0, "payload_bytes": 0, "header_bytes": 0, "bytes": 0})
        d["messages"] += 1
        d["payload_bytes"] += pb
        d["header_bytes"] += hb
        d["bytes"] += pb + hb

    by_phase: dict[str, dict[str, int]] = {}
    by_class: dict[str, dict[str, int]] = {}
    by_kind: dict[str, dict[str, int]] = {}
    for ph, kid, pb, hb in zip(phases.tolist(), rows["kind"].tolist(), rows["payload_bytes"].tolist(),
                               rows["header_bytes"].tolist()):
        k = kind_by_id(kid)
        add(by_phase, ph, pb, hb)
        add(by_class, k.payload, pb, hb)
        add(by_kind, k.name, pb, hb)
    return {"bytes_total": int(rows["payload_bytes"].sum() + rows["header_bytes"].sum()),
            "payload_bytes_total": int(rows["payload_bytes"].sum()),
            "messages_total": int(len(rows)),
            "phases": by_phase, "payload_classes": by_class, "kinds": by_kind}


def print_result(result: dict[str, Any], as_json: bool) -> None:
    """One JSON line, or a short human-readable block."""
    if as_json:
        print(finite_json(result), flush=True)
        return
    keys = ("method", "accuracy", "f1", "bytes_train", "messages_train", "bytes_total", "wall_seconds")
    for k in keys:
        if k in result:
            print(f"{k:>16}: {result[k]}", flush=True)


def run_baseline_job(rank_fn: Callable[[Any, Any], dict[str, Any] | None], cfg: Any,
                     ledger_csv: str | None = None, as_json: bool = False,
                     on_result: Callable[[dict[str, Any]], None] | None = None,
                     params_kind: OutputKind = PARAMS_FILE, overwrite: bool = False) -> int:
    """Run ``rank_fn(ctx, cfg)`` on every rank as one MPI job (server rank 0, one client rank per
    client of the shard set ``cfg.dir``); returns the exit code.

    The outputs (``ledger_csv``, ``cfg.save_params`` of kind ``params_kind``) are checked first
    (:func:`check_baseline_outputs`). Rank 0 adds the ledger's figures to its result
    (``bytes_train``, ``payload_bytes_train``, ``messages_train`` for phase ``train``,
    ``bytes_total``, ``messages_total`` and the full breakdown under ``ledger``), prints it and
    hands it to ``on_result``.
    """
    from mpifc.runtime.job import run_job
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    n_clients = check_baseline_outputs(cfg.dir, [Output("--ledger", ledger_csv, LEDGER_OUTPUT),
                                                 Output("--save-params", cfg.save_params, params_kind)], overwrite)

    holder: dict[str, Any] = {}

    def job(ctx: Any) -> int:
        res = rank_fn(ctx, cfg)
        devices = ctx.gather_device_facts()  # outside the ledger: the same bytes on any device
        if res is not None:
            res["devices"] = devices
            holder["result"] = res
        return 0

    def on_ledger(table: Any) -> None:
        res = holder.get("result", {})
        tot = ledger_totals(table)
        train = tot["phases"].get("train", {})
        res.update(bytes_train=int(train.get("bytes", 0)), payload_bytes_train=int(train.get("payload_bytes", 0)),
                   messages_train=int(train.get("messages", 0)), bytes_total=tot["bytes_total"],
                   messages_total=tot["messages_total"], ledger=tot)
        print_result(res, as_json)
        if on_result is not None:
            on_result(res)

    return run_job(job, servers=1, min_clients=n_clients, deadline=cfg.deadline, ledger_csv=ledger_csv,
                   on_ledger=on_ledger, device=getattr(cfg, "device", None))
