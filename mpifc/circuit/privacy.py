"""The k-rows rule: no value that fewer than ``k`` rows hold leaves the rows' owner.

A client's circuits are what it sends, so what they are fitted on decides what they can reveal:

* :data:`MIN_LEAF_ROWS` (``k = 5``): no leaf, cluster, class PC or mixture component is fitted
  on fewer rows (LearnSPN's row splits and Algorithm 1's k-means fold smaller clusters into the
  nearest one, a smaller class takes every row's distribution, a Gaussian component whose
  expected count in an EM step is below ``k`` keeps its parameters). A parameter is then a
  statistic of at least ``k`` rows, in which no row weighs more than ``1 / k``.
* :func:`off_value_edges`: the bin edges of a real column's histogram lie on no value of the
  column: the range's ends move out into the gaps beside the smallest and largest value, by a
  golden-section share of the lower gap and a share ``sqrt(2) - 1`` of the upper one, and the
  edges between follow, so that on a column of integer-like values (a lattice) no edge falls on
  a value some other row holds either, the rows of a small cluster's histogram included.

:func:`rare_values` and :func:`find_values` are how that is checked: the values of a table that
fewer than ``k`` rows hold, and where their float64 or float32 encodings occur in a message's
bytes (at any byte offset: the privacy audit, :mod:`mpifc.fedpc.audit`, and
``launch/bench/privacy.py`` search every message and model file this way).

A mean or variance of ``k`` rows or more can still equal, bit for bit, a value that fewer rows
hold, its own client's or another's: on values with a few decimals (a grid) the mean of five of
them is often another point of the grid. That is no leak of the value, but its bytes would
stand in the message and the model file. :class:`MomentGuard` moves every Gaussian mean and
variance a client sends off the grid, by a relative ``2^-40`` (``2^-16`` in float32), twelve
orders of magnitude below any standard error, as the client serializes its PCs
(:func:`mpifc.federated.wire_format.set_release_guard`); one that would still equal a value of
its own client's moves on by one unit in the last place. It touches nothing else: a bin edge,
knot, probability or weight equal to a rare value stays, for the audit to find.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from mpifc.circuit.arrays import distinct_ints

MIN_LEAF_ROWS = 5
"""``k``: the fewest rows any leaf, cluster or mixture component is fitted on, and the fewest
rows that must hold a value before it may stand in a message or model file."""

GOLDEN_SHARE = (3.0 - math.sqrt(5.0)) / 2.0
"""Share of the lower end's gap (~0.382) by which a histogram's range reaches below its smallest
value: an irrational share, so no edge of a lattice-valued column lands on the lattice."""

UPPER_SHARE = math.sqrt(2.0) - 1.0
"""Share of the upper end's gap (~0.414) by which a histogram's range reaches past its largest
value. It differs from :data:`GOLDEN_SHARE` irrationally (1, sqrt 5 and sqrt 2 are independent
over the rationals): with one share at both ends, equal end gaps cancel and the middle edge of
an even number of bins falls on ``(min + max) / 2``, a point of the lattice whenever the two
ends are an even number of steps apart."""


def off_value_edges(edges: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Histogram ``edges`` of a real ``column`` moved off the column's values.

    ``edges`` are the auto rule's (LearnSPN's ``_padded_edges``): a body from the column's
    minimum to just past its maximum (``edges[1]`` .. ``edges[-2]``) and one padding bin on each
    side. They are mapped affinely onto a body from ``u0 - g (u1 - u0)`` to ``um + h (um - um1)``
    (``u0 < u1`` the two smallest distinct values, ``um1 < um`` the two largest, ``g`` =
    :data:`GOLDEN_SHARE`, ``h`` = :data:`UPPER_SHARE`): the same bins, stretched by a fraction of
    the end gaps, so that no
    edge equals the minimum or the maximum and, on a lattice of values, none equals a value of
    the lattice. Every value of ``column`` stays inside the body. A column of one value (edges
    half a unit and one unit around it) is returned as it is.
    """
    br = np.asarray(edges, dtype=np.float64)
    values = np.unique(np.asarray(column, dtype=np.float64))
    values = values[np.isfinite(values)]
    if values.size < 2 or br.size < 4:
        return br.copy()
    lo, hi = float(values[0]), float(values[-1])
    new_lo = lo - GOLDEN_SHARE * (float(values[1]) - lo)
    new_hi = hi + UPPER_SHARE * (hi - float(values[-2]))
    scale = (new_hi - new_lo) / (hi - lo)
    out = new_lo + (br - lo) * scale
    if not np.all(np.diff(out) > 0):
        return br.copy()  # a degenerate range (edges a few ulps apart): nothing to stretch
    return out


def rare_values(x: np.ndarray, columns: Sequence[int] | None = None, k: int = MIN_LEAF_ROWS) -> np.ndarray:
    """Sorted distinct float64 values that fewer than ``k`` rows of ``x`` ``(n, d)`` hold in
    the given ``columns`` (default: all), counting a row once per column that holds the value.
    NaN is no value."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.size == 0:
        return np.empty(0)
    cols = range(x.shape[1]) if columns is None else columns
    parts = [x[:, j] for j in cols]
    if not parts:
        return np.empty(0)
    flat = np.concatenate(parts)
    flat = flat[~np.isnan(flat)]
    uniq, counts = np.unique(flat, return_counts=True)
    return uniq[counts < int(k)]


def value_patterns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte patterns under which ``values`` can travel: ``(as_uint64, as_uint32)``, sorted.

    ``as_uint64``: the float64 bits of each value and of its float32 rounding widened back to
    float64 (a float32 model's parameter in a float64 array); ``as_uint32``: the float32 bits.
    ``-0.0`` and ``+0.0`` are both searched when either is a value.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if np.any(v == 0):
        v = np.concatenate([v, [0.0, -0.0]])
    with np.errstate(over="ignore"):
        f32 = v.astype(np.float32)
    f32 = f32[np.isfinite(f32)]
    u64 = np.concatenate([v.view(np.uint64), f32.astype(np.float64).view(np.uint64)])
    return distinct_ints(u64), distinct_ints(f32.view(np.uint32))


def sorted_member(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``np.isin(values, table)`` for a sorted, distinct ``table`` (as :func:`value_patterns`
    gives), by binary search: the table is not sorted again on every call."""
    if table.size == 0:
        return np.zeros(values.shape, dtype=bool)
    idx = np.minimum(np.searchsorted(table, values), table.size - 1)
    return table[idx] == values


def find_values(data: Any, patterns: tuple[np.ndarray, np.ndarray], float32_arrays: Sequence[np.ndarray] = (),
                big_endian: bool = False) -> dict[str, np.ndarray]:
    """Where the :func:`value_patterns` ``patterns`` occur.

    Args:
        data: the bytes of a message or file (``bytes``, ``memoryview`` or a uint8 array),
            searched for the float64 patterns at every byte offset.
        patterns: ``(as_uint64, as_uint32)`` of :func:`value_patterns`.
        float32_arrays: the float32 arrays the bytes hold (decoded), searched element by element
            for the float32 patterns (a 4-byte pattern at every offset of arbitrary bytes would
            match by chance).
        big_endian: also search the float64 patterns in big-endian byte order, at every offset
            (a pickle stores a Python float so).

    Returns:
        ``{"float64": found values, "float32": found values}``, each sorted, distinct, as float64.
    """
    u64, u32 = patterns
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8) if not isinstance(data, np.ndarray) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    hits64: list[np.ndarray] = []
    if u64.size and buf.size >= 8:
        for off in range(8):
            m = (buf.size - off) // 8
            if m <= 0:
                continue
            for order in ("<u8", ">u8") if big_endian else ("<u8",):
                words = buf[off: off + 8 * m].view(order)
                hits64.append(words[sorted_member(words, u64)].astype(np.uint64))
    hits32: list[np.ndarray] = []
    if u32.size:
        for arr in float32_arrays:
            words = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1).view(np.uint32)
            hits32.append(words[sorted_member(words, u32)])
    f64 = distinct_ints(np.concatenate(hits64)).view(np.float64) if hits64 else np.empty(0)
    f32 = distinct_ints(np.concatenate(hits32)).view(np.float32).astype(np.float64) if hits32 else np.empty(0)
    return {"float64": f64, "float32": f32}


def is_moment(name: str) -> bool:
    """Whether a model writer's dataset ``name`` holds Gaussian means or variances (``mean``,
    ``var``, ``g_mean``, ``leaf_var``, ...; not the ``min_var``/``max_var`` bounds)."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith(("min_var", "max_var")):
        return False
    return base in ("mean", "var") or base.endswith(("_mean", "_var"))


OFF_GRID = {np.dtype(np.float64): 2.0 ** -40, np.dtype(np.float32): 2.0 ** -16}
"""Relative step by which :class:`MomentGuard` moves a moment off the grid of decimal values,
per dtype: ~4,000 units in the last place, far below the grid's spacing."""


class MomentGuard:
    """Moves every Gaussian mean and variance of a serialized model off the grid of the data's
    values (relative :data:`OFF_GRID`), and any that would still equal one of ``values`` by
    one more unit in the last place (module doc).

    Args:
        values: the client's rare values (:func:`rare_values` of its rows).

    Attributes:
        coincidences: how many moments equalled one of ``values`` before they were moved (what
            the audit would otherwise have found in the messages).
    """

    def __init__(self, values: np.ndarray) -> None:
        self.u64, self.u32 = value_patterns(values)
        self.coincidences = 0

    def fix(self, arr: np.ndarray) -> None:
        """Move, in place, every entry of a float32 or float64 array."""
        self._move(arr, off_grid=True)

    def move_off(self, arr: np.ndarray) -> None:
        """Move, in place, the entries of a float32 or float64 array that equal one of the
        values, each by as many units in the last place as take it off them (per-sample
        log-likelihoods: a coincidence, not a moment, so nothing else moves)."""
        self._move(arr, off_grid=False)

    def _move(self, arr: np.ndarray, off_grid: bool) -> None:
        """Count the entries equal to one of the values, move every entry off the grid if
        ``off_grid``, then step any entry still equal to a value off it."""
        if arr.dtype == np.float64:
            bits, pats = arr.reshape(-1).view(np.uint64), self.u64
        elif arr.dtype == np.float32:
            bits, pats = arr.reshape(-1).view(np.uint32), self.u32
        else:
            return
        self.coincidences += int(sorted_member(bits, pats).sum())
        if off_grid:
            arr *= arr.dtype.type(1.0 + OFF_GRID[arr.dtype])
        self._step_off(arr, bits, pats)

    @staticmethod
    def _step_off(arr: np.ndarray, bits: np.ndarray, pats: np.ndarray) -> None:
        flat = arr.reshape(-1)
        hit = np.flatnonzero(sorted_member(bits, pats))
        while hit.size:
            flat[hit] = np.nextafter(flat[hit], arr.dtype.type(np.inf))
            hit = hit[sorted_member(bits[hit], pats)]

    def apply(self, group: Any, depth: int = 0) -> None:
        """:meth:`fix` every moment dataset of a model's written group tree (anything with
        ``keys()`` and ``[name]``, e.g. a :class:`~mpifc.federated.wire_format.WireGroup`)."""
        if depth > 32:
            return
        for name in list(group.keys()):
            member = group[name]
            if isinstance(member, np.ndarray):
                if is_moment(name) and member.flags.writeable:
                    self.fix(member)
            elif hasattr(member, "keys"):
                self.apply(member, depth + 1)
