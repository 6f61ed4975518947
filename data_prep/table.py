"""The raw table every loader returns, before preprocessing and partitioning.

Shapes: ``x`` is ``(n, D)`` over ``features`` (the target is *not* a column of ``x``; it lives
in ``y``). Categorical columns hold integer codes into ``categories[name]`` as floats, NaN is
a missing value. Image tables keep their pixels as small unsigned integers (levels) so that a
60k-image set stays near its raw size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpifc.errors import UserError

META_TYPES = ("real", "discrete", "categorical")


@dataclass
class RawTable:
    """A loaded dataset: features, meta-types, target and the dataset's own split.

    Attributes:
        name: dataset name as given on the command line, e.g. ``"adult"`` or ``"debd:nltcs"``.
        x: ``(n, D)`` raw values; float64 with NaN for missing, or uint8 pixel levels.
        features: ``D`` feature names (target excluded), the canonical order.
        meta_types: ``D`` raw meta-types, each one of ``META_TYPES``.
        categories: for each categorical feature, its category labels; code ``c`` means
            ``categories[name][c]``.
        y: ``(n,)`` int64 class codes into ``classes``, or None for unlabelled data.
        target: name of the target, or None.
        classes: original class labels, or None.
        ids: ``(n,)`` int64 global sample ids (row number in the dataset's files, in
            ``source_splits`` order); kept through subsampling so ids stay stable.
        own_test: ``(n,)`` bool, True for rows of the dataset's own test file, or None when
            the dataset has no split of its own.
        own_valid: ``(n,)`` bool, True for rows of the dataset's own validation file, or None
            when it has none (never True where ``own_test`` is).
        source_splits: id ranges ``[lo, hi)`` of each source file part, e.g. ``{"train":
            [0, 32561], "test": [32561, 48842]}``.
        image_shape: ``(height, width)`` for image data whose features are ``px_r_c``.
        pixel: for images, ``{"levels": L, "file_scale": s}``: a stored level ``v`` in
            ``0..L-1`` was ``v * s`` in the source file.
        standardize_default: whether ``--standardize`` is on unless the user says otherwise.
        source_files: the files read, for the manifest.
        schema_info: for a user's table (``csv``), ``{"schema", "source", "guesses"}``: the
            schema it was read with, where that came from (a file, or ``"inferred"``) and, when
            inferred, each column's :class:`~data_prep.infer.ColumnGuess`; else None.
    """

    name: str
    x: np.ndarray
    features: list[str]
    meta_types: list[str]
    categories: dict[str, list[str]] = field(default_factory=dict)
    y: np.ndarray | None = None
    target: str | None = None
    classes: list | None = None
    ids: np.ndarray | None = None
    own_test: np.ndarray | None = None
    own_valid: np.ndarray | None = None
    source_splits: dict[str, list[int]] = field(default_factory=dict)
    image_shape: tuple[int, int] | None = None
    pixel: dict | None = None
    standardize_default: bool = True
    source_files: list[str] = field(default_factory=list)
    schema_info: dict | None = None

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.x.ndim != 2 or self.x.shape[1] != len(self.features):
            raise ValueError(f"x has shape {self.x.shape}, expected (n, {len(self.features)})")
        if len(self.meta_types) != len(self.features):
            raise ValueError("one meta-type per feature is required")
        bad = [m for m in self.meta_types if m not in META_TYPES]
        if bad:
            raise ValueError(f"unknown meta-type {bad[0]!r}")
        if len(set(self.features)) != len(self.features):
            raise UserError(f"{self.name}: duplicate feature names")
        if self.target is not None and self.target in self.features:
            raise UserError(f"{self.name}: target {self.target!r} is also listed as a feature")
        if self.ids is None:
            self.ids = np.arange(n, dtype=np.int64)
        if self.y is not None and self.y.shape != (n,):
            raise ValueError("y must have one class code per row")
        if self.own_test is not None and self.own_test.shape != (n,):
            raise ValueError("own_test must have one flag per row")
        if self.own_valid is not None and self.own_valid.shape != (n,):
            raise ValueError("own_valid must have one flag per row")

    @property
    def n_rows(self) -> int:
        return int(self.x.shape[0])

    def take(self, rows: np.ndarray) -> "RawTable":
        """The same table restricted to ``rows`` (positions), ids kept."""
        return RawTable(
            name=self.name, x=self.x[rows], features=self.features,
            meta_types=self.meta_types, categories=self.categories,
            y=None if self.y is None else self.y[rows], target=self.target,
            classes=self.classes, ids=self.ids[rows],
            own_test=None if self.own_test is None else self.own_test[rows],
            own_valid=None if self.own_valid is None else self.own_valid[rows],
            source_splits=self.source_splits, image_shape=self.image_shape,
            pixel=self.pixel, standardize_default=self.standardize_default,
            source_files=self.source_files, schema_info=self.schema_info)


def pixel_names(height: int, width: int) -> list[str]:
    """Row-major pixel feature names ``px_r_c`` for an image of ``height x width``."""
    return [f"px_{r}_{c}" for r in range(height) for c in range(width)]
