"""Column types read off a CSV, for ``python -m data_prep --dataset csv`` without a schema file.

One pass over the file's text decides each column's type, by the rule pandas' and scikit-learn's
column selectors follow, made explicit:

* every cell a number, all of them whole, at most :data:`~data_prep.transforms.MAX_LEVELS`
  distinct values -> ``discrete`` (counts, codes, years, flags: modelled as levels);
* every cell a number otherwise -> ``real``;
* any cell text -> ``categorical``;
* a column that names each row once (text unique per row, or whole numbers that run through
  consecutive values once each: a row id) -> ``skip``, and so does a column with no value;
* the column given with ``--target`` -> the class column (2 to :data:`MAX_CLASSES` distinct
  values), whatever it holds.

The result is an ordinary schema (:mod:`data_prep.usercsv`), written beside the shards
(``DIR/schema.json``) and printed as a table with the reason for each type, so that a wrong
guess is one edit and ``--schema FILE`` away.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import mpifc.progress as progress
from mpifc.errors import UserError

from .transforms import MAX_LEVELS

MAX_CLASSES = 1000
"""A target with more distinct values than this is refused (mpifc classifies; it does not regress)."""

MISSING = ("", "?", "NA", "NaN", "nan", "null", "None")
"""Cells that mean "missing" in an inferred schema: the tokens ``mpifc query`` reads as missing too."""

ID_MIN_ROWS = 10
"""A column is called an id (unique per row) only on tables of at least this many rows."""

DELIMITERS = (",", ";", "\t", "|")


@dataclass(frozen=True)
class ColumnGuess:
    """One column's inferred type and the reason, in words, for the printed table."""

    name: str
    type: str
    why: str


def _delimiter(header_line: str) -> str:
    """The separator of a CSV: the candidate found most often in its header line (ties: comma)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: (counts[d], d == ","))
    return best if counts[best] else ","


def _number(token: str) -> float | None:
    try:
        v = float(token)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _guess(name: str, counts: dict[str, int], n_rows: int, target: str | None) -> ColumnGuess:
    """The type of one column from its distinct non-missing cells and how often each occurs."""
    seen = sum(counts.values())
    n_missing = n_rows - seen
    miss = f", {n_missing} missing" if n_missing else ""
    values = {tok: _number(tok) for tok in counts}
    numeric = bool(counts) and all(v is not None for v in values.values())
    if name == target:
        n_classes = len(set(values.values())) if numeric else len(counts)
        if n_classes < 2:
            raise UserError(f"--target {name!r}: the column holds {n_classes} distinct value(s); "
                            "a target needs at least 2 classes")
        if n_classes > MAX_CLASSES:
            raise UserError(f"--target {name!r}: {n_classes:,} distinct values; mpifc predicts classes "
                            f"(2 to {MAX_CLASSES:,}), so choose a column with fewer values")
        return ColumnGuess(name, "categorical", f"the target, {n_classes} classes")
    if not counts:
        return ColumnGuess(name, "skip", "no value in any row")
    if numeric:
        distinct = sorted(set(values.values()))
        whole = all(float(v).is_integer() for v in distinct)
        once = seen == len(counts) and len(distinct) == len(counts)
        if whole and once and seen >= ID_MIN_ROWS and distinct[-1] - distinct[0] + 1 == len(distinct):
            return ColumnGuess(name, "skip", f"a row id: whole numbers {int(distinct[0])}..{int(distinct[-1])}, "
                                             f"each once")
        if whole and len(distinct) <= MAX_LEVELS:
            return ColumnGuess(name, "discrete", f"{len(distinct)} distinct whole numbers{miss}")
        kind = "whole numbers" if whole else "numbers"
        return ColumnGuess(name, "real", f"{len(distinct)} distinct {kind}{miss}")
    if seen == len(counts) and seen >= ID_MIN_ROWS:
        return ColumnGuess(name, "skip", f"an id: text unique per row ({seen} rows)")
    text = next(tok for tok, v in values.items() if v is None)
    return ColumnGuess(name, "categorical", f"text (e.g. {text!r}), {len(counts)} labels{miss}")


def infer_schema(path: Path, target: str | None = None) -> tuple[dict, list[ColumnGuess]]:
    """The schema of the CSV at ``path`` (header line required) and the reason for each type.

    Args:
        path: a CSV file whose first line names the columns.
        target: the class column (``--target``), or None for a table without one.

    Raises:
        UserError: an unreadable or empty file, a header without names or with a name twice, a
            line with another number of fields, a target that is not a column or has fewer than 2
            or more than :data:`MAX_CLASSES` values.
    """
    progress.phase(f"inferring the column types of {path}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            first = f.readline()
            delimiter = _delimiter(first)
            f.seek(0)
            reader = csv.reader(f, delimiter=delimiter, skipinitialspace=True)
            header = [h.strip() for h in next(reader, [])]
            if not any(header):
                raise UserError(f"{path}: the first line names no column (a header line is needed to "
                                "infer the column types; or give a schema with --schema FILE)")
            dup = sorted({h for h in header if header.count(h) > 1})
            if dup or "" in header:
                what = f"column {dup[0]!r} appears twice" if dup else "a column has no name"
                raise UserError(f"{path}: line 1: {what}")
            if target is not None and target not in header:
                raise UserError(f"--target {target!r}: not a column of {path} (columns: {', '.join(header)})")
            missing = frozenset(MISSING)
            counts: list[dict[str, int]] = [{} for _ in header]
            n_rows = 0
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise UserError(f"{path} line {reader.line_num}: expected {len(header)} fields, got {len(row)}")
                for col, tok in zip(counts, row):
                    tok = tok.strip()
                    if tok not in missing:
                        col[tok] = col.get(tok, 0) + 1
                n_rows += 1
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except csv.Error as exc:
        raise UserError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if n_rows == 0:
        raise UserError(f"{path}: no data rows")
    guesses = [_guess(name, col, n_rows, target) for name, col in zip(header, counts)]
    if not any(g.type in ("real", "discrete", "categorical") and g.name != target for g in guesses):
        raise UserError(f"{path}: no column left to model besides the target (every other column is skipped)")
    schema = {"columns": [{"name": g.name, "type": g.type} for g in guesses], "target": target,
              "header": True, "delimiter": delimiter, "missing": list(MISSING)}
    return schema, guesses


def schema_json(schema: dict) -> str:
    """``schema`` as JSON text with one column per line, easy to edit by hand."""
    import json

    cols = ",\n  ".join(json.dumps(c) for c in schema["columns"])
    rest = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in schema.items() if k != "columns")
    return "{\"columns\": [\n  " + cols + "],\n " + rest + "}\n"


def schema_table(guesses: list[ColumnGuess]) -> str:
    """The guesses as an aligned text table: column, type, why."""
    width = max(len("column"), *(len(g.name) for g in guesses))
    lines = [f"  {'column':<{width}}  {'type':<11}  why"]
    lines += [f"  {g.name:<{width}}  {g.type:<11}  {g.why}" for g in guesses]
    return "\n".join(lines)
