"""What ``mpifc train`` and ``mpifc evaluate`` print: a short summary for people by default,
one JSON line with ``--json``, nothing with ``--quiet``.

JSON never holds NaN or infinity (not valid JSON): such a number is written as ``null``, with a
``<key>_null_reason`` beside it saying what it was.
"""
from __future__ import annotations

import math
from typing import Any


def json_line(summary: dict[str, Any]) -> str:
    """``summary`` as one line of strict JSON: a non-finite number is ``null`` with a
    ``<key>_null_reason`` beside it (:func:`mpifc.runtime.jsonout.finite_json`)."""
    from mpifc.runtime.jsonout import finite_json

    return finite_json(summary)


def kb(n: int | float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _phases(by_phase: dict[str, int] | None) -> str:
    if not by_phase:
        return ""
    return ", ".join(f"{ph} {kb(b)}" for ph, b in by_phase.items())


def train_text(s: dict[str, Any]) -> str:
    """The human summary of a training run."""
    lines = [f"trained a one-pass FedPC on {s.get('setting') or '?'} shards: {s.get('clients', '?')} clients, "
             f"learner {s.get('learner')}, glue {s.get('glue')}, "
             + (f"{s.get('clusters')} classes" if s.get("glue") == "class" else f"K = {s.get('clusters')}")
             + f", seed {s.get('seed')}",
             f"  model      {s.get('model')} ({s.get('n_nodes')} nodes, {s.get('n_leaves')} leaf PCs, "
             f"{s.get('n_parameters'):,} parameters)" if isinstance(s.get('n_parameters'), int) else
             f"  model      {s.get('model')}"]
    lines.append(f"  bytes      {kb(s.get('bytes_train'))} in {s.get('messages_train')} messages"
                 + (f" ({_phases(s.get('bytes_by_phase'))})" if s.get("bytes_by_phase") else ""))
    cp, wall = s.get("train_seconds_critical_path"), s.get("job_wall_seconds")
    if cp is not None:
        lines.append(f"  time       {cp:.3f} CPU s on the critical path (slowest client + server); "
                     f"job {wall:.1f} s wall (rank 0, start to end)" if wall is not None else
                     f"  time       {cp:.3f} CPU s on the critical path (slowest client + server)")
    if s.get("em_train_ll"):
        lines.append(f"  EM         train LL {s['em_train_ll'][0]:.4f} -> {s['em_train_ll'][-1]:.4f} nats per row")
    if s.get("devices"):
        from mpifc.runtime.device import describe_devices

        lines.append(f"  devices    {describe_devices(s['devices'])}")
    return "\n".join(lines)


def evaluate_text(s: dict[str, Any]) -> str:
    """The human summary of an evaluation."""
    if s.get("query") in ("mpe", "sample"):
        head = f"{s['query']}: {s.get('n')} rows ({s.get('mode')})" + (f" -> {s['out']}" if s.get("out") else "")
        extra = f"; MPE accuracy on the target {s['mpe_accuracy']:.4f}" if s.get("mpe_accuracy") is not None else ""
        return head + extra + (f"\n  bytes      {kb(s.get('bytes_query'))} in {s.get('messages')} messages"
                               if s.get("bytes_query") is not None else "")
    ll = s.get("test_ll")
    lines = [f"evaluated on {s.get('n_test')} test rows ({s.get('mode')}): test LL "
             + (f"{ll:.4f} nats per row" if isinstance(ll, float) and math.isfinite(ll) else "not finite")]
    if s.get("ll_units"):
        lines.append(f"  measure    {s.get('ll_measure')}: {s['ll_units']}")
    if s.get("accuracy") is not None:
        lines.append(f"  accuracy   {s['accuracy']:.4f}   macro F1 {s.get('f1_macro', float('nan')):.4f}")
        per_class = s.get("f1_per_class") or {}
        if 0 < len(per_class) <= 12:
            lines.append("  F1 by class " + ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}"
                                                   for k, v in per_class.items()))
    if s.get("bpd") is not None:
        lines.append(f"  bpd        {s['bpd']:.4f} bits per pixel")
    if s.get("bytes_query") is not None:
        lines.append(f"  bytes      query {kb(s['bytes_query'])} in {s.get('messages')} messages"
                     + (f"; training took {kb(s['bytes_train'])}" if s.get("bytes_train") is not None else ""))
    return "\n".join(lines)


def emit(summary: dict[str, Any], output: str, text: Any) -> None:
    """Print ``summary`` as ``output`` asks: ``"human"`` (``text(summary)``), ``"json"`` or ``"quiet"``."""
    if output == "json":
        print(json_line(summary), flush=True)
    elif output == "human":
        print(text(summary), flush=True)
