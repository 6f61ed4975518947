"""CART classification trees in numpy: scikit-learn's ``DecisionTreeClassifier`` trees, node for node.

``fit_tree(x, y, max_depth, min_samples_leaf, seed)`` builds the tree that
``DecisionTreeClassifier(max_depth=..., min_samples_leaf=..., random_state=seed).fit(x, y)``
builds (Gini criterion, best splitter, all features, unit sample weights, no missing values) and
returns its node arrays. FC[DT] clients need nothing else of scikit-learn, whose import costs a
rank ~1.3 s and ~115 MB (it pulls in ``scipy.stats`` and pandas).

FC[DT] models are compared by fingerprint, so the construction is scikit-learn's, step for step:

* data as float32; classes encoded by ``np.unique``; node values are class fractions.
* depth first, left child first: node ids in that order; a node is a leaf at ``max_depth``, with
  fewer than ``max(2, 2 * min_samples_leaf)`` rows, with Gini impurity at most machine epsilon,
  when no split keeps ``min_samples_leaf`` rows on both sides, or when the split's weighted
  impurity decrease plus epsilon is negative.
* features visited in the order of scikit-learn's Fisher-Yates draws from its ``rand_r``
  generator (xorshift, seeded by ``RandomState(seed).randint(0, 2**31 - 1)``), with its
  bookkeeping of features found constant (range at most ``1e-7`` in float32) passed down to
  descendants; split positions between sorted values more than ``1e-7`` apart; the first split
  of the largest proxy improvement ``-n_R G_R - n_L G_L`` wins (strictly larger replaces);
  threshold ``v_left / 2 + v_right / 2`` in float64.

``tests/federated/test_cart.py`` compares the trees with the estimator's on random data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURE_THRESHOLD = np.float32(1e-7)
"""Values closer than this (float32 arithmetic) are not split apart, and a feature whose range
in a node is at most this is constant there."""

_RAND_R_MAX = 0x7FFFFFFF
_EPSILON = float(np.finfo(np.float64).eps)
_LEAF = -1
_BLOCK_CELLS = 1 << 21
"""Sorted cells (rows x features) of a node evaluated at once (bounds the work arrays)."""
_UNDEFINED = -2


@dataclass
class TreeArrays:
    """A fitted tree as arrays over its ``n_nodes`` nodes (ids in depth-first order).

    Attributes:
        children_left, children_right: ``(n_nodes,)`` int64 child ids, ``-1`` at leaves.
        feature: ``(n_nodes,)`` int64 column split on, ``-2`` at leaves.
        threshold: ``(n_nodes,)`` float64; rows with ``x <= threshold`` go left; ``-2`` at leaves.
        value: ``(n_nodes, n_classes)`` class fractions of the training rows in each node.
        classes: ``(n_classes,)`` the sorted distinct labels (columns of ``value``).
    """

    children_left: np.ndarray
    children_right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    classes: np.ndarray


class _RandR:
    """scikit-learn's ``rand_r`` (32-bit xorshift) and ``rand_int``."""

    def __init__(self, state: int) -> None:
        self.state = int(state) & 0xFFFFFFFF

    def integer(self, low: int, high: int) -> int:
        """A draw in ``[low, high)``."""
        s = self.state or 1
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.state = s
        return low + (s % (_RAND_R_MAX + 1)) % (high - low)


def _gini(counts: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Gini impurity ``1 - sum_c n_c^2 / n^2`` of rows of class counts ``(..., C)`` (exact
    integer counts: the sum of squares is exact in any order)."""
    return 1.0 - (counts * counts).sum(axis=-1) / (weight * weight)


class _Builder:
    """One tree's construction (the state scikit-learn's splitter carries between nodes)."""

    def __init__(self, x: np.ndarray, codes: np.ndarray, n_classes: int, max_depth: int,
                 min_samples_leaf: int, rand_state: int) -> None:
        self.x, self.codes, self.n_classes = x, codes, n_classes
        self.max_depth, self.min_leaf = max_depth, min_samples_leaf
        self.min_split = max(2, 2 * min_samples_leaf)
        self.rand = _RandR(rand_state)
        d = x.shape[1]
        self.features = list(range(d))
        self.constant_features = [0] * d
        self.n_total = float(x.shape[0])

    def _best_per_feature(self, rows: np.ndarray, counts_total: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per feature of a node: (constant, best proxy improvement, best position, threshold),
        ``(d,)`` each; a feature without an admissible split has proxy ``-inf``. All features at
        once, in blocks of columns (:data:`_BLOCK_CELLS`)."""
        m, d = rows.shape[0], self.x.shape[1]
        constant = np.zeros(d, dtype=bool)
        proxy = np.full(d, -np.inf)
        position = np.full(d, m, dtype=np.int64)
        threshold = np.zeros(d)
        if m < 2:
            constant[:] = True
            return constant, proxy, position, threshold
        codes = self.codes[rows]
        w_left = np.arange(1, m, dtype=np.float64)[:, None]
        w_right = float(m) - w_left
        p = np.arange(1, m)
        admissible = ((p >= self.min_leaf) & (m - p >= self.min_leaf))[:, None]
        step = max(1, _BLOCK_CELLS // m)
        for lo in range(0, d, step):
            v = self.x[rows, lo : lo + step]
            order = np.argsort(v, axis=0, kind="stable")
            vs = np.take_along_axis(v, order, axis=0)
            constant[lo : lo + step] = vs[m - 1] <= vs[0] + FEATURE_THRESHOLD
            sorted_codes = codes[order]
            sq_left = np.zeros((m - 1, vs.shape[1]))
            sq_right = np.zeros_like(sq_left)
            for c in range(self.n_classes):  # counts are exact integers: any order sums alike
                left = np.cumsum(sorted_codes[:-1] == c, axis=0, dtype=np.float64)
                right = counts_total[c] - left
                sq_left += left * left
                sq_right += right * right
            gini_left = 1.0 - sq_left / (w_left * w_left)
            gini_right = 1.0 - sq_right / (w_right * w_right)
            value = -w_right * gini_right - w_left * gini_left
            ok = (vs[1:] > vs[:-1] + FEATURE_THRESHOLD) & admissible
            value = np.where(ok, value, -np.inf)
            best = np.argmax(value, axis=0)  # the first of equal maxima, as a strict ">" scan keeps
            cols = np.arange(vs.shape[1])
            proxy[lo : lo + step] = value[best, cols]
            position[lo : lo + step] = np.where(ok[best, cols], best + 1, m)
            threshold[lo : lo + step] = (vs[best, cols].astype(np.float64) / 2.0
                                         + vs[best + 1, cols].astype(np.float64) / 2.0)
        return constant, proxy, position, threshold

    def split(self, rows: np.ndarray, impurity: float, n_known_constants: int
              ) -> tuple[int, float, np.ndarray | None, float, float, float, int]:
        """scikit-learn's ``node_split_best``: (feature, threshold, sorted position order or
        None, left impurity, right impurity, improvement, constants for the children)."""
        features, constant_features = self.features, self.constant_features
        n_features = len(features)
        m = rows.shape[0]
        counts_total = np.bincount(self.codes[rows], minlength=self.n_classes).astype(np.float64)
        f_i = n_features
        n_visited = n_found = n_drawn = 0
        n_total = n_known_constants
        best_proxy, best_feature, best_pos, best_threshold = -np.inf, 0, m, 0.0
        constants, proxies, positions, thresholds = self._best_per_feature(rows, counts_total)
        while f_i > n_total and (n_visited < n_features or n_visited <= n_found + n_drawn):
            n_visited += 1
            f_j = self.rand.integer(n_drawn, f_i - n_found)
            if f_j < n_known_constants:
                features[n_drawn], features[f_j] = features[f_j], features[n_drawn]
                n_drawn += 1
                continue
            f_j += n_found
            feature = features[f_j]
            if constants[feature]:
                features[f_j], features[n_total] = features[n_total], features[f_j]
                n_found += 1
                n_total += 1
                continue
            f_i -= 1
            features[f_i], features[f_j] = features[f_j], features[f_i]
            if proxies[feature] > best_proxy:
                best_proxy, best_feature = proxies[feature], feature
                best_pos, best_threshold = int(positions[feature]), float(thresholds[feature])
        left_rows = None
        imp_left = imp_right = improvement = 0.0
        if best_pos < m:
            go_left = self.x[rows, best_feature] <= best_threshold
            left_rows = go_left
            left = np.bincount(self.codes[rows[go_left]], minlength=self.n_classes).astype(np.float64)
            w_left = float(best_pos)
            w_right = float(m) - w_left
            imp_left = float(_gini(left, np.float64(w_left)))
            imp_right = float(_gini(counts_total - left, np.float64(w_right)))
            w_node = float(m)
            improvement = (w_node / self.n_total) * (impurity - (w_right / w_node * imp_right)
                                                     - (w_left / w_node * imp_left))
        features[:n_known_constants] = constant_features[:n_known_constants]
        constant_features[n_known_constants:n_known_constants + n_found] = \
            features[n_known_constants:n_known_constants + n_found]
        return best_feature, best_threshold, left_rows, imp_left, imp_right, improvement, n_total

    def build(self) -> tuple[list, list, list, list, list]:
        left_child: list[int] = []
        right_child: list[int] = []
        feature: list[int] = []
        threshold: list[float] = []
        value: list[np.ndarray] = []
        # (rows, depth, parent, is_left, impurity, constants); the left child is pushed last
        stack = [(np.arange(self.x.shape[0]), 0, _UNDEFINED, False, np.inf, 0)]
        first = True
        while stack:
            rows, depth, parent, is_left, impurity, n_constants = stack.pop()
            m = rows.shape[0]
            counts = np.bincount(self.codes[rows], minlength=self.n_classes).astype(np.float64)
            is_leaf = depth >= self.max_depth or m < self.min_split
            if first:
                impurity = float(_gini(counts, np.float64(m)))
                first = False
            is_leaf = is_leaf or impurity <= _EPSILON
            split = None
            if not is_leaf:
                split = self.split(rows, impurity, n_constants)
                is_leaf = split[2] is None or split[5] + _EPSILON < 0.0
            node = len(feature)
            if parent != _UNDEFINED:
                (left_child if is_left else right_child)[parent] = node
            left_child.append(_LEAF)
            right_child.append(_LEAF)
            value.append(counts / float(m))
            if is_leaf:
                feature.append(_UNDEFINED)
                threshold.append(float(_UNDEFINED))
                continue
            f, t, go_left, imp_left, imp_right, _, n_constants = split
            feature.append(f)
            threshold.append(t)
            stack.append((rows[~go_left], depth + 1, node, False, imp_right, n_constants))
            stack.append((rows[go_left], depth + 1, node, True, imp_left, n_constants))
        return left_child, right_child, feature, threshold, value


def supported(x: np.ndarray) -> bool:
    """Whether :func:`fit_tree` builds the estimator's tree for ``x``: finite in float32 (the
    estimator sends missing values down a learned side, which this does not do)."""
    return bool(np.isfinite(np.asarray(x, dtype=np.float32)).all())


def fit_tree(x: np.ndarray, y: np.ndarray, max_depth: int | None, min_samples_leaf: int,
             seed: int) -> TreeArrays:
    """scikit-learn's ``DecisionTreeClassifier(max_depth=max_depth,
    min_samples_leaf=min_samples_leaf, random_state=seed).fit(x, y).tree_``, as arrays.

    Args:
        x: ``(n, d)`` features, finite (see :func:`supported`).
        y: ``(n,)`` integer labels.
        max_depth: deepest level (the root is at 0); ``None``: unbounded.
        min_samples_leaf: fewest training rows in a leaf (an integer >= 1).
        seed: the estimator's ``random_state`` (an integer).
    """
    x32 = np.asarray(x, dtype=np.float32)
    classes, codes = np.unique(np.asarray(y), return_inverse=True)
    rand_state = np.random.RandomState(seed).randint(0, _RAND_R_MAX)
    depth = np.iinfo(np.int32).max if max_depth is None else int(max_depth)
    builder = _Builder(x32, codes.reshape(-1).astype(np.int64), len(classes), depth,
                       int(min_samples_leaf), int(rand_state))
    left, right, feature, threshold, value = builder.build()
    return TreeArrays(np.asarray(left, np.int64), np.asarray(right, np.int64), np.asarray(feature, np.int64),
                      np.asarray(threshold, np.float64), np.vstack(value), classes)
