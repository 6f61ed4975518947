"""LearnSPN / MSPN structure learning (Gens & Domingos 2013; Molina et al. 2018).

Top-down: a slice (rows x columns) of the training data becomes

1. a leaf, if it has one column;
2. a product of leaves for its constant columns and a slice for the rest (done first: a constant
   column makes correlations undefined and clusters meaningless);
3. a fully factorised product of leaves, if it has fewer than ``min_instances_slice`` rows;
4. a product over the connected components of the pairwise dependency graph (RDC or G-test),
   if there is more than one;
5. otherwise a sum over a row clustering (k-means or GMM) weighted by cluster sizes, or a fully
   factorised product if the rows do not split.

With ``class_column`` the root is instead a sum over that discrete column's values, weighted by
their rows, each child the product of the column's leaf and a LearnSPN of the other columns on
the rows holding that value: a class-conditional model ``p(y) p(x | y)``, in which no column
split can leave the class independent of the others.

Slices wait in an explicit FIFO work queue (no recursion, so depth is bounded by memory only) and
every random choice draws from one generator consumed in queue order, so the same seed gives the
same structure and parameters. Children of a product (same rows, one component) skip step 4: a
connected component stays connected on the same rows.

Data layout: ``data`` is ``(n, d)`` float64 without NaN; column ``j`` is variable ``j``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from mpifc.circuit.graph import LeafNode, Node, ProductNode, SumNode, collapse, topological_order, validate
from mpifc.circuit.privacy import off_value_edges
from mpifc.circuit.splitting import (
    clustering_features,
    split_columns_gtest,
    split_columns_rdc,
    MIN_LEAF_ROWS,
    absorb_small_clusters,
    split_rows,
    single_native_thread,
)
from mpifc.circuit.rdc import TIES as RDC_TIES, WIDTHS as RDC_WIDTHS, reuse_work_arrays
from mpifc.errors import UserError

META_TYPES = ("real", "discrete", "categorical")
"""Accepted meta-types: ``real`` (continuous), ``discrete`` (ordinal integers ``0..k-1``, e.g.
binary or counts), ``categorical`` (unordered codes ``0..k-1``)."""

COL_SPLITS = ("rdc", "gtest")
ROW_SPLITS = ("kmeans", "gmm")
LEAF_CHOICES = ("auto", "gaussian", "histogram", "piecewise", "mixed")

POINT_MASS_SHARE = 0.05
"""``leaf="mixed"``: a real column whose most frequent value holds at least this share of the
training rows (codes, counts, imputed or clipped values stored as reals) gets a histogram leaf;
a Gaussian there would put a variance-floor spike on that value in every slice where it is
constant."""


@dataclass(frozen=True)
class LearnSPNParams:
    """Hyperparameters of :func:`learn_spn` (see there)."""

    threshold: float = 0.3
    min_instances_slice: int = 200
    col_split: str = "rdc"
    row_split: str = "kmeans"
    n_clusters: int = 2
    leaf: str = "auto"
    seed: int = 0
    gtest_pvalue: float = 0.001
    alpha: float = 1.0
    min_var: float = 1e-4
    rdc_k: int = 10
    rdc_ties: str = "max"
    rdc_widths: str = "shared"
    n_init: int = 3
    cluster_first: bool = False
    class_column: int | None = None
    leaf_kwargs: dict[str, Any] = field(default_factory=dict)
    var_min_var: tuple[float, ...] = ()


@dataclass
class _Slice:
    """One pending node: its rows and variables, and where to attach it."""

    rows: np.ndarray
    cols: np.ndarray
    attach: Any  # callable(Node) -> None
    skip_col_split: bool = False
    # ``x[np.ix_(rows, cols)]`` when the parent had it at hand: a child's block is a row or column
    # selection of its parent's, cheaper than a gather from ``x`` (the queue's blocks are disjoint
    # parts of ``x``, so they never hold more than ``x``)
    block: np.ndarray | None = None


@dataclass
class _DataInfo:
    """Per-variable facts computed once on the full training data."""

    meta: list[str]
    cards: list[int]  # number of values for discrete/categorical, 0 for real
    lows: np.ndarray
    highs: np.ndarray
    # k-means divisor per column: a discrete column with more than two levels is put on the unit
    # spread of the (standardised) real columns by its training std; 1 elsewhere
    cluster_scales: np.ndarray


def _check_inputs(data: Any, meta_types: Sequence[str], p: LearnSPNParams,
                  n_categories: Sequence[int] | None = None) -> tuple[np.ndarray, _DataInfo]:
    """Validate arguments; raise UserError naming the field at fault."""
    try:
        x = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise UserError(f"learn_spn: data is not a numeric array ({e})") from None
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise UserError(f"learn_spn: data must be a non-empty 2-D array (n, d), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise UserError("learn_spn: data contains NaN or inf; structure learning needs complete data")
    meta = list(meta_types) if not isinstance(meta_types, str) else None
    if meta is None or len(meta) != x.shape[1]:
        raise UserError(
            f"learn_spn: meta_types must be a list with one entry per column ({x.shape[1]}), got {meta_types!r}"
        )
    for j, m in enumerate(meta):
        if m not in META_TYPES:
            raise UserError(f"learn_spn: meta_types[{j}] = {m!r}, expected one of {META_TYPES}")
    if not (isinstance(p.threshold, (int, float)) and 0.0 <= p.threshold <= 1.0):
        raise UserError(f"learn_spn: threshold must be in [0, 1], got {p.threshold!r}")
    if isinstance(p.min_instances_slice, bool) or not isinstance(p.min_instances_slice, (int, np.integer)) \
            or p.min_instances_slice < 1:
        raise UserError(f"learn_spn: min_instances_slice must be an int >= 1, got {p.min_instances_slice!r}")
    if p.col_split not in COL_SPLITS:
        raise UserError(f"learn_spn: col_split must be one of {COL_SPLITS}, got {p.col_split!r}")
    if p.row_split not in ROW_SPLITS:
        raise UserError(f"learn_spn: row_split must be one of {ROW_SPLITS}, got {p.row_split!r}")
    if isinstance(p.n_clusters, bool) or not isinstance(p.n_clusters, (int, np.integer)) or p.n_clusters < 2:
        raise UserError(f"learn_spn: n_clusters must be an int >= 2, got {p.n_clusters!r}")
    if p.leaf not in LEAF_CHOICES:
        raise UserError(f"learn_spn: leaf must be one of {LEAF_CHOICES}, got {p.leaf!r}")
    if p.rdc_ties not in RDC_TIES:
        raise UserError(f"learn_spn: rdc_ties must be one of {RDC_TIES}, got {p.rdc_ties!r}")
    if p.rdc_widths not in RDC_WIDTHS:
        raise UserError(f"learn_spn: rdc_widths must be one of {RDC_WIDTHS}, got {p.rdc_widths!r}")
    if isinstance(p.rdc_k, bool) or not isinstance(p.rdc_k, (int, np.integer)) or p.rdc_k < 1:
        raise UserError(f"learn_spn: rdc_k must be an int >= 1, got {p.rdc_k!r}")
    if isinstance(p.n_init, bool) or not isinstance(p.n_init, (int, np.integer)) or p.n_init < 1:
        raise UserError(f"learn_spn: n_init must be an int >= 1, got {p.n_init!r}")
    if not (0.0 < p.gtest_pvalue < 1.0):
        raise UserError(f"learn_spn: gtest_pvalue must be in (0, 1), got {p.gtest_pvalue!r}")
    if not (p.alpha > 0.0):
        raise UserError(f"learn_spn: alpha (smoothing) must be > 0, got {p.alpha!r}")
    if not (p.min_var > 0.0):
        raise UserError(f"learn_spn: min_var must be > 0, got {p.min_var!r}")
    if n_categories is not None and len(n_categories) != x.shape[1]:
        raise UserError(f"learn_spn: n_categories must have one entry per column ({x.shape[1]}), "
                        f"got {len(n_categories)}")
    if p.class_column is not None:
        if isinstance(p.class_column, bool) or not isinstance(p.class_column, (int, np.integer)) \
                or not 0 <= p.class_column < x.shape[1]:
            raise UserError(f"learn_spn: class_column must be a column index 0..{x.shape[1] - 1}, "
                            f"got {p.class_column!r}")
        if meta[int(p.class_column)] == "real":
            raise UserError(f"learn_spn: class_column {p.class_column} is real; it must be discrete or categorical")
    cards = []
    scales = np.ones(x.shape[1])
    for j, m in enumerate(meta):
        col = x[:, j]
        if m == "real":
            cards.append(0)
            continue
        if np.any(col < 0) or np.any(col != np.round(col)):
            raise UserError(f"learn_spn: column {j} is {m} but holds values that are not integers >= 0")
        # declared levels count even when this client's rows miss the top ones: a test row may hold them
        declared = int(n_categories[j] or 0) if n_categories is not None else 0
        cards.append(max(int(col.max()) + 1, declared, 2))
        if m == "discrete" and cards[-1] > 2 and col.std() > 0:
            scales[j] = col.std()
    if p.col_split == "gtest" and any(m == "real" for m in meta):
        raise UserError("learn_spn: col_split='gtest' needs discrete or categorical columns only (meta_types)")
    return x, _DataInfo(meta=meta, cards=cards, lows=x.min(0), highs=x.max(0), cluster_scales=scales)


def _point_mass(column: np.ndarray) -> bool:
    """Whether the most frequent value of ``column`` holds at least :data:`POINT_MASS_SHARE` of it."""
    if column.size == 0:
        return False
    _, counts = np.unique(column, return_counts=True)
    return bool(counts.max() >= POINT_MASS_SHARE * column.size)


def _leaf_kind(meta: str, card: int, leaf: str, column: np.ndarray | None = None) -> str:
    """Leaf family for one column: binary -> Bernoulli, categorical -> Categorical, discrete ->
    Categorical (a histogram on unit bins if ``leaf`` is histogram or piecewise, as MSPN does:
    both are probability masses of the levels), real -> Gaussian (or the requested family;
    ``"mixed"``: histogram where ``column`` has a point mass, :data:`POINT_MASS_SHARE`)."""
    if meta == "real":
        if leaf == "mixed":
            return "histogram" if column is not None and _point_mass(column) else "gaussian"
        return {"auto": "gaussian"}.get(leaf, leaf)
    if card <= 2:
        return "bernoulli"
    if meta == "categorical":
        return "categorical"
    return {"auto": "categorical", "gaussian": "categorical", "piecewise": "histogram", "mixed": "categorical"}.get(leaf, leaf)


class _LeafMaker:
    """Fits one univariate leaf for a column of a slice (adapter over :func:`leaves.fit_leaf`).

    Leaves of slices are fitted on few rows, so everything that defines the support (number of
    categories, histogram bin edges) is fixed once from the full training data: a slice that
    misses a value must still give it (smoothed) mass.
    """

    def __init__(self, x: np.ndarray, info: _DataInfo, p: LearnSPNParams) -> None:
        from mpifc.circuit.leaves import FixedBins, Histogram, PiecewiseLinear, fit_leaf, piecewise_fit_fixed_columns
        from mpifc.circuit.leaves import tie_variance_floors

        self._fit = fit_leaf
        self._fit_hist = Histogram.fit_fixed
        self._fit_pw = PiecewiseLinear.fit_fixed
        self._info = info
        self._p = p
        self._kinds = [_leaf_kind(m, c, p.leaf, x[:, j] if p.leaf == "mixed" else None)
                       for j, (m, c) in enumerate(zip(info.meta, info.cards))]
        # Gaussian leaves: min_var, raised per column to the floor its ties set on the full data
        gauss = [kind == "gaussian" for kind in self._kinds]
        self._min_var = np.maximum(p.min_var, tie_variance_floors(x, gauss)) if any(gauss) else None
        if self._min_var is not None and p.var_min_var:
            self._min_var = np.maximum(self._min_var, np.asarray(p.var_min_var, dtype=np.float64))
        binned = [j for j, kind in enumerate(self._kinds) if kind in ("histogram", "piecewise")]
        self._breaks: dict[int, np.ndarray] = _real_breaks(x, [j for j in binned if info.meta[j] == "real"])
        for j in binned:
            if j not in self._breaks:
                self._breaks[j] = _global_breaks(x[:, j], info.meta[j], info.cards[j])
            if info.meta[j] == "real":  # no edge on a value of the column (the k-rows rule)
                self._breaks[j] = off_value_edges(self._breaks[j], x[:, j])
        self._bins: dict[int, Any] = dict(zip(binned, FixedBins.many([self._breaks[j] for j in binned])))
        self._fit_pw_columns = piecewise_fit_fixed_columns
        # Histogram / piecewise leaves reuse each column's bin geometry (bit-identical to the
        # generic fit, ~2.5x cheaper) unless leaf_kwargs asks for something the fast fit lacks.
        self._fixed = set(p.leaf_kwargs) <= {"alpha", "tail"}
        self._fixed_hp = {"alpha": p.leaf_kwargs.get("alpha", p.alpha)}
        if "tail" in p.leaf_kwargs:
            self._fixed_hp["tail"] = p.leaf_kwargs["tail"]

    def __call__(self, var: int, values: np.ndarray) -> LeafNode:
        node = self._make(var, values)
        # Rows behind the leaf: lets resmooth() re-derive counts from smoothed probabilities.
        node.n_fit = len(values)  # type: ignore[attr-defined]
        return node

    def columns(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                block: np.ndarray | None = None) -> list[LeafNode]:
        """``[self(v, x[rows, v]) for v in cols]``: one leaf per column of a fully factorised
        slice, with its piecewise-linear leaves on fixed bins fitted together
        (:func:`~mpifc.circuit.leaves.piecewise_fit_fixed_columns`, bit-identical) and its
        Bernoulli leaves, a single one too, from one count of ones (:meth:`_bernoullis`).
        ``block``: ``x[np.ix_(rows, cols)]`` when the caller holds it (spares a gather)."""
        pw = [i for i, v in enumerate(cols) if self._kinds[v] == "piecewise"] if self._fixed else []
        fitted: dict[int, Any] = {}
        if len(pw) > 1 and len(rows):
            sel = cols[pw]
            got = self._fit_pw_columns(x[np.ix_(rows, sel)], [self._bins[int(v)] for v in sel], **self._fixed_hp)
            fitted = {i: lf for i, lf in zip(pw, got) if lf is not None}
        bern = [i for i, v in enumerate(cols) if self._kinds[v] == "bernoulli"]
        if bern and len(rows):
            sub = None if block is None else block if len(bern) == len(cols) else block.take(bern, axis=1)
            fitted.update(zip(bern, self._bernoullis(x, rows, cols[bern], sub)))
        gauss = [i for i, v in enumerate(cols) if self._kinds[v] == "gaussian"]
        if len(gauss) > 1 and len(rows):
            fitted.update(zip(gauss, self._gaussians(x, rows, cols[gauss])))
        out = []
        for i, v in enumerate(cols):
            lf = fitted.get(i)
            if lf is None:
                out.append(self(int(v), x[rows, v]))
                continue
            node = LeafNode(int(v), lf)
            node.n_fit = len(rows)  # type: ignore[attr-defined]
            out.append(node)
        return out

    def _bernoullis(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                    block: np.ndarray | None = None) -> list[Any]:
        """The Bernoulli leaves of the columns ``cols`` on ``rows`` (at least one), as
        :meth:`Bernoulli.fit <mpifc.circuit.leaves.Bernoulli.fit>` fits each: ``p = (n1 + alpha)
        / (n + 2 alpha)`` with the same float64 operations, ``n1`` counted for all columns at
        once (training data hold no NaN, so every row counts)."""
        from mpifc.circuit.leaves import Bernoulli

        alpha = self._p.leaf_kwargs.get("alpha", self._p.alpha)
        block = _block(x, rows, cols) if block is None else block
        n1 = np.count_nonzero(block == 1, axis=0).astype(np.float64)
        probs = (n1 + alpha) / (np.float64(len(rows)) + 2 * alpha)
        return [Bernoulli(float(q), alpha) for q in probs]

    def _gaussians(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> list[Any]:
        """The Gaussian leaves of the columns ``cols`` on ``rows`` (at least one), as
        :meth:`Gaussian.fit <mpifc.circuit.leaves.Gaussian.fit>` fits each: mean and variance
        by ``np.average`` with unit weights, i.e. a sum over the column's values divided by the
        count. Each column is laid out as one contiguous row, whose sum numpy forms pairwise
        exactly as it sums the column alone, so the leaves are the same to the bit."""
        from mpifc.circuit.leaves import Gaussian

        hp = self._p.leaf_kwargs
        max_var = hp.get("max_var")
        floors = [float(hp["min_var"])] * len(cols) if "min_var" in hp else self._min_var[cols].tolist()
        values = x.T[np.ix_(cols, rows)]  # (columns, rows), C-ordered
        n = np.float64(len(rows))
        means = values.sum(axis=1) / n
        values -= means[:, None]
        values **= 2
        variances = values.sum(axis=1) / n
        return [Gaussian(float(m), max(float(v), lo), lo, max_var)
                for m, v, lo in zip(means.tolist(), variances.tolist(), floors)]

    def _make(self, var: int, values: np.ndarray) -> LeafNode:
        info, p, kind = self._info, self._p, self._kinds[var]
        hp = dict(p.leaf_kwargs)
        meta = info.meta[var]
        if kind == "gaussian":
            hp.setdefault("min_var", float(self._min_var[var]))
            return LeafNode(var, self._fit("real", values, leaf="gaussian", **hp))
        hp.setdefault("alpha", p.alpha)
        if kind == "bernoulli":
            return LeafNode(var, self._fit("binary", values, leaf="bernoulli", **hp))
        if kind == "categorical":
            hp.setdefault("n_categories", info.cards[var])
            return LeafNode(var, self._fit("categorical", values, leaf="categorical", **hp))
        if self._fixed:
            if kind == "histogram":
                return LeafNode(var, self._fit_hist(values, self._bins[var], discrete=meta != "real",
                                                    **self._fixed_hp))
            return LeafNode(var, self._fit_pw(values, self._bins[var], **self._fixed_hp))
        breaks = self._breaks[var].copy()
        if kind == "histogram":
            hp.setdefault("breaks", breaks)
            fit_meta = "real" if meta == "real" else "discrete"
            return LeafNode(var, self._fit(fit_meta, values, leaf="histogram", **hp))
        hp.setdefault("bins", breaks)
        return LeafNode(var, self._fit("real", values, leaf="piecewise_linear", **hp))


def _global_breaks(column: np.ndarray, meta: str, card: int) -> np.ndarray:
    """Histogram edges of one column on the full training data.

    Integer codes get unit bins. Reals get numpy's ``auto`` bins (at most 64) plus one wide bin
    on each side (a quarter of the range), so that test values slightly outside the training
    range keep smoothed mass instead of log-density ``LOG_ZERO``.
    """
    if meta != "real":
        return np.arange(0.0, float(card) + 1.0)
    lo, hi = float(column.min()), float(column.max())
    if hi <= lo:
        return np.array([lo - 1.0, lo - 0.5, hi + 0.5, hi + 1.0])
    return _padded_edges(np.histogram_bin_edges(column, bins="auto"), lo, hi)


def _padded_edges(br: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Finish ``auto`` edges ``br`` of a column spanning ``[lo, hi]``: at most 64 bins, the
    maximum inside the last (half-open) bin, one wide bin (a quarter of the range) on each side."""
    if len(br) > 65:  # 'auto' grows with n; bound the leaf size
        br = np.linspace(lo, hi, 65)
    br[-1] = np.nextafter(br[-1], np.inf)  # half-open bins: keep the maximum inside
    pad = 0.25 * (hi - lo)
    return np.concatenate([[lo - pad], br, [br[-1] + pad]])


def _real_breaks(x: np.ndarray, cols: Sequence[int]) -> dict[int, np.ndarray]:
    """:func:`_global_breaks` of the real columns ``cols`` of ``x``, bit for bit, at a fraction of
    the cost: one batched percentile instead of one ``np.histogram_bin_edges`` per column.

    Repeats numpy's ``bins="auto"`` rule (numpy 2.x: the smaller of Sturges' width and the
    Freedman-Diaconis width, the latter at least half the square-root rule's width; then
    ``ceil(range / width)`` equal bins by ``linspace``) with the same operations in the same
    order; ``tests/circuit/test_fixed_cost_fast_paths.py`` checks it against numpy's edges. A
    constant or non-finite column, or edges that would not increase, take the generic path.
    """
    out: dict[int, np.ndarray] = {}
    if not cols:
        return out
    sub = x[:, list(cols)]
    n = sub.shape[0]
    lows, highs = sub.min(0), sub.max(0)
    q75, q25 = np.percentile(sub, [75, 25], axis=0)
    cube, sturges_div, sqrt_div = n ** (-1.0 / 3.0), np.log2(n) + 1.0, np.sqrt(n)
    # The rule's scalar steps, element-wise over the columns (same operations, same order).
    ok = np.isfinite(lows) & np.isfinite(highs) & (highs > lows)
    with np.errstate(all="ignore"):
        ptp = np.subtract(highs, lows)
        fd = 2.0 * np.subtract(q75, q25) * cube
        width = np.minimum(np.maximum(fd, ptp / sqrt_div / 2), ptp / sturges_div)
        n_bins = np.where(width > 0, np.ceil(ptp / width), 1.0)
        step = np.subtract(highs, lows) / n_bins  # linspace's step (zero: its other branch)
    small = [pos for pos in range(len(cols)) if ok[pos] and n_bins[pos] <= 64 and step[pos] != 0]
    for pos in range(len(cols)):  # more than 64 bins, or a zero step: one column at a time
        if ok[pos] and pos not in small:
            first, last = lows[pos], highs[pos]
            br = np.linspace(first, last, int(n_bins[pos]) + 1, endpoint=True, dtype=np.float64)
            if not np.any(br[:-1] >= br[1:]):
                out[cols[pos]] = _padded_edges(br, float(first), float(last))
    if not small:
        return out
    # np.linspace(first, last, nb + 1) of the other columns at once (arange * step + first, the
    # last point set to ``last``), then _padded_edges (at most 65 points: no re-spacing).
    first, last, step = lows[small], highs[small], step[small]
    num = n_bins[small].astype(np.int64) + 1
    end = np.cumsum(num)
    start = end - num
    br = (np.arange(int(end[-1])) - np.repeat(start, num)).astype(np.float64)
    br *= np.repeat(step, num)
    br += np.repeat(first, num)
    br[end - 1] = last
    inside = np.ones(br.size - 1, dtype=bool)
    inside[end[:-1] - 1] = False
    rising = np.add.reduceat(((br[:-1] >= br[1:]) & inside).astype(np.int64), start) == 0
    br[end - 1] = np.nextafter(br[end - 1], np.inf)  # half-open bins: keep the maximum inside
    pad = 0.25 * np.subtract(last, first)
    for r, pos in enumerate(small):
        if not rising[r]:
            continue  # edges that do not increase: the caller's generic path
        s, e = int(start[r]), int(end[r])
        col = np.empty(e - s + 2)
        col[0] = first[r] - pad[r]
        col[1: -1] = br[s: e]
        col[-1] = br[e - 1] + pad[r]
        out[cols[pos]] = col
    return {j: out[j] for j in cols if j in out}


def _block(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[np.ix_(rows, cols)]`` (``cols`` ascending, distinct); a row gather alone when ``cols``
    is every column, about ten times cheaper than the outer-product index."""
    if len(cols) == x.shape[1]:
        return x.take(rows, axis=0)
    return x[np.ix_(rows, cols)]


def _constant_columns(block: np.ndarray, meta: Sequence[str]) -> np.ndarray:
    """Boolean mask of columns with one value (or, for real columns, numerically zero variance)."""
    lo, hi = block.min(0), block.max(0)
    const = lo == hi
    real = np.array([m == "real" for m in meta])
    if real.any():
        scale = np.maximum(np.abs(lo), np.abs(hi))
        const |= real & ((hi - lo) <= 1e-12 * np.maximum(scale, 1.0))
    return const


def learn_structure(data: Any, meta_types: Sequence[str], params: LearnSPNParams,
                    n_categories: Sequence[int] | None = None) -> Node:
    """Run LearnSPN and return the (collapsed, validated) root node; see :func:`learn_spn`."""
    x, info = _check_inputs(data, meta_types, params, n_categories)
    # One RDC per column split: its large work arrays are kept for the whole run (rdc.py).
    with single_native_thread(), reuse_work_arrays():
        root = _grow(x, info, params)
    root = collapse(root)
    validate(root)
    return root


def _grow(x: np.ndarray, info: _DataInfo, p: LearnSPNParams) -> Node:
    """The work-queue loop; returns the uncollapsed root."""
    rng = np.random.default_rng(p.seed)
    make_leaf = _LeafMaker(x, info, p)
    categorical = np.array([m == "categorical" for m in info.meta])
    cards = np.array(info.cards)
    meta = info.meta

    holder: list[Node] = []
    queue: deque[_Slice] = deque()
    classes = _class_split(x, p.class_column)
    if classes:
        # The class split first (module doc): one product of the class leaf and the other
        # columns' slice per value, weighted by its rows.
        top = SumNode(scope=list(range(x.shape[1])))
        holder.append(top)
        rest = np.array([j for j in range(x.shape[1]) if j != p.class_column], dtype=np.int64)
        for rows in classes:
            prod = ProductNode(scope=list(range(x.shape[1])))
            top.add_child(prod, len(rows) / x.shape[0])
            prod.add_child(make_leaf(int(p.class_column), x[rows, p.class_column]))
            # a class of one row: its other columns take every row's distribution (a leaf
            # fitted on that row alone would hold the row itself)
            body = rows if len(rows) >= MIN_LEAF_ROWS else np.arange(x.shape[0])
            queue.append(_Slice(body, rest, prod.add_child, skip_col_split=p.cluster_first))
    else:
        queue.append(_Slice(np.arange(x.shape[0]), np.arange(x.shape[1]), holder.append,
                            skip_col_split=p.cluster_first))

    def factorise(rows: np.ndarray, cols: np.ndarray, attach: Any, block: np.ndarray | None = None) -> None:
        if len(cols) == 1:
            attach(make_leaf.columns(x, rows, cols, block)[0])
            return
        prod = ProductNode(scope=cols.tolist())
        for leaf in make_leaf.columns(x, rows, cols, block):
            prod.add_child(leaf)
        attach(prod)

    while queue:
        task = queue.popleft()
        rows, cols = task.rows, task.cols
        if len(cols) == 1:
            factorise(rows, cols, task.attach, task.block)
            continue
        block = _block(x, rows, cols) if task.block is None else task.block
        const = _constant_columns(block, [meta[v] for v in cols])
        if const.any():
            if const.all():
                factorise(rows, cols, task.attach, block)
                continue
            prod = ProductNode(scope=cols.tolist())
            for leaf in make_leaf.columns(x, rows, cols[const], block.compress(const, axis=1)):
                prod.add_child(leaf)
            task.attach(prod)
            queue.append(_Slice(rows, cols[~const], prod.add_child, task.skip_col_split,
                                block.compress(~const, axis=1)))
            continue
        if len(rows) < p.min_instances_slice:
            factorise(rows, cols, task.attach, block)
            continue
        if not task.skip_col_split:
            if p.col_split == "rdc":
                groups = split_columns_rdc(block, categorical[cols], cards[cols], p.threshold, rng, k=p.rdc_k,
                                            ties=p.rdc_ties, widths=p.rdc_widths)
            else:
                groups = split_columns_gtest(block, cards[cols], p.gtest_pvalue)
            if len(groups) > 1:
                prod = ProductNode(scope=cols.tolist())
                task.attach(prod)
                for g in groups:
                    queue.append(_Slice(rows, cols[g], prod.add_child, skip_col_split=True,
                                        block=block.take(g, axis=1)))
                continue
        seed = int(rng.integers(0, 2**31 - 1))
        feats = clustering_features(block, categorical[cols], cards[cols], info.cluster_scales[cols])
        labels = absorb_small_clusters(feats, split_rows(feats, p.row_split, p.n_clusters, seed, n_init=p.n_init))
        n_groups = int(labels.max()) + 1
        if n_groups < 2:
            factorise(rows, cols, task.attach, block)
            continue
        sums = SumNode(scope=cols.tolist())
        task.attach(sums)
        for c in range(n_groups):
            mine = labels == c
            sub = rows[mine]
            queue.append(_Slice(sub, cols, _weighted_attach(sums, len(sub) / len(rows)),
                                block=block.compress(mine, axis=0)))

    return holder[0]


def _class_split(x: np.ndarray, column: int | None) -> list[np.ndarray]:
    """Row positions per value of ``column`` (ascending values), or ``[]`` when there is no
    class column, no other column, or the column holds a single value (nothing to split)."""
    if column is None or x.shape[1] < 2:
        return []
    values, inverse = np.unique(x[:, int(column)], return_inverse=True)
    if len(values) < 2:
        return []
    return [np.flatnonzero(inverse == k) for k in range(len(values))]


def resmooth(root: Node, alpha: float) -> int:
    """Change the Laplace smoothing of learned Bernoulli/Categorical leaves in place.

    Exact: the leaf's slice size ``n_fit`` (recorded by the learner) and its smoothed
    probabilities give back the raw counts, ``count = p (n + k alpha_old) - alpha_old``, which are
    re-smoothed with ``alpha``. Tuning the smoothing then needs no new structure learning.
    Rebuild the evaluator afterwards (``SPN(root)``).

    Returns:
        Number of leaves changed (leaves without ``n_fit`` are left alone).
    """
    from mpifc.circuit.leaves import Bernoulli, Categorical

    if not alpha > 0:
        raise UserError(f"resmooth: alpha must be > 0, got {alpha!r}")
    changed = 0
    for node in topological_order(root):
        n = getattr(node, "n_fit", None)
        if not isinstance(node, LeafNode) or n is None:
            continue
        prm = node.dist.params()
        old = float(prm["alpha"])
        if isinstance(node.dist, Bernoulli):
            n1 = min(max(float(prm["p"]) * (n + 2 * old) - old, 0.0), float(n))
            node.dist = Bernoulli((n1 + alpha) / (n + 2 * alpha), alpha)
        elif isinstance(node.dist, Categorical):
            probs = prm["probs"]
            counts = np.maximum(probs * (n + len(probs) * old) - old, 0.0)
            node.dist = Categorical((counts + alpha) / (counts + alpha).sum(), alpha)
        else:
            continue
        changed += 1
    return changed


def _weighted_attach(parent: SumNode, weight: float) -> Any:
    """Attach function that adds a child to ``parent`` with mixture weight ``weight``."""
    return lambda child: parent.add_child(child, weight)


def learn_spn(
    data: np.ndarray,
    meta_types: Sequence[str],
    *,
    threshold: float = 0.3,
    min_instances_slice: int = 200,
    col_split: str = "rdc",
    row_split: str = "kmeans",
    n_clusters: int = 2,
    leaf: str = "auto",
    seed: int = 0,
    gtest_pvalue: float = 0.001,
    alpha: float = 1.0,
    min_var: float = 1e-4,
    rdc_k: int = 10,
    rdc_ties: str = "max",
    rdc_widths: str = "shared",
    n_init: int = 3,
    cluster_first: bool = False,
    class_column: int | None = None,
    leaf_kwargs: dict[str, Any] | None = None,
    n_categories: Sequence[int] | None = None,
    var_min_var: Sequence[float] | None = None,
) -> Any:
    """Learn an SPN/MSPN from complete data by LearnSPN.

    Args:
        data: ``(n, d)`` training data, float, no NaN; discrete/categorical columns hold integer
            codes ``0..k-1``.
        meta_types: per column, ``"real"``, ``"discrete"`` or ``"categorical"``.
        threshold: RDC above which two columns count as dependent.
        min_instances_slice: slices with fewer rows are fully factorised.
        col_split: ``"rdc"`` (any meta-types) or ``"gtest"`` (discrete/categorical only).
        row_split: ``"kmeans"`` or ``"gmm"``.
        n_clusters: clusters per row split.
        leaf: ``"auto"`` (Gaussian for real, Bernoulli for two-valued, Categorical otherwise),
            or force ``"gaussian"``, ``"histogram"`` or ``"piecewise"`` for real columns; with
            the last two, discrete columns get histograms on unit bins (the mass of each level);
            ``"mixed"``: as ``"auto"``, but a histogram for a real column with a point mass
            (:data:`POINT_MASS_SHARE`).
        seed: seed of every random choice (RDC projections, clustering).
        gtest_pvalue: G-test significance level; smaller = fewer dependencies = more products.
        alpha: Laplace smoothing of Bernoulli/Categorical leaves (pseudo-count per value).
        min_var: variance floor of Gaussian leaves, raised per column to the floor its ties set
            (:func:`~mpifc.circuit.leaves.tie_variance_floors`).
        rdc_k: random features per column in the RDC (SPFlow 1.1.0 uses 20).
        rdc_ties: copula convention for ties in the RDC: ``"max"`` (default, a faithful RDC; on
            binary columns exactly ``|Pearson|``) or ``"ordinal"`` (SPFlow 1.1.0's row-order
            tie-breaking, which inflates the dependence of sparse discrete columns; for
            like-for-like comparisons only, see :func:`mpifc.circuit.rdc.ecdf`).
        rdc_widths: ``"shared"`` (default: every column's RDC features as wide as the widest
            categorical column's) or ``"own"`` (each categorical column as wide as the values it
            takes in the slice, every other column ``rdc_k``; for a column of hundreds of
            values, such as a target of many classes), see :func:`mpifc.circuit.rdc.rdc_groups`.
        n_init: restarts of each clustering.
        cluster_first: start with a row split at the root (MSPN's default) instead of a column
            split (Gens & Domingos, SPFlow).
        class_column: a discrete or categorical column to split the rows by first (one child
            per value, see the module doc), e.g. the classification target; ``None``: none.
        leaf_kwargs: extra hyperparameters passed to every leaf's ``fit``.
        n_categories: per column, its declared number of levels (0 or None: from the data); a
            discrete leaf covers at least these, so levels missing from ``data`` keep smoothed mass.
        var_min_var: per column, a further variance floor of its Gaussian leaves (e.g. the tie
            floors of more rows than ``data``'s).

    Returns:
        An :class:`mpifc.circuit.spn.SPN` over variables ``0..d-1``.

    Raises:
        UserError: bad data or hyperparameter, naming the field.
    """
    params = LearnSPNParams(
        threshold=threshold,
        min_instances_slice=min_instances_slice,
        col_split=col_split,
        row_split=row_split,
        n_clusters=n_clusters,
        leaf=leaf,
        seed=seed,
        gtest_pvalue=gtest_pvalue,
        alpha=alpha,
        min_var=min_var,
        rdc_k=rdc_k,
        rdc_ties=rdc_ties,
        rdc_widths=rdc_widths,
        n_init=n_init,
        cluster_first=cluster_first,
        class_column=class_column,
        leaf_kwargs=dict(leaf_kwargs or {}),
        var_min_var=tuple(float(v) for v in var_min_var) if var_min_var is not None else (),
    )
    root = learn_structure(data, meta_types, params, n_categories)
    from mpifc.circuit.spn import SPN

    return SPN(root)
