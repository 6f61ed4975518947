"""Named, typed features and their expanded (one-hot) unit layout.

Data conventions (the same as ``mpifc.circuit``): a data matrix ``x`` is ``(n, d)`` float64, column
``j`` holds feature ``schema.features[j]``; a categorical value is an integer-valued float
``0..k-1``; NaN means "unknown" where a function says so (inference, sampling evidence) and is an
error everywhere else.

An NGM sees each real feature as one unit and each categorical feature with ``k`` values as ``k``
units (one-hot on the input side, logits on the output side), so the input and the output layers
share one unit layout, :meth:`Schema.unit_slices`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mpifc.errors import UserError

REAL = "real"
CATEGORICAL = "categorical"


@dataclass(frozen=True)
class Feature:
    """One feature.

    Attributes:
        name: unique within a schema.
        kind: ``"real"`` or ``"categorical"``.
        n_categories: number of values ``k`` of a categorical (>= 2); 1 for a real.
    """

    name: str
    kind: str = REAL
    n_categories: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UserError(f"feature name must be a non-empty string, got {self.name!r}")
        if self.kind not in (REAL, CATEGORICAL):
            raise UserError(f"feature {self.name!r}: kind must be 'real' or 'categorical', got {self.kind!r}")
        if self.kind == CATEGORICAL and self.n_categories < 2:
            raise UserError(f"feature {self.name!r}: a categorical needs n_categories >= 2, got {self.n_categories}")
        if self.kind == REAL and self.n_categories != 1:
            raise UserError(f"feature {self.name!r}: a real feature has n_categories 1, got {self.n_categories}")

    @property
    def is_categorical(self) -> bool:
        return self.kind == CATEGORICAL

    @property
    def width(self) -> int:
        """Number of expanded units (1 for a real, k for a categorical)."""
        return self.n_categories if self.is_categorical else 1


def real(name: str) -> Feature:
    """A real-valued feature."""
    return Feature(name, REAL, 1)


def categorical(name: str, n_categories: int) -> Feature:
    """A categorical feature with values ``0..n_categories-1``."""
    return Feature(name, CATEGORICAL, int(n_categories))


@dataclass(frozen=True)
class Schema:
    """An ordered tuple of features with unique names."""

    features: tuple[Feature, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        seen: set[str] = set()
        for f in self.features:
            if f.name in seen:
                raise UserError(f"feature {f.name!r} appears twice in the schema")
            seen.add(f.name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_units(self) -> int:
        """Width of the expanded input (and output) layer."""
        return sum(f.width for f in self.features)

    def index(self, name: str) -> int:
        """Column of feature ``name``."""
        try:
            return self.names.index(name)
        except ValueError:
            raise UserError(f"unknown feature {name!r}; the schema has {list(self.names)}") from None

    def __getitem__(self, name: str) -> Feature:
        return self.features[self.index(name)]

    def unit_slices(self) -> list[slice]:
        """Per feature, its slice of the expanded unit layout."""
        out, start = [], 0
        for f in self.features:
            out.append(slice(start, start + f.width))
            start += f.width
        return out

    def unit_owner(self) -> np.ndarray:
        """``(n_units,)`` int: the feature index that owns each expanded unit."""
        return np.repeat(np.arange(self.n_features), [f.width for f in self.features])

    def subset(self, names: Sequence[str]) -> "Schema":
        """The features ``names``, in that order."""
        return Schema(tuple(self[n] for n in names))

    def concat(self, other: "Schema") -> "Schema":
        """This schema followed by ``other`` (names must stay unique)."""
        return Schema(self.features + other.features)

    def validate(self, x: np.ndarray, *, allow_nan: bool = False, what: str = "data") -> np.ndarray:
        """Check ``x`` against the schema and return it as float64 ``(n, d)``.

        Raises:
            UserError: naming the feature at fault (wrong width, NaN/inf, bad category code).
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise UserError(f"{what}: expected a 2-D array with {self.n_features} columns "
                            f"{list(self.names)}, got shape {x.shape}")
        for j, f in enumerate(self.features):
            col = x[:, j]
            nan = np.isnan(col)
            if nan.any() and not allow_nan:
                raise UserError(f"{what}: feature {f.name!r} has {int(nan.sum())} missing (NaN) values")
            vals = col[~nan]
            if not np.isfinite(vals).all():
                raise UserError(f"{what}: feature {f.name!r} has infinite values")
            if f.is_categorical:
                bad = (vals != np.round(vals)) | (vals < 0) | (vals >= f.n_categories)
                if bad.any():
                    raise UserError(f"{what}: feature {f.name!r} is categorical with codes 0..{f.n_categories - 1}, "
                                    f"got {vals[bad][0]!r}")
        return x

    def to_dict(self) -> dict:
        """Plain JSON-able form, for transport as a feature declaration."""
        return {"features": [[f.name, f.kind, f.n_categories] for f in self.features]}

    @staticmethod
    def from_dict(d: dict) -> "Schema":
        try:
            return Schema(tuple(Feature(str(n), str(k), int(c)) for n, k, c in d["features"]))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"malformed schema dict: {e}") from None
