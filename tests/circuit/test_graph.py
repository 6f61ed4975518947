"""Graph validity checks and structural helpers."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mpifc.circuit import graph as G
from mpifc.circuit.leaves import Bernoulli, Gaussian
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

from .conftest import LEAF_KINDS, random_circuit


def _b(v: int, p: float = 0.5) -> G.LeafNode:
    return G.LeafNode(v, Bernoulli(p))


def test_non_smooth_sum_is_rejected_naming_the_node() -> None:
    bad = G.SumNode([_b(0), _b(1)], [0.5, 0.5])
    root = G.ProductNode([bad, _b(2)])
    with pytest.raises(UserError, match=rf"sum node {bad.id} .*not smooth"):
        G.validate(root)


def test_non_decomposable_product_is_rejected_naming_the_node() -> None:
    bad = G.ProductNode([_b(0), G.ProductNode([_b(0), _b(1)])])
    root = G.SumNode([bad, G.ProductNode([_b(0), _b(1)])], [0.5, 0.5])
    with pytest.raises(UserError, match=rf"product node {bad.id} .*not decomposable.*\[0\]"):
        G.validate(root)


@pytest.mark.parametrize("w, msg", [([0.5, 0.6], "sum to"), ([1.5, -0.5], "negative"),
                                    ([np.nan, 1.0], "non-finite")])
def test_bad_weights_are_rejected(w: list[float], msg: str) -> None:
    s = G.SumNode([_b(0), _b(0)], w)
    with pytest.raises(UserError, match=rf"sum node {s.id}.*{msg}"):
        G.validate(s)


def test_weight_count_and_leaf_type_and_declared_scope() -> None:
    with pytest.raises(UserError, match="2 weights for 1 children"):
        G.SumNode([_b(0)], [0.5, 0.5])
    with pytest.raises(UserError, match="is not a Leaf"):
        G.validate(G.LeafNode(0, "gaussian"))
    p = G.ProductNode(scope=(0, 1, 2))
    p.add_child(_b(0))
    p.add_child(_b(1))
    with pytest.raises(UserError, match=rf"product node {p.id}.*declared scope"):
        G.validate(p)
    with pytest.raises(UserError, match="has no children"):
        G.validate(G.SumNode(scope=(0,)))
    with pytest.raises(UserError, match="scope_var"):
        G.LeafNode(-1, Bernoulli(0.5))


def test_cycle_is_detected() -> None:
    s = G.SumNode([_b(0)], [1.0])
    p = G.ProductNode([s])
    s.children.append(p)
    s.weights = np.array([0.5, 0.5])
    with pytest.raises(UserError, match="cycle"):
        G.topological_order(s)


def test_top_down_builder_api() -> None:
    s = G.SumNode(scope=(0, 1))
    for p in (0.2, 0.7):
        prod = G.ProductNode(scope=(0, 1))
        prod.add_child(_b(0, p))
        prod.add_child(_b(1, 1 - p))
        s.add_child(prod, 1.0)
    G.normalize_weights(s)
    G.validate(s)
    x = np.array(list(itertools.product([0.0, 1.0], repeat=2)))
    assert float(np.exp(SPN(s).log_likelihood(x)).sum()) == pytest.approx(1.0)


def test_deep_chain_has_no_recursion_limit() -> None:
    # 2000 levels, twice the default recursion limit: traversal, validation and compile.
    node: G.Node = _b(0, 0.3)
    for i in range(2000):
        node = G.SumNode([node, _b(0, 0.6)], [0.5, 0.5])
    G.validate(node)
    assert G.depth(node) == 2000
    assert G.count_nodes(node)["sum"] == 2000
    spn = SPN(node)
    assert float(np.exp(spn.log_likelihood(np.array([[0.0], [1.0]]))).sum()) == pytest.approx(1.0)


def test_topological_order_is_deterministic_and_children_first(rng: np.random.Generator) -> None:
    root = random_circuit((0, 1, 2, 3), LEAF_KINDS[0], rng)
    order = G.topological_order(root)
    assert order[-1] is root and order == G.topological_order(root)
    seen: set[int] = set()
    for n in order:
        assert all(id(c) in seen for c in n.children)
        seen.add(id(n))


def test_shared_nodes_are_visited_once() -> None:
    shared = G.ProductNode([_b(0), _b(1)])
    root = G.SumNode([shared, shared], [0.3, 0.7])
    assert G.count_nodes(root) == {"sum": 1, "product": 1, "leaf": 2, "edges": 4}
    assert G.num_parameters(root) == 2 + 2


def test_collapse_preserves_the_distribution(rng: np.random.Generator) -> None:
    a = G.SumNode([_b(0, 0.2), _b(0, 0.9)], [0.4, 0.6])
    inner = G.SumNode([a, _b(0, 0.5)], [0.7, 0.3])  # sum of sum
    pp = G.ProductNode([G.ProductNode([inner, _b(1, 0.3)]), G.ProductNode([_b(2, 0.8)])])  # product of products
    root = G.SumNode([G.SumNode([pp], [1.0]), G.ProductNode([_b(0), _b(1), _b(2)])], [0.5, 0.5])
    c = G.collapse(root)
    G.validate(c)
    x = np.array(list(itertools.product([0.0, 1.0], repeat=3)))
    torch.testing.assert_close(SPN(c).log_likelihood(x), SPN(root).log_likelihood(x), rtol=0, atol=1e-13)
    counts = G.count_nodes(c)
    assert counts["sum"] == 2 and counts["product"] == 2  # root sum, merged sum, two flat products
    for n in G.topological_order(c):
        if isinstance(n, G.SumNode):
            assert not any(isinstance(k, G.SumNode) for k in n.children)
        if isinstance(n, G.ProductNode):
            assert not any(isinstance(k, G.ProductNode) for k in n.children) and len(n.children) > 1


def test_num_parameters_counts_sum_edges_and_leaf_scalars() -> None:
    root = G.SumNode([G.ProductNode([G.LeafNode(0, Gaussian(0, 1)), _b(1)]),
                      G.ProductNode([G.LeafNode(0, Gaussian(1, 1)), _b(1)])], [0.5, 0.5])
    assert G.num_parameters(root) == 2 + 2 * (2 + 1)
    assert SPN(root).num_parameters() == G.num_parameters(root)
