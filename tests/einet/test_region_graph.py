import pytest

from mpifc.circuit.einet import poon_domingos, random_binary_trees
from mpifc.errors import UserError


def test_pd_regions_are_all_grid_rectangles():
    g = poon_domingos((4, 4), [2])
    g.validate()
    # A 2x2 grid of cells: 9 rectangles; cuts: 1x2 and 2x1 strips have 1 each, the root 2.
    assert len(g.regions) == 9
    assert len(g.partitions) == 2 + 4 * 1
    assert len(g.leaf_regions()) == 4
    assert all(len(g.regions[r]) == 4 for r in g.leaf_regions())


def test_pd_channels_stay_together_and_layers_are_ordered():
    g = poon_domingos((2, 3, 3), [2, 3])
    g.validate()
    for r in g.regions:
        pixels = {v // 3 for v in r}
        assert len(r) == 3 * len(pixels)
    h = g.heights()
    layers = g.partition_layers()
    seen = set(g.leaf_regions())
    for layer in layers:
        for pid in layer:
            _, left, right = g.partitions[pid]
            assert left in seen and right in seen
        seen |= {g.partitions[p][0] for p in layer}
    assert {g.partitions[p][0] for p in layers[-1]} == {g.root}
    assert h[g.root] == len(layers)


def test_random_binary_trees_cover_every_variable_once_per_repetition():
    g = random_binary_trees(13, depth=3, repetitions=4, seed=1)
    g.validate()
    assert len([p for p in g.partitions if p[0] == g.root]) == 4
    leaves = [set(g.regions[r]) for r in g.leaf_regions()]
    counts = [sum(v in leaf for leaf in leaves) for v in range(13)]
    assert counts == [4] * 13
    assert random_binary_trees(13, 3, 4, seed=1) == g


@pytest.mark.parametrize("call", [
    lambda: poon_domingos((4,), [2]),
    lambda: poon_domingos((4, 4), [0]),
    lambda: poon_domingos((4, 4), []),
    lambda: random_binary_trees(5, -1, 1),
    lambda: random_binary_trees(5, 2, 0),
])
def test_bad_structure_arguments_raise_user_error(call):
    with pytest.raises(UserError):
        call()
