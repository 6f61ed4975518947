"""The pipeline: load -> subsample -> train/valid/test split -> fit preprocessing -> partition.

``prepare(...)`` returns a :class:`PreparedData` that builds each client's shard in memory on
demand; ``shards.write_shards(prepared, out_dir)`` writes them. Tests and experiments use
these two calls directly; the CLI is a thin layer over them.
"""
from __future__ import annotations

import os

from dataclasses import asdict, dataclass, field

import numpy as np

import mpifc.progress as progress
from mpifc.errors import UserError

from .datasets import load_dataset
from .partition import Partition, PartitionSpec, make_partition, stage_rng
from .preprocess import Preprocessor
from .transforms import MAX_LEVELS
from .segments import segment_weights
from .shards import ClientShard, TestSet
from .table import RawTable

DEFAULT_TEST_FRACTION = 0.2
PREPROCESSING = f"levels{MAX_LEVELS}-autoscale"
"""Names the default preprocessing of tables (level codes for columns with at most
:data:`~data_prep.transforms.MAX_LEVELS` values, each real column's scale chosen on validation
rows); experiments put it in their shard folders' names."""
VALID_MODES = ("keep", "merge")
"""``--valid``: a dataset's own validation split is kept apart (each client's ``valid/`` rows,
never trained on) or merged into the training rows (shards without ``valid/`` groups)."""
_GATHER_ROWS = 4096  # rows copied per step when building a shard (bounds the temporaries)


@dataclass(frozen=True)
class PrepConfig:
    """Every knob of ``python -m data_prep`` (see ``cli.py`` for their meaning)."""

    dataset: str = "breast-cancer"
    path: str | None = None
    data_root: str | None = None
    target: str | None = None
    schema: str | None = None
    setting: str = "horizontal"
    clients: int = 2
    seed: int = 0
    split: str = "iid"
    alpha: float = 0.5
    label_owner: int | str | None = None
    encode: str = "auto"
    impute: bool = True
    standardize: bool | None = None
    scale: str | None = None
    max_levels: int | None = None
    test_fraction: float | None = None
    max_rows: int | None = None
    shared_features: int | None = None
    patches: tuple[int, int] | None = None
    overlap: int = 2
    segments: tuple[str, ...] = field(default_factory=tuple)
    oversample: float = 4.0
    valid: str = "keep"

    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec(setting=self.setting, n_clients=self.clients, seed=self.seed,
                             split=self.split, alpha=self.alpha, label_owner=self.label_owner,
                             shared_features=self.shared_features, patches=self.patches,
                             overlap=self.overlap)


def stratified_pick(groups: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` positions drawn without replacement, each group represented in proportion.

    Counts per group are the largest-remainder rounding of ``k * share``.

    Args:
        groups: ``(n,)`` integer group of each position.
        k: how many to pick, ``0 <= k <= n``.

    Returns:
        ``(k,)`` sorted positions.
    """
    values, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    exact = counts * (k / groups.size)
    take = np.floor(exact).astype(np.int64)
    short = k - int(take.sum())
    if short:
        order = np.lexsort((np.arange(values.size), -(exact - take)))
        take[order[:short]] += 1
    picked = [rng.choice(np.flatnonzero(inverse == g), size=int(t), replace=False)
              for g, t in enumerate(take) if t]
    return np.sort(np.concatenate(picked)) if picked else np.empty(0, np.int64)


def _groups(table: RawTable, valid: str = "keep") -> np.ndarray:
    """Strata for subsampling: own split x class (classes alone if no own split); the own
    validation split is a stratum of its own only when it is kept apart (``valid="keep"``)."""
    g = np.zeros(table.n_rows, dtype=np.int64) if table.y is None else table.y.copy()
    if table.own_test is not None:
        g = g * 2 + table.own_test
    if table.own_valid is not None and valid == "keep":
        g = g * 2 + table.own_valid
    return g


def split_valid(table: RawTable, valid: str) -> tuple[np.ndarray, np.ndarray]:
    """``(pool, valid_rows)``: the positions left for the train/test split and the dataset's own
    validation rows (none with ``valid="merge"`` or when the dataset has no validation split)."""
    if valid not in VALID_MODES:
        raise UserError(f"--valid must be one of {', '.join(VALID_MODES)}, not {valid!r}")
    if valid == "merge" or table.own_valid is None:
        return np.arange(table.n_rows), np.empty(0, np.int64)
    return np.flatnonzero(~table.own_valid), np.flatnonzero(table.own_valid)


def split_train_test(table: RawTable, test_fraction: float | None, seed: int,
                     pool: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row positions among ``pool`` (default: every row).

    The dataset's own split is used unless ``test_fraction`` is given; otherwise a
    stratified ``test_fraction`` (default 0.2) of the pool is held out.
    """
    rows = np.arange(table.n_rows) if pool is None else np.asarray(pool, dtype=np.int64)
    if test_fraction is None and table.own_test is not None:
        own = table.own_test[rows]
        return rows[~own], rows[own]
    frac = DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction
    if not 0 < frac < 1:
        raise UserError(f"--test-fraction must be between 0 and 1, got {frac}")
    groups = np.zeros(rows.size, np.int64) if table.y is None else table.y[rows]
    test = stratified_pick(groups, int(round(frac * rows.size)), stage_rng(seed, 7))
    mask = np.zeros(rows.size, dtype=bool)
    mask[test] = True
    return rows[~mask], rows[test]


def resolve_encode(encode: str, table: RawTable, train: np.ndarray) -> str:
    """``--categoricals``' choice for this table: ``auto`` is ``target`` (target encoding orders a
    categorical's levels) when the target has two classes, both among the training rows, and
    ``none`` (categoricals stay codes) for any other target or none; other values pass through."""
    if encode != "auto":
        return encode
    if table.y is None or table.classes is None or len(table.classes) != 2:
        return "none"
    return "target" if np.unique(table.y[train]).size == 2 else "none"


def _target_meta(table: RawTable) -> dict:
    k = len(table.classes)
    return {"meta_type": "discrete" if k == 2 else "categorical",
            "raw_meta_type": "categorical", "n_categories": k}


class PreparedData:
    """A dataset ready to shard: fitted preprocessing plus the partition.

    Attributes:
        config: the settings used.
        table: the raw (subsampled) table.
        preprocessor: fitted on ``train_rows`` only.
        partition: the clients' rows and features.
        train_rows, test_rows: table positions of the train and test rows.
        valid_rows: table positions of the dataset's own validation rows (empty when it has
            none, or with ``--valid merge``: then they are train rows).
        missing: feature -> ``{"train": count, "test": count}`` of missing values before
            imputation (features without any are left out).
    """

    def __init__(self, config: PrepConfig, table: RawTable, preprocessor: Preprocessor,
                 partition: Partition, train_rows: np.ndarray, test_rows: np.ndarray,
                 missing: dict[str, dict[str, int]], segment_info: list[dict] | None,
                 valid_rows: np.ndarray | None = None) -> None:
        self.config = config
        self.table = table
        self.preprocessor = preprocessor
        self.partition = partition
        self.train_rows = train_rows
        self.test_rows = test_rows
        self.valid_rows = np.empty(0, np.int64) if valid_rows is None else valid_rows
        self.missing = missing
        self.segment_info = segment_info
        self.n_clients = len(partition.clients)
        self._col = {name: j for j, name in enumerate(table.features)}

    @property
    def feature_order(self) -> list[str]:
        """All output columns: features in canonical order, then the target."""
        return list(self.table.features) + ([self.table.target] if self.table.target else [])

    def feature_meta(self) -> dict[str, dict]:
        """Name -> ``{"meta_type", "raw_meta_type", "n_categories"}`` of every output column."""
        meta = {}
        for name, col in zip(self.table.features, self.preprocessor.columns):
            meta[name] = {"meta_type": col.meta_type, "raw_meta_type": col.raw_meta_type,
                          "n_categories": col.n_categories}
        if self.table.target:
            meta[self.table.target] = _target_meta(self.table)
        return meta

    def _block(self, rows: np.ndarray, names: list[str]) -> np.ndarray:
        """Transformed ``(len(rows), len(names))`` float64; the target column as class codes.

        Gathered in row chunks straight into the output, so building a shard needs little
        memory beyond the shard itself.
        """
        t = self.table
        out = np.empty((rows.size, len(names)), dtype=np.float64)
        cols = [self._col[n] for n in names if n != t.target]
        whole = cols == list(range(len(t.features)))
        for lo in range(0, rows.size, _GATHER_ROWS):
            chunk = rows[lo:lo + _GATHER_ROWS]
            out[lo:lo + chunk.size, :len(cols)] = t.x[chunk] if whole else t.x[np.ix_(chunk, cols)]
        if cols:
            self.preprocessor.transform_inplace(out[:, :len(cols)], columns=cols)
        if len(cols) < len(names):
            # the target is always last (see partition.make_partition)
            out[:, -1] = t.y[rows]
        return out

    def client_shard(self, index: int) -> ClientShard:
        """Client ``index``'s shard, built in memory (float64 arrays)."""
        part = self.partition.clients[index]
        names = list(part.features)
        meta = self.feature_meta()
        return ClientShard(index=index, features=names,
                           meta_types=[meta[n]["meta_type"] for n in names],
                           x_train=self._block(part.train_rows, names),
                           ids_train=self.table.ids[part.train_rows],
                           x_test=self._block(part.test_rows, names),
                           ids_test=self.table.ids[part.test_rows],
                           x_valid=self._block(part.valid_rows, names),
                           ids_valid=self.table.ids[part.valid_rows])

    def test_set(self) -> TestSet:
        """The whole held-out test set over :attr:`feature_order`."""
        names = self.feature_order
        return TestSet(features=names, x=self._block(self.test_rows, names),
                       ids=self.table.ids[self.test_rows])

    def extra_files(self) -> dict[str, str]:
        """A user's table: ``{"schema.json": text}``, the schema it was read with (else empty)."""
        from .infer import schema_json
        from .shards import SCHEMA_FILE

        info = self.table.schema_info
        return {} if info is None else {SCHEMA_FILE: schema_json(info["schema"])}

    def manifest_fields(self) -> dict:
        """Every manifest field except the per-file entries (see ``shards``)."""
        t, c = self.table, self.config
        pre = self.preprocessor.to_json()
        pre["missing"] = self.missing
        info = dict(self.partition.info)
        if self.segment_info is not None:
            info["segments"] = self.segment_info
        fields = {"dataset": t.name, "setting": c.setting, "split": c.split, "seed": c.seed,
                  "target": t.target, "classes": t.classes, "features": self.feature_meta(),
                  "feature_order": self.feature_order, "preprocessing": pre,
                  "label_owner": info.pop("label_owner"), "partition": info,
                  "n_train": int(self.train_rows.size), "n_test": int(self.test_rows.size),
                  "n_valid": int(self.valid_rows.size),
                  "source": {"files": source_paths(t.source_files), "splits": t.source_splits},
                  "config": _json_config(c)}
        if t.schema_info is not None:
            fields["skipped_columns"] = [c["name"] for c in t.schema_info["schema"]["columns"]
                                         if c["type"] == "skip" and c["name"] != t.target]
        if t.image_shape is not None:
            pixel = t.pixel or {}
            fields["image"] = {"shape": list(t.image_shape), **pixel}
            if "levels" in pixel:
                fields["image"]["range"] = [0, pixel["levels"] - 1]
        return fields


def _json_config(config: PrepConfig) -> dict:
    d = asdict(config)
    d["segments"] = list(config.segments)
    d["patches"] = None if config.patches is None else list(config.patches)
    return d


def _missing_counts(table: RawTable, train: np.ndarray, test: np.ndarray
                    ) -> dict[str, dict[str, int]]:
    if not np.issubdtype(table.x.dtype, np.floating):
        return {}
    counts = {}
    for j, name in enumerate(table.features):
        nan = np.isnan(table.x[:, j])  # one column at a time: no copy of the table
        a, b = int(nan[train].sum()), int(nan[test].sum())
        if a or b:
            counts[name] = {"train": a, "test": b}
    return counts


def prepare_table(table: RawTable, config: PrepConfig) -> PreparedData:
    """Run the pipeline on an already loaded table (see :func:`prepare`)."""
    if config.valid not in VALID_MODES:
        raise UserError(f"--valid must be one of {', '.join(VALID_MODES)}, not {config.valid!r}")
    if config.max_rows is not None:
        if config.max_rows < 1:
            raise UserError(f"--max-rows must be >= 1, got {config.max_rows}")
        if config.max_rows < table.n_rows:
            table = table.take(stratified_pick(_groups(table, config.valid), config.max_rows,
                                               stage_rng(config.seed, 6)))
    if config.max_levels is not None and config.max_levels < 0:
        raise UserError(f"--max-levels must be >= 0, got {config.max_levels}")
    pool, valid = split_valid(table, config.valid)
    train, test = split_train_test(table, config.test_fraction, config.seed, pool)
    if train.size == 0:
        raise UserError(f"{table.name}: no training rows left (raise --max-rows)")
    progress.phase(f"fitting the preprocessing on {train.size} training rows")
    standardize = table.standardize_default if config.standardize is None else config.standardize
    # Tables get level codes for few-valued columns and a scale chosen per real column; image
    # pixels keep their levels (or, with --standardize, plain standardisation).
    tabular = table.image_shape is None
    scale = config.scale if config.scale is not None else ("auto" if tabular else "standardize")
    max_levels = config.max_levels if config.max_levels is not None else (MAX_LEVELS if tabular else 0)
    pre = Preprocessor.fit(table, train, encode=resolve_encode(config.encode, table, train), impute=config.impute,
                           standardize=standardize, scale=scale, max_levels=max_levels, seed=config.seed)
    weights = matches = None
    if config.split == "segment" and config.setting in ("horizontal", "hybrid"):
        weights, matches = segment_weights(list(config.segments), table, config.clients,
                                           config.oversample)
    elif config.segments:
        raise UserError("--segment is only used with --split segment")
    partition = make_partition(config.partition_spec(), train, test, list(table.features),
                               table.target, labels=table.y, image_shape=table.image_shape,
                               segment_weights=weights, valid_rows=valid)
    segment_info = None
    if matches is not None:
        segment_info = [{"predicate": text, "oversample": config.oversample,
                         "rate_in_train": round(float(matches[train, i].mean()), 6),
                         "rate_on_client": round(float(
                             matches[partition.clients[i].train_rows, i].mean()), 6)}
                        for i, text in enumerate(config.segments)]
    return PreparedData(config, table, pre, partition, train, test,
                        _missing_counts(table, train, test), segment_info, valid)


def prepare(**kwargs) -> PreparedData:
    """Load a dataset and prepare it; keyword arguments are :class:`PrepConfig`'s fields.

    Example:
        ``prepare(dataset="adult", setting="hybrid", clients=3, seed=0, max_rows=2000)``

    Raises:
        UserError: any bad input (unknown dataset, missing file, impossible split, ...).
    """
    if "segments" in kwargs:
        kwargs["segments"] = tuple(kwargs["segments"])
    config = PrepConfig(**kwargs)
    progress.phase(f"reading {config.path or config.dataset}")
    table = load_dataset(config.dataset, config.path, config.data_root, target=config.target,
                         schema=config.schema)
    return prepare_table(table, config)


def source_paths(files: list[str]) -> list[str]:
    """The files a table was read from, absolute where they are files on this machine (so every
    later job, from any folder, knows which files it must never write over); other entries
    (``sklearn.datasets.load_digits``) as they are."""
    return [os.path.abspath(f) if os.path.exists(f) else f for f in files]
