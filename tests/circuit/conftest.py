"""Shared tiny circuits and leaf factories for the circuit tests (the contract battery)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from mpifc.circuit.graph import LeafNode, Node, ProductNode, SumNode
from mpifc.circuit.leaves import (Bernoulli, Categorical, DiscretizedGaussian, Gaussian, Histogram, Leaf,
                                  PiecewiseLinear)

torch.set_num_threads(1)


@dataclass(frozen=True)
class LeafKind:
    """How to draw random leaves of one type, and its domain for brute-force checks.

    ``domain`` is the finite support (discrete) or ``None`` (continuous, integrate on ``box``).
    """

    name: str
    make: Callable[[np.random.Generator], Leaf]
    domain: tuple[float, ...] | None
    box: tuple[float, float] = (0.0, 0.0)
    em: bool = True


def _gauss(r: np.random.Generator) -> Leaf:
    return Gaussian(r.uniform(-1, 1), r.uniform(0.3, 1.0), min_var=1e-3)


def _hist(r: np.random.Generator) -> Leaf:
    br = np.array([-1.0, -0.2, 0.5, 1.5])
    d = r.uniform(0.2, 1.0, 3)
    # tail=0: the battery integrates over the body ``box``; tails have their own tests.
    return Histogram(br, d / (d * np.diff(br)).sum(), alpha=1e-3, tail=0.0)


def _pwl(r: np.random.Generator) -> Leaf:
    xs = np.array([-1.0, -0.3, 0.4, 1.2])
    ys = np.concatenate([[0.0], r.uniform(0.2, 1.0, 2), [r.uniform(0, 0.5)]])
    return PiecewiseLinear(xs, ys / np.trapezoid(ys, xs), tail=0.0)


def _dg(r: np.random.Generator) -> Leaf:
    return DiscretizedGaussian(r.uniform(0.2, 0.8), r.uniform(0.02, 0.2), levels=4, bin_width=0.25)


def _hist_disc(r: np.random.Generator) -> Leaf:
    return Histogram([0, 1, 2, 3], r.dirichlet(np.ones(3)), discrete=True, alpha=1e-3)


LEAF_KINDS = [
    LeafKind("bernoulli", lambda r: Bernoulli(r.uniform(0.1, 0.9), alpha=1e-3), (0.0, 1.0)),
    LeafKind("categorical", lambda r: Categorical(r.dirichlet(np.ones(3)), alpha=1e-3), (0.0, 1.0, 2.0)),
    LeafKind("histogram_discrete", _hist_disc, (0.0, 1.0, 2.0)),
    LeafKind("discretized_gaussian", _dg, (0.0, 1.0, 2.0, 3.0)),
    LeafKind("gaussian", _gauss, None, (-7.0, 7.0)),
    LeafKind("histogram", _hist, None, (-1.0, 1.5)),
    LeafKind("piecewise_linear", _pwl, None, (-1.0, 1.2)),
]
DISCRETE_KINDS = [k for k in LEAF_KINDS if k.domain is not None]
CONTINUOUS_KINDS = [k for k in LEAF_KINDS if k.domain is None]


def ids(kinds: list[LeafKind]) -> list[str]:
    return [k.name for k in kinds]


def random_circuit(scope: tuple[int, ...], kind: LeafKind, rng: np.random.Generator, depth: int = 3) -> Node:
    """A random valid (smooth, decomposable) circuit over ``scope``: sums of random splits."""
    if len(scope) == 1 or depth == 0:
        if len(scope) == 1:
            k = int(rng.integers(1, 3))
            kids = [LeafNode(scope[0], kind.make(rng)) for _ in range(k)]
            return kids[0] if k == 1 else SumNode(kids, rng.dirichlet(np.ones(k)))
        return ProductNode([random_circuit((v,), kind, rng, 0) for v in scope])
    k = int(rng.integers(2, 4))
    kids: list[Node] = []
    for _ in range(k):
        perm = list(rng.permutation(scope))
        cut = int(rng.integers(1, len(scope)))
        a, b = tuple(sorted(perm[:cut])), tuple(sorted(perm[cut:]))
        kids.append(ProductNode([random_circuit(a, kind, rng, depth - 1), random_circuit(b, kind, rng, depth - 1)]))
    return SumNode(kids, rng.dirichlet(np.ones(k)))


def enumerate_domain(kind: LeafKind, n_vars: int) -> np.ndarray:
    """All assignments ``(|domain|^n_vars, n_vars)``."""
    return np.array(list(itertools.product(kind.domain, repeat=n_vars)), dtype=np.float64)


def grid(kind: LeafKind, n: int) -> tuple[np.ndarray, float]:
    """Midpoint grid on ``kind.box`` with ``n`` cells: (points, cell width)."""
    lo, hi = kind.box
    h = (hi - lo) / n
    return lo + h * (np.arange(n) + 0.5), h


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
