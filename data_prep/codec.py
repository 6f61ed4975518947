"""Rows in the user's units and labels <-> rows in model units: the preprocessing a model carries.

A shard set's manifest holds everything needed to turn a user's raw row (CSV text, original
units, category and class labels) into the float row a model was trained on, and back:
:class:`RowCodec` is built from it (:meth:`RowCodec.from_manifest`), travels in the model
file (:meth:`to_json`/:meth:`from_json`), and is what ``mpifc query`` and ``mpifc.load`` use.

On the way in (:meth:`encode`) a missing cell or a column left out stays NaN: the model
marginalises it, no value is imputed. No value is changed without a word either: a label never
seen in training, a fractional value in a discrete column, or a value of a level-coded column
that is not one of its levels is refused (:meth:`check_known`, one vectorised pass per column),
unless ``clip=True`` asks for the nearest known value instead. On the way out (:meth:`decode`)
real columns are unscaled, discrete ones come back as Python ints, and categorical columns and
the target as their labels (ints where every label of the column is a whole number).
"""
from __future__ import annotations

import math
from itertools import repeat
from typing import Any, Mapping, Sequence

import numpy as np

from mpifc.errors import UserError

from .preprocess import Preprocessor
from .transforms import to_levels

MISSING_TOKENS = ("", "?", "NA", "NaN", "nan", "null", "None")
"""Cell texts that mean "missing" in query rows."""


class RowCodec:
    """The model's columns (``features``, the target last if any) and how each maps to the user's.

    Attributes:
        features: model column names, in model order.
        target: the target column, or None.
        classes: the target's labels, ``classes[c]`` for class code ``c``.
        preprocessor: the fitted transform of the non-target columns, or None (identity: the
            model's units are the user's).
        skipped: columns of the user's table that the schema skipped (ids): a query may carry
            them, and they are left out.
    """

    def __init__(self, features: Sequence[str], target: str | None = None, classes: Sequence[Any] | None = None,
                 preprocessor: Preprocessor | None = None, skipped: Sequence[str] = ()) -> None:
        self.features = [str(f) for f in features]
        self.skipped = [str(f) for f in skipped]
        self.target = target
        self.classes = None if classes is None else [str(c) for c in classes]
        self.preprocessor = preprocessor
        self._pos = {f: j for j, f in enumerate(preprocessor.features)} if preprocessor else {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> "RowCodec":
        """The codec of a shard set (``manifest.json`` as a dict)."""
        pre = manifest.get("preprocessing")
        return cls(manifest["feature_order"], manifest.get("target"), manifest.get("classes"),
                   Preprocessor.from_json(pre) if pre and pre.get("columns") else None,
                   manifest.get("skipped_columns") or ())

    def to_json(self) -> dict:
        """JSON-ready state (what a model file stores)."""
        pre = None
        if self.preprocessor is not None:
            pre = self.preprocessor.to_json()
        return {"format": "mpifc-codec/1", "features": self.features, "target": self.target,
                "classes": self.classes, "preprocessing": pre, "skipped": self.skipped}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RowCodec":
        """Inverse of :meth:`to_json`.

        Raises:
            UserError: a malformed codec.
        """
        try:
            pre = data.get("preprocessing")
            return cls(data["features"], data.get("target"), data.get("classes"),
                       Preprocessor.from_json(pre) if pre else None, data.get("skipped") or ())
        except (KeyError, TypeError) as exc:
            raise UserError(f"codec: malformed ({exc})") from None

    # ------------------------------------------------------------------ columns
    def labels(self, name: str) -> list[str] | None:
        """The labels of a categorical column or of the target (None for a numeric column)."""
        if name == self.target:
            return self.classes
        if self.preprocessor is not None and name in self._pos:
            return self.preprocessor.categories.get(name) if self._is_categorical(name) else None
        return None

    def _is_categorical(self, name: str) -> bool:
        col = self.preprocessor.columns[self._pos[name]]
        return col.raw_meta_type == "categorical"

    def is_label_column(self, name: str) -> bool:
        """Whether ``name`` holds labels (a categorical feature or the target) in user units."""
        return self.labels(name) is not None

    def typed_labels(self, name: str) -> list[Any] | None:
        """:meth:`labels` as the user's file had them: ints when every label of the column is a
        whole number written as one (``"7"``, not ``"07"`` or ``"7.0"``), else strings."""
        labels = self.labels(name)
        if labels is None:
            return None
        try:
            as_int = [int(lab) for lab in labels]
        except ValueError:
            return list(labels)
        return as_int if all(str(v) == lab for v, lab in zip(as_int, labels)) else list(labels)

    def is_discrete(self, name: str) -> bool:
        """Whether ``name`` is a numeric column of whole numbers in the user's table."""
        return (self.preprocessor is not None and name in self._pos and not self.is_label_column(name)
                and self.preprocessor.columns[self._pos[name]].raw_meta_type == "discrete")

    # ------------------------------------------------------------------ user -> model
    def encode(self, columns: Mapping[str, Sequence[Any] | np.ndarray], source: str = "input",
               first_row: int = 1, clip: bool = False) -> np.ndarray:
        """User rows as model rows ``(n, len(features))`` float64; NaN = missing (marginalised).

        Args:
            columns: column name -> values in user units (text, numbers or labels; a missing cell
                is ``None``, NaN or one of :data:`MISSING_TOKENS`). Any subset of
                :attr:`features` (and of :attr:`skipped`, which are left out), all of one length.
            source: the file or object the rows came from (for error messages).
            first_row: the number of the first row in ``source`` (error messages name rows).
            clip: read a value the model does not know as the nearest one it knows, instead of
                refusing it (:meth:`check_known`).

        Raises:
            UserError: an unknown column, a non-numeric value in a numeric column, a label never
                seen in training, or (without ``clip``) a value the model does not know, naming
                ``source``, the row and the column.
        """
        return self.encode_checked(columns, source, first_row, clip)[0]

    def encode_checked(self, columns: Mapping[str, Sequence[Any] | np.ndarray], source: str = "input",
                       first_row: int = 1, clip: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode`, and a ``(n, len(features))`` bool mask of the cells ``clip`` changed."""
        unknown = [c for c in columns if c not in self.features and c not in self.skipped]
        if unknown:
            raise UserError(f"{source}: unknown column {unknown[0]!r}; the model's columns are "
                            f"{', '.join(self.features)}")
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise UserError(f"{source}: columns have different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        raw = np.full((len(self.features), n), np.nan)  # column-major: every step below is per column
        for j, name in enumerate(self.features):
            if name in columns:
                raw[j] = self._raw_column(name, columns[name], source, first_row)
        changed = self.check_known(raw.T, source, first_row, clip)  # a row-major view: clipped in place
        if self.preprocessor is not None and self.preprocessor.features:
            idx = [self.features.index(f) for f in self.preprocessor.features if f in self.features]
            cols = [self._pos[self.features[j]] for j in idx]
            block = raw[idx].T
            self.preprocessor.transform_inplace(block, columns=cols, impute=False)
            raw[idx] = block.T
        return raw.T, changed

    def check_known(self, raw: np.ndarray, source: str = "input", first_row: int = 1,
                    clip: bool = False) -> np.ndarray:
        """Refuse, or with ``clip`` replace in place, every numeric value the model does not know.

        A level-coded column (few distinct training values, :mod:`data_prep.transforms`) knows its
        levels only: any other value would be read as its nearest level. A discrete column knows
        whole numbers only. One vectorised pass per such column, so it costs little beside a
        query.

        Args:
            raw: ``(n, len(features))`` user-unit values over :attr:`features` (labels already
                codes; NaN = missing).

        Returns:
            ``(n, len(features))`` bool, True where ``clip`` changed a value.

        Raises:
            UserError: (without ``clip``) the first such value, naming ``source``, the row, the
                column, the value and what the model knows.
        """
        changed = np.zeros(raw.shape, dtype=bool)
        if self.preprocessor is None:
            return changed
        for j, name in enumerate(self.features):
            if name not in self._pos or self.is_label_column(name):
                continue
            col = self.preprocessor.columns[self._pos[name]]
            if col.levels is None and col.raw_meta_type != "discrete":
                continue
            v = raw[:, j]
            seen = ~np.isnan(v)
            if col.levels is not None:
                near = col.levels[to_levels(np.where(seen, v, col.levels[0]), col.levels).astype(np.int64)]
                bad = seen & ~np.isclose(v, near, rtol=1e-12, atol=0.0)
                known = "its levels " + _show(col.levels)
                if col.level_gaps is not None and col.level_gaps.any() and bad.any():
                    # a value where training rows too held values rarer than a level: read as
                    # its nearest level, as training read them (a discrete column: whole only)
                    held = col.level_gaps[np.searchsorted(col.levels, np.where(seen, v, col.levels[0]))]
                    whole = v == np.floor(v + 0.5) if col.raw_meta_type == "discrete" else True
                    bad &= ~(held & whole)
                    known += ", and values where training rows held rarer ones"
            else:
                near = np.floor(v + 0.5)
                bad = seen & (v != near)
                known = "whole numbers only (the column is discrete)"
            if not bad.any():
                continue
            if not clip:
                i = int(np.argmax(bad))
                raise UserError(f"{source}: row {first_row + i}, column {name!r}: {_num_text(v[i])} is not a value "
                                f"the model knows ({known}); --clip reads it as the nearest, {_num_text(near[i])}")
            v[bad] = near[bad]
            changed[:, j] = bad
        return changed

    def _raw_column(self, name: str, values: Sequence[Any] | np.ndarray, source: str, first_row: int) -> np.ndarray:
        """One column in raw model values (label codes, or numbers); NaN = missing.

        Whole columns go through numpy (numbers) or one dictionary look-up per cell (labels);
        a cell these cannot place is read by :meth:`_raw_cell`, which names it if it is bad."""
        labels = self.labels(name)
        if labels is None:
            fast = _numbers(values)
            if fast is not None:
                return fast
            return np.array([self._raw_cell(name, None, v, source, first_row + i) for i, v in enumerate(values)],
                            dtype=np.float64)
        lookup = self._label_lookup(name)
        try:  # -1: a cell the table does not hold
            codes = np.fromiter(map(lookup.get, values, repeat(-1.0)), dtype=np.float64, count=len(values))
        except TypeError:  # an unhashable cell: every cell the careful way
            codes = np.full(len(values), -1.0)
        bad = np.flatnonzero(codes < 0)
        if len(bad):
            seen: dict[Any, float] = {}
            for i in bad.tolist():
                v = values[i]
                try:
                    codes[i] = seen[v]
                except (KeyError, TypeError):
                    codes[i] = self._raw_cell(name, labels, v, source, first_row + i)
                    try:
                        seen[v] = codes[i]
                    except TypeError:
                        pass
        return codes

    def _label_lookup(self, name: str) -> dict[Any, float]:
        """``cell text -> code`` of a label column, the missing tokens mapping to NaN."""
        cache = self.__dict__.setdefault("_lookups", {})
        if name not in cache:
            table: dict[Any, float] = {lab: float(c) for c, lab in enumerate(self.labels(name) or [])}
            table.update({tok: math.nan for tok in MISSING_TOKENS})
            table[None] = math.nan
            table[np.nan] = math.nan  # the NaN objects pandas puts in an empty cell
            cache[name] = table
        return cache[name]

    def _raw_cell(self, name: str, labels: list[str] | None, v: Any, source: str, row: int) -> float:
        """One cell: a label's code (``labels`` given) or a finite number; NaN if missing."""
        if _is_missing(v):
            return math.nan
        if labels is not None:
            key = _label_text(v)
            try:
                return float(labels.index(key))
            except ValueError:
                shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
                raise UserError(f"{source}: row {row}, column {name!r}: category {key!r} was "
                                f"never seen in training (known: {shown})") from None
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise UserError(f"{source}: row {row}, column {name!r}: {v!r} is not a number") from None
        if not math.isfinite(x):
            raise UserError(f"{source}: row {row}, column {name!r}: {v!r} is not a finite number")
        return x

    # ------------------------------------------------------------------ model -> user
    def decode(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Model rows ``(n, len(features))`` in user units: ``{column: (n,)}``, float64 for real
        columns (NaN = missing), object arrays of Python ints for discrete columns and of labels
        for label columns (:meth:`typed_labels`; None = missing)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise UserError(f"rows have shape {x.shape}, expected (n, {len(self.features)}) over {self.features}")
        raw = x.copy()
        if self.preprocessor is not None and self.preprocessor.features:
            idx = [self.features.index(f) for f in self.preprocessor.features if f in self.features]
            cols = [self._pos[self.features[j]] for j in idx]
            raw[:, idx] = self.preprocessor.inverse_transform(raw[:, idx], columns=cols)
        out: dict[str, np.ndarray] = {}
        for j, name in enumerate(self.features):
            labels = self.typed_labels(name)
            if labels is None:
                if self.is_discrete(name):
                    out[name] = np.array([None if math.isnan(v) else int(round(v)) for v in raw[:, j]], dtype=object)
                else:
                    out[name] = raw[:, j]
                continue
            col = np.empty(len(raw), dtype=object)
            for i, v in enumerate(raw[:, j]):
                col[i] = None if math.isnan(v) else labels[min(max(int(round(v)), 0), len(labels) - 1)]
            out[name] = col
        return out


def _num_text(v: float) -> str:
    """A number as a user wrote it: ``2031``, ``2007.5``."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


def _show(levels: np.ndarray) -> str:
    """A column's levels for a message: all of them up to 8, else the first 3, ..., the last."""
    vals = [_num_text(v) for v in levels]
    return ", ".join(vals) if len(vals) <= 8 else ", ".join(vals[:3]) + f", ..., {vals[-1]} ({len(vals)} values)"


def _numbers(values: Sequence[Any] | np.ndarray) -> np.ndarray | None:
    """A numeric column as float64 in one numpy pass (numbers, number texts, missing tokens), or
    None when some cell needs a closer look (a word, an infinity, a token with spaces)."""
    a = values if isinstance(values, np.ndarray) else None
    try:
        if a is None:
            a = np.asarray(values)
        if a.dtype.kind == "O":
            a = a.astype(str)
        if a.dtype.kind == "U":
            a = a.reshape(-1)
            missing = np.zeros(a.shape, dtype=bool)
            for tok in MISSING_TOKENS:
                missing |= a == tok
            if missing.any():
                a = np.where(missing, "nan", a)
            out = a.astype(np.float64)
        elif a.dtype.kind in "biuf":
            out = a.astype(np.float64).reshape(-1)
        else:
            return None
    except (ValueError, TypeError, OverflowError):
        return None
    return None if np.isinf(out).any() else out


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, str):
        return v.strip() in MISSING_TOKENS
    try:
        return bool(np.isnan(v))
    except TypeError:
        return False


def _label_text(v: Any) -> str:
    """A label as the text it is compared by: ``1.0`` and ``"1"`` name the same class."""
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)
