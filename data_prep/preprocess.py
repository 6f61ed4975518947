"""Leak-free preprocessing as in the paper's appendix E.1: target encoding of categoricals,
median imputation, standardization; and, for density models on real tables, level codes for
few-valued columns and a scale chosen per real column (:mod:`data_prep.transforms`).

Every statistic is fitted on the training rows only; the test rows are only ever transformed.
The fitted transform is a set of plain lookup tables and numbers, so it can be written to the
manifest and applied shard by shard without holding a float copy of the whole dataset.

Column kinds after :meth:`Preprocessor.fit` (``ColumnTransform.kind``):

* ``levels``: a numeric column with at most ``max_levels`` distinct training values, or a
  target-encoded categorical: the level code ``0..k-1`` (meta-type ``discrete``; a numeric
  value that fewer than :data:`~data_prep.transforms.MIN_ROWS` training rows hold is no level
  of its own, see :func:`~data_prep.transforms.few_levels`). A
  target-encoded categorical's levels are its categories ordered by their encoding (then by
  code), so neighbouring codes have similar class rates; a missing category is a level of its
  own when training rows miss it.
* ``standardize``: ``(x - mean) / std``; ``normal-score``: :class:`~data_prep.transforms.NormalScore`
  (meta-type ``real``).
* ``target-encoding``: a categorical as the class rate of its category, as a real (manifests
  written before level codes; ``max_levels=0``).
* ``codes``: a categorical kept as its codes (``--categoricals codes``, and ``auto`` unless the
  target has two classes); ``none``: values as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import mpifc.progress as progress
from mpifc.errors import UserError

from .table import RawTable
from .transforms import MAX_LEVELS, MIN_ROWS, SCALES, NormalScore, few_levels, from_levels, safe_median, \
    select_scales, to_levels, validation_split

ENCODINGS = ("target", "none")
"""How :meth:`Preprocessor.fit` treats categoricals: target encoding (binary targets) or codes."""
_CHUNK = 4096  # rows converted to float64 at a time while fitting (bounds peak memory)


@dataclass
class ColumnTransform:
    """The fitted transform of one feature: ``out = (encode_impute(raw) - mean) / std``.

    Attributes:
        raw_meta_type: meta-type in the source data.
        meta_type: meta-type of the transformed values.
        n_categories: categories of a categorical feature kept as codes, else None.
        lookup: for target-encoded columns, ``(k + 1,)`` values by code; the last entry is
            the value of a missing category.
        impute: value that replaces NaN, or None (no imputation, or nothing can be missing).
        mean, std: standardization, or None.
        levels: for a numeric level-coded column, ``(k,)`` its levels (ascending).
        level_gaps: for a numeric level-coded column, ``(k + 1,)`` bool: whether training rows
            held values (each rarer than :data:`~data_prep.transforms.MIN_ROWS` rows, so no
            level) below the first level (0), between levels ``g - 1`` and ``g`` (g), or above
            the last (k). Such values were read as their nearest level in training, and a
            query may give them too; a value in a gap that no training row held is one the
            model does not know (:meth:`data_prep.codec.RowCodec.check_known`). None: unknown.
        level_codes: for a level-coded categorical, ``(k,)`` the category code of each level
            (``-1``: the missing category).
        normal: the normal-score transform of a real column, or None.
        selection: validation log-likelihood (nats per row) of each candidate scale, when the
            scale was chosen on validation rows.
    """

    raw_meta_type: str
    meta_type: str
    n_categories: int | None = None
    lookup: np.ndarray | None = None
    impute: float | None = None
    mean: float | None = None
    std: float | None = None
    levels: np.ndarray | None = None
    level_gaps: np.ndarray | None = None
    level_codes: np.ndarray | None = None
    normal: NormalScore | None = None
    selection: dict[str, float] | None = None

    @property
    def kind(self) -> str:
        """What the column became (see the module doc)."""
        if self.levels is not None or self.level_codes is not None:
            return "levels"
        if self.normal is not None:
            return "normal-score"
        if self.lookup is not None:
            return "target-encoding"
        if self.mean is not None:
            return "standardize"
        return "codes" if self.raw_meta_type == "categorical" else "none"

    def code_rank(self) -> np.ndarray:
        """For a level-coded categorical: ``(n_cat + 1,)`` the level of each category code, the
        last entry the missing category's (nearest by encoding when it has no level)."""
        n_cat = self.lookup.size - 1
        rank = np.empty(n_cat + 1, dtype=np.float64)
        codes = np.where(self.level_codes < 0, n_cat, self.level_codes)
        rank[codes] = np.arange(codes.size)
        if not np.any(self.level_codes < 0):
            enc = self.lookup[np.maximum(self.level_codes, 0)]
            rank[n_cat] = float(np.argmin(np.abs(enc - self.lookup[n_cat])))
        return rank


class Preprocessor:
    """A fitted column-wise transform from raw table values to shard values.

    Build it with :meth:`fit`; apply it to any rows with :meth:`transform`.
    """

    def __init__(self, features: list[str], columns: list[ColumnTransform], *, encode: str,
                 impute: bool, standardize: bool, n_fit_rows: int,
                 categories: dict[str, list[str]]) -> None:
        self.features = features
        self.columns = columns
        self.encode = encode
        self.impute = impute
        self.standardize = standardize
        self.n_fit_rows = n_fit_rows
        self.categories = categories
        self.selection: dict | None = None

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, table: RawTable, train_rows: np.ndarray, *, encode: str = "target",
            impute: bool = True, standardize: bool = True, scale: str = "standardize",
            max_levels: int = 0, seed: int = 0) -> "Preprocessor":
        """Fit on ``table.x[train_rows]`` (and ``table.y[train_rows]`` for target encoding).

        Args:
            table: the raw table; only its ``train_rows`` are looked at.
            train_rows: ``(n_train,)`` row positions.
            encode: ``"target"`` (sklearn TargetEncoder, binary targets) or ``"none"``
                (categoricals stay integer codes).
            impute: replace missing values by the train median (a point beside it when fewer
                than k rows hold it, :func:`~data_prep.transforms.safe_median`; categorical
                codes: the most frequent code; target-encoded columns encode missing as a
                category).
            standardize: scale the numeric columns (constant columns get ``std = 1``); off, they
                keep their values.
            scale: how a real column is scaled: ``"standardize"``, ``"normal-score"``, or
                ``"auto"`` (chosen per column on validation rows carved from ``train_rows``,
                :func:`~data_prep.transforms.select_scale`).
            max_levels: with ``standardize``, numeric columns with at most this many distinct
                training values, and target-encoded categoricals, become level codes (0: off).
            seed: draws the validation rows of ``scale="auto"``.

        Raises:
            UserError: target encoding asked for without a binary target, or an unknown scale.
        """
        if encode not in ENCODINGS:
            raise UserError(f"categorical encoding must be one of {', '.join(ENCODINGS)}, not {encode!r}")
        if scale not in SCALES:
            raise UserError(f"--scale must be one of {', '.join(SCALES)}, not {scale!r}")
        train_rows = np.asarray(train_rows, dtype=np.int64)
        columns = [ColumnTransform(raw_meta_type=m, meta_type=m) for m in table.meta_types]
        cat_idx = [j for j, m in enumerate(table.meta_types) if m == "categorical"]
        for j in cat_idx:
            columns[j].n_categories = len(table.categories[table.features[j]])
        if encode == "target" and cat_idx:
            _fit_target_encoding(table, train_rows, cat_idx, columns)
        may_be_missing = np.issubdtype(table.x.dtype, np.floating)
        if impute and may_be_missing:
            for j, col in enumerate(columns):
                if col.lookup is not None:
                    continue
                values = table.x[train_rows, j]
                seen = values[~np.isnan(values)]
                if seen.size == 0:
                    raise UserError(f"{table.name}: feature {table.features[j]!r} has no "
                                    "observed value in the training rows")
                if col.raw_meta_type == "categorical":
                    col.impute = float(np.bincount(seen.astype(np.int64)).argmax())
                else:
                    col.impute = safe_median(seen)  # no value fewer than k rows hold
        pre = cls(list(table.features), columns, encode=encode, impute=impute,
                  standardize=standardize, n_fit_rows=int(train_rows.size),
                  categories=table.categories)
        if standardize and max_levels > 0:
            _fit_levels(pre, table, train_rows, max_levels)
        if standardize:
            scaled = [j for j, c in enumerate(columns)
                      if c.meta_type != "categorical" and c.kind not in ("levels",)]
            if scale == "standardize" or not scaled:
                _fit_standardize(pre, table.x, train_rows, scaled)
            else:
                pre.selection = _fit_scales(pre, table, train_rows, scaled, scale, seed)
        return pre

    # ------------------------------------------------------------------ applying
    def transform(self, x: np.ndarray, *, columns: list[int] | None = None,
                  scale: bool = True) -> np.ndarray:
        """Transform raw rows into float64.

        Args:
            x: ``(m, D)`` raw values over :attr:`features`, any numeric dtype; or, with
                ``columns``, ``(m, len(columns))`` raw values of just those features.
            columns: positions (into :attr:`features`) of the columns in ``x``.
            scale: apply standardization (False gives the encoded, imputed values).

        Returns:
            ``x``'s shape, float64.
        """
        out = np.array(x, dtype=np.float64, copy=True)
        self.transform_inplace(out, columns=columns, scale=scale)
        return out

    def transform_inplace(self, out: np.ndarray, *, columns: list[int] | None = None,
                          scale: bool = True, impute: bool = True) -> None:
        """Like :meth:`transform`, overwriting ``out`` (float64 raw values, may be a view).

        ``impute=False`` keeps a missing value missing (NaN) in every column, target-encoded
        ones included: what a query needs, where a missing value is marginalised.
        """
        cols = [self.columns[j] for j in columns] if columns is not None else self.columns
        for k, col in enumerate(cols):
            if col.lookup is not None:
                codes = out[:, k]
                missing = np.isnan(codes)
                idx = np.where(missing, col.lookup.size - 1, codes).astype(np.int64)
                out[:, k] = col.code_rank()[idx] if col.level_codes is not None else col.lookup[idx]
                if not impute:
                    out[missing, k] = np.nan
            elif col.impute is not None and impute:
                column = out[:, k]
                column[np.isnan(column)] = col.impute
        if scale and self.standardize:
            idx = [k for k, c in enumerate(cols) if c.mean is not None]
            if idx:
                mean = np.array([cols[k].mean for k in idx])
                std = np.array([cols[k].std for k in idx])
                if len(idx) == out.shape[1]:
                    out -= mean  # in place: image shards are the largest arrays we build
                    out /= std
                else:
                    out[:, idx] = (out[:, idx] - mean) / std
            for k, col in enumerate(cols):
                if col.normal is not None:
                    out[:, k] = col.normal.forward(out[:, k])
                elif col.levels is not None:
                    out[:, k] = to_levels(out[:, k], col.levels)

    def inverse_transform(self, x: np.ndarray, *, columns: list[int] | None = None) -> np.ndarray:
        """Shard values back to raw values: the inverse of :meth:`transform` (NaN stays NaN).

        Standardised and normal-score columns are unscaled; a level code gives its level (a
        categorical's: its category code; the missing category: NaN); a target-encoded column
        gives the code of the category whose encoding is nearest (ties: the lower code); a raw
        ``discrete`` column is rounded to an integer. On values :meth:`transform` produced this
        returns the raw values exactly, up to floating-point rounding of the real columns, except
        that a value :meth:`transform` read as its nearest level comes back as that level.

        Args:
            x: ``(m, D)`` shard values over :attr:`features` (or ``(m, len(columns))``).
            columns: positions (into :attr:`features`) of the columns in ``x``.

        Returns:
            ``(m, ·)`` float64 raw values; categorical columns hold category codes.
        """
        out = np.array(x, dtype=np.float64, copy=True)
        cols = [self.columns[j] for j in columns] if columns is not None else self.columns
        for k, col in enumerate(cols):
            v = out[:, k]
            if col.mean is not None and self.standardize:
                v *= col.std
                v += col.mean
            elif col.normal is not None and self.standardize:
                v[:] = col.normal.inverse(v)
            elif col.levels is not None and self.standardize:
                v[:] = from_levels(v, col.levels)
            if col.level_codes is not None:
                seen = ~np.isnan(v)
                code = col.level_codes[np.clip(np.rint(v[seen]), 0, col.level_codes.size - 1).astype(np.int64)]
                v[seen] = np.where(code < 0, np.nan, code)
            elif col.lookup is not None:
                v[:] = _nearest_code(col.lookup, v)
            elif col.raw_meta_type in ("discrete", "categorical"):
                np.round(v, out=v)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Preprocessor":
        """The preprocessor :meth:`to_json` wrote (``manifest["preprocessing"]``).

        Manifests written before category labels were recorded give the categorical columns
        kept as codes labels ``"0"``, ``"1"``, ...; manifests written before level codes and
        normal scores read as before (target encoding as a real, standardisation).

        Raises:
            UserError: a missing or malformed field, named.
        """
        try:
            features = list(data["columns"])
            columns, categories = [], {}
            for name in features:
                e = data["columns"][name]
                col = ColumnTransform(raw_meta_type=str(e["raw_meta_type"]), meta_type=str(e["meta_type"]))
                labels = e.get("categories")
                if "encoding" in e:
                    enc = e["encoding"]
                    labels = list(labels) if labels is not None else list(enc)
                    col.lookup = np.array([float(enc[lab]) for lab in labels] + [float(e["encoding_missing"])])
                    if e.get("levels") is not None:
                        pos = {str(lab): c for c, lab in enumerate(labels)}
                        col.level_codes = np.array([-1 if lab is None else pos[str(lab)] for lab in e["levels"]],
                                                   dtype=np.int64)
                        col.n_categories = max(int(col.level_codes.size), 2)
                elif col.raw_meta_type == "categorical":
                    col.n_categories = int(e["n_categories"]) if e.get("n_categories") is not None else (
                        len(labels) if labels is not None else None)
                    if labels is None and col.n_categories is not None:
                        labels = [str(c) for c in range(col.n_categories)]
                elif e.get("levels") is not None:
                    col.levels = np.asarray(e["levels"], dtype=np.float64)
                    col.n_categories = max(int(col.levels.size), 2)
                    if e.get("level_gaps") is not None:
                        col.level_gaps = np.zeros(col.levels.size + 1, dtype=bool)
                        col.level_gaps[np.asarray(e["level_gaps"], dtype=np.int64)] = True
                if labels is not None:
                    categories[name] = [str(lab) for lab in labels]
                if e.get("impute") is not None:
                    col.impute = float(e["impute"])
                if e.get("mean") is not None:
                    col.mean, col.std = float(e["mean"]), float(e["std"])
                if e.get("normal_score") is not None:
                    col.normal = NormalScore.from_json(e["normal_score"])
                if e.get("selection") is not None:
                    col.selection = {str(k): float(v) for k, v in e["selection"].items()}
                columns.append(col)
            pre = cls(features, columns, encode=str(data["encode"]), impute=bool(data["impute"]),
                      standardize=bool(data["standardize"]), n_fit_rows=int(data.get("n_fit_rows", 0)),
                      categories=categories)
            pre.selection = data.get("selection")
            return pre
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"preprocessing: malformed field ({type(exc).__name__}: {exc})") from None

    @property
    def meta_types(self) -> list[str]:
        """Meta-type of each transformed column."""
        return [c.meta_type for c in self.columns]

    def to_json(self) -> dict:
        """The fitted parameters, JSON-ready (for ``manifest["preprocessing"]``)."""
        cols = {}
        for name, col in zip(self.features, self.columns):
            entry: dict = {"raw_meta_type": col.raw_meta_type, "meta_type": col.meta_type, "transform": col.kind}
            if col.raw_meta_type == "categorical" and name in self.categories:
                entry["categories"] = [str(lab) for lab in self.categories[name]]
                if col.n_categories is not None and col.level_codes is None:
                    entry["n_categories"] = int(col.n_categories)
            if col.lookup is not None:
                labels = self.categories[name]
                entry["encoding"] = {lab: float(col.lookup[c]) for c, lab in enumerate(labels)}
                entry["encoding_missing"] = float(col.lookup[-1])
            if col.level_codes is not None:
                labels = self.categories[name]
                entry["levels"] = [None if c < 0 else str(labels[c]) for c in col.level_codes]
            if col.levels is not None:
                entry["levels"] = [float(v) for v in col.levels]
                if col.level_gaps is not None:
                    entry["level_gaps"] = [int(g) for g in np.flatnonzero(col.level_gaps)]
            if col.impute is not None:
                entry["impute"] = col.impute
            if col.mean is not None:
                entry["mean"], entry["std"] = col.mean, col.std
            if col.normal is not None:
                entry["normal_score"] = col.normal.to_json()
            if col.selection is not None:
                entry["selection"] = dict(col.selection)
            cols[name] = entry
        out = {"encode": self.encode, "impute": self.impute, "standardize": self.standardize,
               "fitted_on": "train", "n_fit_rows": self.n_fit_rows, "columns": cols}
        if self.selection is not None:
            out["selection"] = self.selection
        return out


def _nearest_code(lookup: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per value of ``v``, the code whose encoding in ``lookup`` ``(k + 1,)`` is nearest (ties and
    equal encodings: the lowest code). The last entry encodes a missing category: a value nearest
    to it alone comes back missing (NaN), as does NaN."""
    out = np.full(v.shape, np.nan)
    seen = ~np.isnan(v)
    if not lookup.size or not seen.any():
        return out
    dist = np.abs(v[seen, None] - lookup[None, :])  # (m, k + 1): k categories, a few dozen at most
    code = np.argmin(dist, axis=1).astype(np.float64)  # argmin takes the first (lowest) code among ties
    code[code == lookup.size - 1] = np.nan
    out[seen] = code
    return out


def _fit_target_encoding(table: RawTable, train_rows: np.ndarray, cat_idx: list[int],
                         columns: list[ColumnTransform]) -> None:
    """sklearn's TargetEncoder, fitted on the train rows, frozen into lookup tables.

    ``fit`` then a lookup (not ``fit_transform``'s cross-fitting) so that one category always
    maps to one value in train and test alike, which a density model needs. A category that
    fewer than ``k`` training rows hold (:data:`~data_prep.transforms.MIN_ROWS`) is encoded as
    an unseen one (the training class rate): its own rate would be those rows' labels.
    """
    from sklearn.preprocessing import TargetEncoder

    if table.y is None or table.classes is None or len(table.classes) != 2:
        raise UserError(f"{table.name}: --categoricals target needs a binary target "
                        f"({'none' if table.y is None else len(table.classes)} classes); "
                        "use --categoricals auto or codes")
    y = table.y[train_rows]
    if np.unique(y).size < 2:
        raise UserError(f"{table.name}: --categoricals target needs both classes among the training "
                        "rows (raise --max-rows, or use --categoricals auto or codes)")
    for j in cat_idx:
        # one column per fit: the encodings are per feature anyway, and sklearn's working
        # copies then stay one column wide
        column = table.x[train_rows, j]
        encoder = TargetEncoder(target_type="binary").fit(column[:, None], y)
        n_cat = columns[j].n_categories
        lookup = np.full(n_cat + 1, encoder.target_mean_, dtype=np.float64)
        seen = column[~np.isnan(column)].astype(np.int64)
        rows = np.bincount(seen, minlength=n_cat) if seen.size else np.zeros(n_cat, dtype=np.int64)
        for value, enc in zip(encoder.categories_[0], encoder.encodings_[0]):
            code = n_cat if np.isnan(value) else int(value)
            # a category of fewer than k rows gets the prior: its rate would be theirs
            held = int(np.isnan(column).sum()) if code == n_cat else int(rows[code])
            if held >= MIN_ROWS:
                lookup[code] = enc
        columns[j].lookup = lookup
        columns[j].meta_type = "real"
        columns[j].n_categories = None


def _column_moments(pre: Preprocessor, x: np.ndarray, rows: np.ndarray, cols: list[int]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population variance of the encoded, imputed columns ``cols`` over ``rows``.

    NaN (left when imputation is off) is skipped. Chunks are merged with Chan et al.'s
    pairwise update, which stays accurate for large values (``fnlwgt`` ~ 1e6) where a
    sum of squares would cancel.
    """
    n = np.zeros(len(cols))
    mean = np.zeros(len(cols))
    m2 = np.zeros(len(cols))
    for lo in range(0, rows.size, _CHUNK):
        chunk = pre.transform(x[rows[lo:lo + _CHUNK]], scale=False)[:, cols]
        seen = ~np.isnan(chunk)
        k = seen.sum(axis=0).astype(np.float64)
        safe_k = np.maximum(k, 1.0)
        c_mean = np.where(seen, chunk, 0.0).sum(axis=0) / safe_k
        c_m2 = np.where(seen, (chunk - c_mean) ** 2, 0.0).sum(axis=0)
        total = n + k
        safe_total = np.maximum(total, 1.0)
        delta = c_mean - mean
        mean = mean + delta * (k / safe_total)
        m2 = m2 + c_m2 + delta ** 2 * (n * k / safe_total)
        n = total
    return mean, m2 / np.maximum(n, 1.0)


def _fit_levels(pre: Preprocessor, table: RawTable, train_rows: np.ndarray, max_levels: int) -> None:
    """Level codes for target-encoded categoricals and for numeric columns with at most
    ``max_levels`` distinct encoded, imputed training values (see the module doc)."""
    for j, col in enumerate(pre.columns):
        if col.lookup is not None:
            n_cat = col.lookup.size - 1
            codes = list(range(n_cat))
            if np.isnan(table.x[train_rows, j]).any():
                codes.append(-1)  # the missing category, a level of its own
            enc = np.array([col.lookup[n_cat if c < 0 else c] for c in codes])
            order = np.lexsort((np.array(codes), enc))  # by encoding, then by code
            col.level_codes = np.array(codes, dtype=np.int64)[order]
            col.meta_type, col.n_categories = "discrete", max(int(col.level_codes.size), 2)
        elif col.raw_meta_type != "categorical":
            values = np.empty(train_rows.size)
            for lo in range(0, train_rows.size, _CHUNK):
                rows = train_rows[lo:lo + _CHUNK]
                values[lo:lo + rows.size] = pre.transform(table.x[rows, j:j + 1], columns=[j], scale=False)[:, 0]
            levels = few_levels(values, max_levels)
            if levels is not None:
                col.levels = levels
                seen = values[~np.isnan(values)]
                col.level_gaps = np.zeros(levels.size + 1, dtype=bool)
                col.level_gaps[np.searchsorted(levels, seen[~np.isin(seen, levels)])] = True
                col.meta_type, col.n_categories = "discrete", max(int(levels.size), 2)


def _fit_standardize(pre: Preprocessor, x: np.ndarray, rows: np.ndarray, cols: list[int]) -> None:
    mean, var = _column_moments(pre, x, rows, cols)
    for k, j in enumerate(cols):
        col = pre.columns[j]
        col.mean = float(mean[k])
        # a constant column stays constant (0) instead of dividing by zero
        col.std = float(np.sqrt(var[k])) if var[k] > 0 else 1.0
        col.meta_type = "real"


def _fit_scales(pre: Preprocessor, table: RawTable, train_rows: np.ndarray, cols: list[int], scale: str,
                seed: int) -> dict | None:
    """Normal-score (or, per column, the scale chosen on validation rows) for ``cols``; returns
    the manifest's ``selection`` record for ``scale="auto"``."""
    from .partition import stage_rng

    values = pre.transform(table.x[train_rows][:, cols], columns=cols, scale=False)
    fit_pos, val_pos = validation_split(train_rows.size, stage_rng(seed, 9))
    chosen: list[int] = []
    done = [0]
    progress.phase(lambda: f"choosing the scale of {len(cols)} real columns: {done[0]} done")
    picks = [(scale, None)] * len(cols)
    if scale == "auto":
        picks = select_scales(values[fit_pos], values[val_pos], progress=lambda n: done.__setitem__(0, n))
    for k, j in enumerate(cols):
        col = pre.columns[j]
        col.meta_type = "real"
        name, selection = picks[k]
        if selection is not None:
            col.selection = selection
        col.normal = NormalScore.fit(values[:, k]) if name == "normal-score" else None
        if col.normal is None:
            chosen.append(j)
    _fit_standardize(pre, table.x, train_rows, chosen)
    if scale != "auto":
        return None
    return {"rule": "per real column, the scale whose Gaussian mixture (3 components, fitted on the other "
                    "training rows) gives the validation rows the higher mean log-density in standardised "
                    "units; ties keep standardize",
            "candidates": ["standardize", "normal-score"], "seed": int(seed),
            "fit_rows": int(fit_pos.size), "validation_rows": int(val_pos.size)}
