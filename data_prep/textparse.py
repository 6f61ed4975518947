"""Streaming parser for delimited text files (CSV and its cousins such as UCI's ``", "``).

Values go straight into typed arrays (8 bytes a cell) instead of lists of strings, so the
peak memory of a load stays near the size of the file. Every error names the file, the
line and, where it applies, the field.
"""
from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from mpifc.errors import UserError

KINDS = ("real", "discrete", "categorical", "target", "skip")


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a delimited file: its name and how to read it (one of ``KINDS``)."""

    name: str
    kind: str


@dataclass
class ParsedColumns:
    """Result of :func:`parse_delimited`.

    Attributes:
        values: name -> ``(n,)`` float64; NaN is missing; categoricals are codes.
        categories: categorical name -> sorted category labels.
        y: ``(n,)`` int64 codes of the target column, or None.
        classes: labels of the target codes (ints when every label is an integer).
        n_rows: number of data rows read.
    """

    values: dict[str, np.ndarray]
    categories: dict[str, list[str]]
    y: np.ndarray | None
    classes: list | None
    n_rows: int


def _sorted_labels(labels: list[str]) -> list:
    """Integers sort numerically (and come back as ints), anything else as strings."""
    try:
        as_int = [int(s) for s in labels]
    except ValueError:
        return sorted(labels)
    return sorted(as_int)


def _recode(codes: array, seen: dict[str, int]) -> tuple[np.ndarray, list]:
    """Map first-seen codes to codes in sorted label order (deterministic across row orders)."""
    labels = list(seen)
    ordered = _sorted_labels(labels)
    position = {str(lab): i for i, lab in enumerate(ordered)}
    remap = np.array([position[lab] for lab in labels] + [np.nan], dtype=np.float64)
    raw = np.frombuffer(codes, dtype=np.float64)
    idx = np.where(np.isnan(raw), len(labels), raw).astype(np.int64)
    return remap[idx], ordered


class DelimitedParser:
    """Parses one or more delimited files with the same columns into typed columns.

    Several files (e.g. ``adult.data`` then ``adult.test``) share one category coding; the
    rows come out in feed order.

    Args:
        columns: one spec per field, in file order; at most one ``target``.
        delimiter: field separator; blanks after it are skipped, so ``", "`` files work.
        missing: tokens that mean a missing value.
    """

    def __init__(self, columns: list[ColumnSpec], *, delimiter: str = ",",
                 missing: frozenset[str] = frozenset({"", "?", "NA"})) -> None:
        self.columns = columns
        self.delimiter = delimiter
        self.missing = missing
        self.n_rows = 0
        self._stores: list[array | None] = []
        self._seen: dict[int, dict[str, int]] = {}
        self._target = None
        for j, spec in enumerate(columns):
            if spec.kind not in KINDS:
                raise ValueError(f"unknown column kind {spec.kind!r}")
            self._stores.append(None if spec.kind == "skip" else array("d"))
            if spec.kind in ("categorical", "target"):
                self._seen[j] = {}
            if spec.kind == "target":
                self._target = j

    def feed(self, lines: Iterable[str], path: str, *, skip_prefix: str | None = None,
             strip_suffix: str = "", header: bool = False) -> int:
        """Parse one file's lines; returns the number of data rows it had.

        Args:
            lines: the file's text lines (an open text file works).
            path: file name used in error messages.
            skip_prefix: lines starting with it are ignored (UCI's ``|1x3 Cross validator``).
            strip_suffix: removed from the end of target labels (``adult.test``'s ``>50K.``).
            header: whether the first non-skipped line is a header (not checked here).

        Raises:
            UserError: on a line with the wrong number of fields, a non-number in a numeric
                column, a non-finite number, or a missing target label.
        """
        columns, stores, missing = self.columns, self._stores, self.missing
        n_fields = len(columns)
        target_col = self._target
        reader = csv.reader(lines, delimiter=self.delimiter, skipinitialspace=True)
        header_pending = header
        n_rows = 0
        nan = math.nan
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if skip_prefix is not None and row[0].startswith(skip_prefix):
                continue
            if header_pending:
                header_pending = False
                continue
            lineno = reader.line_num
            if len(row) != n_fields:
                raise UserError(f"{path} line {lineno}: expected {n_fields} fields, "
                                f"got {len(row)}")
            for j, tok in enumerate(row):
                store = stores[j]
                if store is None:
                    continue
                tok = tok.strip()
                seen = self._seen.get(j)
                if seen is not None:
                    if j == target_col and strip_suffix and tok.endswith(strip_suffix):
                        tok = tok[: -len(strip_suffix)]
                    if tok in missing:
                        if j == target_col:
                            raise UserError(f"{path} line {lineno}, field "
                                            f"{columns[j].name!r}: missing target label")
                        store.append(nan)
                        continue
                    code = seen.get(tok)
                    if code is None:
                        code = seen[tok] = len(seen)
                    store.append(code)
                    continue
                if tok in missing:
                    store.append(nan)
                    continue
                try:
                    value = float(tok)
                except ValueError:
                    raise UserError(f"{path} line {lineno}, field {columns[j].name!r}: "
                                    f"{tok!r} is not a number") from None
                if math.isinf(value):
                    raise UserError(f"{path} line {lineno}, field {columns[j].name!r}: "
                                    f"{tok!r} is not finite")
                store.append(value)
            n_rows += 1
        if n_rows == 0:
            raise UserError(f"{path}: no data rows")
        self.n_rows += n_rows
        return n_rows

    def finish(self) -> ParsedColumns:
        """The typed columns of every row fed so far (the parser is spent afterwards)."""
        values: dict[str, np.ndarray] = {}
        categories: dict[str, list[str]] = {}
        y = classes = None
        for j, spec in enumerate(self.columns):
            store = self._stores[j]
            if store is None:
                continue
            if j == self._target:
                codes, classes = _recode(store, self._seen[j])
                y = codes.astype(np.int64)
            elif spec.kind == "categorical":
                values[spec.name], labels = _recode(store, self._seen[j])
                categories[spec.name] = [str(lab) for lab in labels]
            else:
                values[spec.name] = np.frombuffer(store, dtype=np.float64).copy()
            self._stores[j] = None  # free each column's buffer before the next is converted
        return ParsedColumns(values=values, categories=categories, y=y, classes=classes,
                             n_rows=self.n_rows)


def feature_matrix(parsed: ParsedColumns, specs: list[ColumnSpec]
                   ) -> tuple[np.ndarray, list[str], list[str]]:
    """Stack the parsed feature columns (target and skipped ones left out).

    Returns:
        ``x`` of shape ``(n, D)`` float64, the ``D`` feature names, their meta-types.
    """
    feats = [s for s in specs if s.kind in ("real", "discrete", "categorical")]
    x = np.empty((parsed.n_rows, len(feats)), dtype=np.float64)
    for j, s in enumerate(feats):
        x[:, j] = parsed.values.pop(s.name)  # pop: each column is freed once copied
    return x, [s.name for s in feats], [s.kind for s in feats]
