"""Streaming parser for delimited text files (CSV and its cousins such as UCI's ``", "``).

Values go straight into one row-major typed array (8 bytes a cell) instead of lists of
strings, and the result is a view on that array, so the peak memory of a load stays near the
size of the file. Every error names the file, the line and, where it applies, the field.
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
    """Result of :meth:`DelimitedParser.finish`.

    Attributes:
        values: ``(n, k)`` float64 over ``names`` (the non-skipped columns, file order); NaN
            is missing; categoricals and the target hold codes.
        names: the ``k`` column names.
        categories: categorical name -> sorted category labels.
        y: ``(n,)`` int64 codes of the target column, or None.
        classes: labels of the target codes (ints when every label is an integer).
    """

    values: np.ndarray
    names: list[str]
    categories: dict[str, list[str]]
    y: np.ndarray | None
    classes: list | None

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])

    def column(self, name: str) -> np.ndarray:
        """``(n,)`` values of column ``name`` (a view)."""
        return self.values[:, self.names.index(name)]


def _sorted_labels(labels: list[str]) -> list:
    """Integers sort numerically (and come back as ints), anything else as strings."""
    try:
        as_int = [int(s) for s in labels]
    except ValueError:
        return sorted(labels)
    return sorted(as_int)


def _recode(column: np.ndarray, seen: dict[str, int]) -> list:
    """Turn first-seen codes into codes in sorted label order, in place; returns the labels.

    Sorted codes make the coding independent of the row order.
    """
    labels = list(seen)
    ordered = _sorted_labels(labels)
    position = {str(lab): i for i, lab in enumerate(ordered)}
    remap = np.array([position[lab] for lab in labels] + [np.nan], dtype=np.float64)
    idx = np.where(np.isnan(column), len(labels), column).astype(np.int64)
    column[:] = remap[idx]
    return ordered


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
        for spec in columns:
            if spec.kind not in KINDS:
                raise ValueError(f"unknown column kind {spec.kind!r}")
        if sum(s.kind == "target" for s in columns) > 1:
            raise ValueError("at most one target column")
        self.columns = columns
        self.delimiter = delimiter
        self.missing = missing
        self.n_rows = 0
        self._kept = [j for j, s in enumerate(columns) if s.kind != "skip"]
        self._store = array("d")
        # field index -> first-seen label codes, for categorical and target fields
        self._seen: dict[int, dict[str, int]] = {
            j: {} for j, s in enumerate(columns) if s.kind in ("categorical", "target")}
        self._target = next((j for j, s in enumerate(columns) if s.kind == "target"), None)

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
                column, a non-finite number, a non-integer in a discrete column, or a missing
                target label; on text that is not
                UTF-8 or a file without rows. A parser that raised is spent.
        """
        reader = csv.reader(lines, delimiter=self.delimiter, skipinitialspace=True)
        try:
            n_rows = self._feed_rows(reader, path, skip_prefix, strip_suffix, header)
        except UnicodeDecodeError:
            # decoding runs ahead of parsing by a buffer, so the line is approximate
            raise UserError(f"{path}: not UTF-8 text (near line {reader.line_num + 1})") from None
        except csv.Error as exc:
            raise UserError(f"{path} line {reader.line_num}: {exc}") from None
        except (OSError, EOFError) as exc:  # e.g. a truncated .gz
            raise UserError(f"{path}: cannot read ({exc})") from None
        if n_rows == 0:
            raise UserError(f"{path}: no data rows")
        self.n_rows += n_rows
        return n_rows

    def _feed_rows(self, reader, path: str, skip_prefix: str | None, strip_suffix: str,
                   header: bool) -> int:
        columns, missing, seen_of = self.columns, self.missing, self._seen
        append = self._store.append
        kept = [(j, seen_of.get(j)) for j in self._kept]
        n_fields = len(columns)
        discrete = [s.kind == "discrete" for s in columns]
        target_col = self._target
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
            if len(row) != n_fields:
                raise UserError(f"{path} line {reader.line_num}: expected {n_fields} fields, "
                                f"got {len(row)}")
            for j, seen in kept:
                tok = row[j].strip()
                if seen is not None:
                    if j == target_col and strip_suffix and tok.endswith(strip_suffix):
                        tok = tok[: -len(strip_suffix)]
                    if tok in missing:
                        if j == target_col:
                            raise UserError(f"{path} line {reader.line_num}, field "
                                            f"{columns[j].name!r}: missing target label")
                        append(nan)
                        continue
                    code = seen.get(tok)
                    if code is None:
                        code = seen[tok] = len(seen)
                    append(code)
                    continue
                if tok in missing:
                    append(nan)
                    continue
                try:
                    value = float(tok)
                except ValueError:
                    raise UserError(f"{path} line {reader.line_num}, field "
                                    f"{columns[j].name!r}: {tok!r} is not a number") from None
                if math.isinf(value):
                    raise UserError(f"{path} line {reader.line_num}, field "
                                    f"{columns[j].name!r}: {tok!r} is not finite")
                if discrete[j] and not value.is_integer() and value == value:  # NaN: missing
                    raise UserError(f"{path} line {reader.line_num}, field "
                                    f"{columns[j].name!r}: {tok!r} is not an integer (the column is "
                                    f"declared discrete)")
                append(value)
            n_rows += 1
        return n_rows

    def finish(self) -> ParsedColumns:
        """The typed columns of every row fed so far, as a view on the parser's buffer."""
        names = [self.columns[j].name for j in self._kept]
        values = np.frombuffer(self._store, dtype=np.float64).reshape(self.n_rows, len(names))
        categories: dict[str, list[str]] = {}
        y = classes = None
        for k, j in enumerate(self._kept):
            if j not in self._seen:
                continue
            labels = _recode(values[:, k], self._seen[j])
            if j == self._target:
                y, classes = values[:, k].astype(np.int64), labels
            else:
                categories[names[k]] = [str(lab) for lab in labels]
        return ParsedColumns(values=values, names=names, categories=categories, y=y,
                             classes=classes)


def feature_matrix(parsed: ParsedColumns, specs: list[ColumnSpec]
                   ) -> tuple[np.ndarray, list[str], list[str]]:
    """The feature columns of ``parsed`` (target and skipped ones left out).

    A view, without copying, when the features are adjacent (e.g. the target is last).

    Returns:
        ``x`` of shape ``(n, D)`` float64, the ``D`` feature names, their meta-types.
    """
    kinds = {s.name: s.kind for s in specs}
    pos = [k for k, name in enumerate(parsed.names)
           if kinds[name] in ("real", "discrete", "categorical")]
    if pos and pos == list(range(pos[0], pos[0] + len(pos))):
        x = parsed.values[:, pos[0]:pos[0] + len(pos)]
    else:
        x = parsed.values[:, pos]
    names = [parsed.names[k] for k in pos]
    return x, names, [kinds[n] for n in names]
