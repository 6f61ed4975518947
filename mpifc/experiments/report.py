"""Markdown tables with the paper's numbers beside ours, and the run's provenance header."""
from __future__ import annotations

import datetime as _dt
import math
import os
import platform
from typing import Any, Sequence


def fmt(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    """``"m ± s"`` (or ``"m"``; ``"–"`` for a missing value)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def paper_fmt(value: tuple[float, float] | None, digits: int = 2) -> str:
    return "–" if value is None else fmt(value[0], value[1], digits)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; ``|`` inside cells is escaped."""
    def esc(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def provenance(name: str, seeds: Sequence[int], quick: bool, extra: dict[str, Any] | None = None) -> str:
    """Markdown header: what ran, when, on which machine."""
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    lines = [f"# {name}", "",
             f"- run: {now}{' (--quick)' if quick else ''}; seeds {list(seeds)}",
             f"- machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}, load average {load}"]
    for k, v in (extra or {}).items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def short_error(rec: dict[str, Any] | None, limit: int = 90) -> str:
    """A one-line reason for a failed or not-run cell, for a table."""
    if not rec:
        return "not run"
    msg = str(rec.get("error") or rec.get("reason") or rec.get("status") or "")
    msg = msg.strip().splitlines()[0] if msg.strip() else "failed"
    return f"{rec.get('status', 'failed')}: {msg[:limit]}"


def describe_preprocessing(manifest: dict[str, Any]) -> str:
    """One line: what data_prep made of a shard set's columns (``manifest.json`` as a dict), e.g.
    ``6 level-coded (discrete), 4 normal-score, 1 standardize (scale chosen on validation rows)``."""
    pre = manifest.get("preprocessing") or {}
    cols = pre.get("columns") or {}
    kinds: dict[str, int] = {}
    for entry in cols.values():
        kind = entry.get("transform") or ("standardize" if entry.get("std") is not None else
                                          "target-encoding" if entry.get("encoding") else "none")
        kinds[kind] = kinds.get(kind, 0) + 1
    names = {"levels": "level-coded (discrete)", "normal-score": "normal-score", "standardize": "standardised",
             "target-encoding": "target-encoded reals", "codes": "categorical codes", "none": "unscaled"}
    parts = [f"{n} {names.get(k, k)}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])]
    target = manifest.get("target")
    text = ", ".join(parts) + (f" columns, plus the label {target!r} (discrete)" if target else " columns")
    if pre.get("selection"):
        text += "; each real column's scale chosen on validation rows carved from the training rows"
    return text
