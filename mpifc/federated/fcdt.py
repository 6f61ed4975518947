"""FC[DT]: every client trains a decision tree on its rows; the root averages class probabilities.

This is the bagging instance of FCs (section 3.2 of the paper), for classification only. A leaf
"model" here is a conditional, not a density: :meth:`TreeClassifier.log_likelihood` returns
``log p(y | x_rest)`` for the target column (0 when the target is NaN, since the class
probabilities sum to 1), so the generic upward pass with the target expanded over all classes
gives ``log mean_c p_c(y | x)`` at the AVERAGE root. ``test_ll`` of an FC[DT] is therefore the
conditional log-likelihood of the labels, not a joint density.

Every client must hold the target (horizontal data, or hybrid with the label on all clients).
Trees are stored as their node arrays (no pickle) and evaluated with numpy.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from mpifc.circuit.io import register_model
from mpifc.federated import cart

if TYPE_CHECKING:
    import torch

PROB_FLOOR = 1e-6  # keeps log p finite for classes a leaf never saw


class TreeClassifier:
    """A fitted CART tree over ``d`` columns predicting column ``target_index``.

    Attributes:
        left, right: ``(n_nodes,)`` child ids (-1 at leaves); feature: ``(n_nodes,)`` column
            index into the non-target columns; threshold: ``(n_nodes,)``; probs: ``(n_nodes, k)``.
    """

    def __init__(self, d: int, target_index: int, left: np.ndarray, right: np.ndarray, feature: np.ndarray,
                 threshold: np.ndarray, probs: np.ndarray) -> None:
        self.scope = tuple(range(d))
        self.d, self.target_index = int(d), int(target_index)
        self.left, self.right = np.asarray(left, np.int64), np.asarray(right, np.int64)
        self.feature, self.threshold = np.asarray(feature, np.int64), np.asarray(threshold, np.float64)
        self.probs = np.asarray(probs, np.float64)

    @classmethod
    def fit(cls, x: np.ndarray, target_index: int, n_classes: int, seed: int, max_depth: int | None = 8,
            min_samples_leaf: int = 5) -> "TreeClassifier":
        """CART tree of column ``target_index`` on the other columns of ``x`` ``(n, d)``: the tree
        of scikit-learn's ``DecisionTreeClassifier(max_depth, min_samples_leaf,
        random_state=seed)``, built by :func:`mpifc.federated.cart.fit_tree` (no scikit-learn
        import), or by the estimator itself for data that function does not take (missing or
        infinite values, which the estimator routes or refuses)."""
        feats = [j for j in range(x.shape[1]) if j != target_index]
        y = x[:, target_index].astype(np.int64)
        xs = x[:, feats]
        plain = (isinstance(seed, (int, np.integer)) and isinstance(min_samples_leaf, (int, np.integer))
                 and min_samples_leaf >= 1 and (max_depth is None or isinstance(max_depth, (int, np.integer))))
        if plain and cart.supported(xs):
            tree = cart.fit_tree(xs, y, max_depth, int(min_samples_leaf), int(seed))
            left, right, feature, threshold = tree.children_left, tree.children_right, tree.feature, tree.threshold
            value, classes = tree.value, tree.classes
        else:
            from sklearn.tree import DecisionTreeClassifier

            clf = DecisionTreeClassifier(max_depth=max_depth, min_samples_leaf=min_samples_leaf, random_state=seed)
            clf.fit(xs, y)
            t = clf.tree_
            left, right, feature, threshold = t.children_left, t.children_right, t.feature, t.threshold
            value, classes = t.value[:, 0, :], clf.classes_
        threshold = off_value_thresholds(xs, np.asarray(left), np.asarray(feature), np.asarray(threshold, np.float64))
        probs = np.zeros((value.shape[0], n_classes))
        probs[:, classes.astype(np.int64)] = value / np.maximum(value.sum(1, keepdims=True), 1e-300)
        probs = np.maximum(probs, PROB_FLOOR)
        probs /= probs.sum(1, keepdims=True)
        return cls(x.shape[1], target_index, left, right, feature, threshold, probs)

    def class_probs(self, x: np.ndarray) -> np.ndarray:
        """``p(y = c | x)`` ``(n, k)``; NaN features follow the branch with more training mass
        is not known here, so they go left (documented limitation)."""
        feats = [j for j in range(self.d) if j != self.target_index]
        xs = x[:, feats]
        node = np.zeros(len(x), dtype=np.int64)
        for _ in range(len(self.left)):
            inner = self.left[node] >= 0
            if not inner.any():
                break
            idx = np.flatnonzero(inner)
            f = self.feature[node[idx]]
            go_left = ~(xs[idx, f] > self.threshold[node[idx]])
            node[idx] = np.where(go_left, self.left[node[idx]], self.right[node[idx]])
        return self.probs[node]

    def log_likelihood(self, x: Any) -> np.ndarray:
        """``log p(x)`` float64 ``(n,)`` nats; NaN entries marginalised."""
        return self.log_likelihood_numpy(x)

    def log_likelihood_numpy(self, x: Any) -> np.ndarray:
        """:meth:`log_likelihood` as a float64 ``(n,)`` numpy array, without importing torch."""
        torch = sys.modules.get("torch")  # not imported yet: x cannot be a tensor
        is_tensor = torch is not None and isinstance(x, torch.Tensor)
        x = np.asarray(x.detach().cpu().numpy() if is_tensor else x, dtype=np.float64)
        p = self.class_probs(x)
        y = x[:, self.target_index]
        out = np.zeros(len(x))
        ok = ~np.isnan(y)
        out[ok] = np.log(p[np.flatnonzero(ok), y[ok].astype(np.int64)])
        return out

    def num_parameters(self) -> int:
        return int(self.probs.size + 2 * len(self.left))

    def save(self, group: Any) -> None:
        group.attrs["model_type"] = "fcdt_tree"
        group.attrs["d"] = self.d
        group.attrs["target_index"] = self.target_index
        for name in ("left", "right", "feature", "threshold", "probs"):
            group.create_dataset(name, data=getattr(self, name))

    @classmethod
    def load(cls, group: Any) -> "TreeClassifier":
        from mpifc.errors import UserError

        tree = cls(int(group.attrs["d"]), int(group.attrs["target_index"]),
                   *(group[n][()] for n in ("left", "right", "feature", "threshold", "probs")))
        problem = tree.parameter_problem()
        if problem is not None:
            raise UserError(f"{group.file.filename}:{group.name}: {problem}")
        return tree

    def parameter_problem(self) -> str | None:
        """What is wrong with the tree, or None: one entry per node in every array, children
        after their parent and in range (-1 at leaves), split features among the non-target
        columns, finite thresholds, and each node's class probabilities a distribution."""
        n = len(self.left)
        if not (0 <= self.target_index < self.d) or any(len(a) != n for a in (self.right, self.feature, self.threshold)) \
                or self.probs.ndim != 2 or len(self.probs) != n or n == 0:
            return f"the tree's arrays do not describe {n} nodes over {self.d} columns"
        inner = self.left >= 0
        ids = np.arange(n)
        if np.any(inner != (self.right >= 0)) or np.any((~inner) & ((self.left != -1) | (self.right != -1))):
            return "'left'/'right': a node has one child, or a child id below -1"
        if np.any(inner & ((self.left <= ids) | (self.right <= ids) | (self.left >= n) | (self.right >= n))):
            return "'left'/'right': a child id out of range (children come after their parent)"
        if np.any(inner & ((self.feature < 0) | (self.feature >= self.d - 1))):
            return f"'feature': a split on a column outside 0..{self.d - 2}"
        if not np.all(np.isfinite(self.threshold[inner])):
            return "'threshold': a split threshold is not finite"
        if not (np.all(np.isfinite(self.probs)) and np.all(self.probs >= 0)) \
                or float(np.max(np.abs(self.probs.sum(1) - 1.0))) > 1e-6:
            return "'probs': a node's class probabilities are not a distribution"
        return None


def off_value_thresholds(xs: np.ndarray, left: np.ndarray, feature: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """CART's thresholds (midpoints between neighbouring values of a node's rows) moved into
    the gap between the two neighbouring values of all the rows ``xs`` around them, a
    golden-section share of the way up (:data:`mpifc.circuit.privacy.GOLDEN_SHARE`): every
    training row goes the same way, and on values with a few decimals no threshold is a value
    of their grid (a midpoint between 3 and 5 is 4, which another row may hold)."""
    from mpifc.circuit.privacy import GOLDEN_SHARE

    out = np.array(threshold, dtype=np.float64, copy=True)
    for i in np.flatnonzero(left >= 0):
        t = out[i]
        col = xs[:, int(feature[i])]
        col = col[np.isfinite(col)]
        below, above = col[col <= t], col[col > t]
        if np.isfinite(t) and below.size and above.size:
            lo, hi = below.max(), above.min()
            out[i] = lo + GOLDEN_SHARE * (hi - lo)
    return out


def fit_tree_learner(x: np.ndarray, meta_types: Sequence[str], seed: int, n_categories: Sequence[int] | None = None,
                     target_index: int | None = None, max_depth: int | None = 8, min_samples_leaf: int = 5,
                     **_: Any) -> TreeClassifier:
    """Learner-registry entry ``dt`` (needs ``target_index``, set by the FC[DT] plan)."""
    from mpifc.errors import UserError

    if target_index is None:
        raise UserError("learner 'dt' needs the target among the client's features (FC[DT])")
    from mpifc.circuit.privacy import MIN_LEAF_ROWS

    if int(min_samples_leaf) < MIN_LEAF_ROWS:
        raise UserError(f"learner 'dt': min_samples_leaf={min_samples_leaf}: a tree leaf needs at least "
                        f"{MIN_LEAF_ROWS} rows (the k-rows rule)")
    k = int((n_categories or [0] * x.shape[1])[target_index] or 0)
    k = max(k, int(np.nanmax(x[:, target_index])) + 1 if len(x) else 2)
    return TreeClassifier.fit(x, target_index, k, seed, max_depth=max_depth, min_samples_leaf=min_samples_leaf)


register_model("fcdt_tree", TreeClassifier.load)
