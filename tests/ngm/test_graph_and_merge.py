"""Dependency graphs and the master merge (intersection of nodes, union of edges)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.merge import merge_graphs, merge_schemas
from mpifc.ngm.schema import Schema, categorical, real


def test_graph_rejects_asymmetry_and_self_loops():
    with pytest.raises(UserError, match="not symmetric.*'a'"):
        DependencyGraph(("a", "b"), np.array([[0, 1], [0, 0]]))
    with pytest.raises(UserError, match="self loop on feature 'b'"):
        DependencyGraph(("a", "b"), np.array([[0, 0], [0, 1]]))
    with pytest.raises(UserError, match="duplicate"):
        DependencyGraph(("a", "a"), np.zeros((2, 2)))
    with pytest.raises(UserError, match="'z'"):
        DependencyGraph.from_edges(("a", "b"), [("a", "z")])


def test_bfs_order_visits_every_component_once():
    g = DependencyGraph.from_edges("abcdef", [("a", "b"), ("b", "c"), ("e", "f")])
    order = g.bfs_order()
    assert sorted(order) == list(range(6))
    # The first root is the node of largest degree (b); each later node in its component has an
    # earlier neighbour, so only component roots lack one.
    assert order[0] == 1
    roots = [j for p, j in enumerate(order) if not g.adjacency[j, order[:p]].any()]
    assert len(roots) == 3


def test_merge_hand_made_graphs():
    g1 = DependencyGraph.from_edges("abcd", [("a", "b"), ("c", "d"), ("b", "d")])
    g2 = DependencyGraph.from_edges("edcb", [("b", "c"), ("d", "e")])
    g3 = DependencyGraph.from_edges("bcdx", [])
    merged = merge_graphs([g1, g2, g3])
    assert merged.names == ("b", "c", "d")  # first client's order
    assert merged.edges() == {frozenset("cd"), frozenset("bd"), frozenset("bc")}
    # An edge seen by only one client survives; one touching a non-shared node does not.
    only_two = merge_graphs([g1, DependencyGraph.from_edges("abcd", [])])
    assert only_two.edges() == g1.edges()


def test_merge_without_common_features_names_the_clients():
    g1 = DependencyGraph.from_edges("ab", [])
    g2 = DependencyGraph.from_edges("cd", [])
    with pytest.raises(UserError, match="hospital-2"):
        merge_graphs([g1, g2], client_names=["hospital-1", "hospital-2"])


@st.composite
def client_graphs(draw):
    universe = list("abcdefg")
    graphs = []
    for _ in range(draw(st.integers(1, 4))):
        names = draw(st.lists(st.sampled_from(universe), min_size=3, max_size=7, unique=True))
        names = ["a", "b"] + [n for n in names if n not in ("a", "b")]  # keep the intersection non-empty
        k = len(names)
        bits = draw(st.lists(st.booleans(), min_size=k * k, max_size=k * k))
        a = np.triu(np.array(bits).reshape(k, k), 1)
        graphs.append(DependencyGraph(tuple(names), a | a.T))
    return graphs


@settings(max_examples=30, deadline=None)
@given(client_graphs())
def test_merge_is_intersection_of_nodes_and_union_of_edges(graphs):
    merged = merge_graphs(graphs)
    common = set.intersection(*(set(g.names) for g in graphs))
    assert set(merged.names) == common
    union = set().union(*(g.edges() for g in graphs))
    assert merged.edges() == {e for e in union if e <= common}


def test_merge_schemas_takes_common_features_and_rejects_type_conflicts():
    s1 = Schema((real("age"), categorical("job", 3), real("x")))
    s2 = Schema((categorical("job", 5), real("age")))
    merged = merge_schemas([s1, s2])
    assert merged.names == ("age", "job")
    assert merged["job"].n_categories == 5
    s3 = Schema((categorical("age", 4), categorical("job", 3)))
    with pytest.raises(UserError, match="'age'.*client 1"):
        merge_schemas([s1, s3])


def test_graph_round_trips_through_arrays():
    g = DependencyGraph.from_edges("abc", [("a", "c")])
    assert DependencyGraph.from_arrays(g.to_arrays()) == g
