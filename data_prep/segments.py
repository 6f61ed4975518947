"""Segment predicates for ``--split segment`` (FedNGM's over-represented client segments).

A predicate is ``COLUMN OP VALUE`` with OP one of ``==``, ``!=``, ``<``, ``<=``, ``>``,
``>=``, or ``COLUMN in V1,V2,...`` / ``COLUMN not in V1,V2,...``. Categorical columns (and
the target) compare their original labels; numeric columns compare numbers. Missing values
match nothing.

Client ``i`` over-samples the rows that match predicate ``i``: every row goes to one client,
drawn with weight ``boost`` for each client whose predicate it matches and 1 otherwise. All
rows are used exactly once and clients stay disjoint; a segment is over-represented on its
client by up to ``boost`` times.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from mpifc.errors import UserError

from .table import RawTable

_IN = re.compile(r"^\s*(?P<col>.+?)\s+(?P<op>not in|in)\s+(?P<val>.+?)\s*$")
_CMP = re.compile(r"^\s*(?P<col>.+?)\s*(?P<op>==|!=|<=|>=|<|>)\s*(?P<val>.*?)\s*$")


@dataclass(frozen=True)
class Predicate:
    """A parsed predicate: ``column op values`` (one value except for ``in``/``not in``)."""

    text: str
    column: str
    op: str
    values: tuple[str, ...]


def parse_predicate(text: str, columns: list[str]) -> Predicate:
    """Parse ``text`` against the known ``columns``.

    Raises:
        UserError: no operator, or an unknown column.
    """
    candidates = []
    for pattern in (_IN, _CMP):
        m = pattern.match(text)
        if m:
            candidates.append(m)
    if not candidates:
        raise UserError(f"--segment {text!r}: expected COLUMN==VALUE, COLUMN!=VALUE, "
                        "COLUMN<VALUE (<=, >, >=) or COLUMN in V1,V2")
    for m in candidates:
        if m["col"] in columns:
            op = m["op"]
            raw = m["val"]
            values = tuple(v.strip() for v in raw.split(",")) if op.endswith("in") else (raw,)
            return Predicate(text, m["col"], op, values)
    raise UserError(f"--segment {text!r}: unknown column {candidates[0]['col']!r} "
                    f"(columns: {', '.join(columns)})")


def evaluate(pred: Predicate, table: RawTable) -> np.ndarray:
    """``(n_rows,)`` bool: which rows of ``table`` match ``pred``."""
    if pred.column == table.target:
        labels = [str(c) for c in table.classes]
        codes = table.y.astype(np.float64)
    else:
        j = table.features.index(pred.column)
        codes = table.x[:, j].astype(np.float64)
        labels = table.categories.get(pred.column)
    if labels is not None:
        if pred.op not in ("==", "!=", "in", "not in"):
            raise UserError(f"--segment {pred.text!r}: {pred.column!r} is categorical; use "
                            "==, != or in")
        wanted = []
        for v in pred.values:
            if v not in labels:
                shown = ", ".join(labels[:12]) + (", ..." if len(labels) > 12 else "")
                raise UserError(f"--segment {pred.text!r}: {v!r} is not a value of "
                                f"{pred.column!r} (values: {shown})")
            wanted.append(labels.index(v))
        hit = np.isin(codes, wanted)
        negate = pred.op in ("!=", "not in")
    else:
        try:
            numbers = [float(v) for v in pred.values]
        except ValueError:
            raise UserError(f"--segment {pred.text!r}: {pred.column!r} is numeric; "
                            f"{','.join(pred.values)!r} is not a number") from None
        compare = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
                   ">": np.greater, ">=": np.greater_equal}
        if pred.op in ("in", "not in"):
            hit, negate = np.isin(codes, numbers), pred.op == "not in"
        else:
            with np.errstate(invalid="ignore"):
                hit, negate = compare[pred.op](codes, numbers[0]), False
    hit = ~hit if negate else hit
    return hit & ~np.isnan(codes)


def segment_weights(texts: list[str], table: RawTable, n_clients: int, boost: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Sampling weights for ``--split segment``.

    Returns:
        ``weights`` ``(n_rows, n_clients)`` and the match flags ``(n_rows, n_clients)``.

    Raises:
        UserError: not one predicate per client, a bad predicate, or ``boost < 1``.
    """
    if len(texts) != n_clients:
        raise UserError(f"--split segment needs one --segment per client: got {len(texts)} "
                        f"for {n_clients} clients")
    if not boost >= 1:
        raise UserError(f"--oversample must be >= 1, got {boost}")
    columns = list(table.features) + ([table.target] if table.target else [])
    matches = np.stack([evaluate(parse_predicate(t, columns), table) for t in texts], axis=1)
    weights = np.where(matches, float(boost), 1.0)
    return weights, matches
