"""Pure partitioning functions: coverage, disjointness, label purity, patches, hybrid blocks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from data_prep import partition as P
from mpifc.errors import UserError


def _assert_exact_cover(parts: list[np.ndarray], rows: np.ndarray) -> None:
    joined = np.concatenate(parts)
    assert joined.size == rows.size, "a row was dropped or used twice"
    assert np.array_equal(np.sort(joined), np.sort(rows))
    for p in parts:
        assert np.all(np.diff(p) > 0), "each part is sorted and has no duplicates"


@settings(max_examples=30, deadline=None)
@given(n_rows=st.integers(1, 300), n_clients=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_iid_covers_every_row_once_in_balanced_parts(n_rows, n_clients, seed):
    rows = np.arange(1000, 1000 + n_rows)
    parts = P.split_iid(rows, n_clients, np.random.default_rng(seed))
    _assert_exact_cover(parts, rows)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=30, deadline=None)
@given(n_rows=st.integers(1, 400), n_classes=st.integers(1, 6), n_clients=st.integers(1, 8),
       alpha=st.floats(0.05, 50.0), seed=st.integers(0, 2**16))
def test_dirichlet_covers_every_row_once(n_rows, n_classes, n_clients, alpha, seed):
    rng = np.random.default_rng(seed)
    rows = rng.permutation(5 * n_rows)[:n_rows]
    labels = rng.integers(0, n_classes, n_rows)
    props = P.dirichlet_proportions(n_classes, n_clients, alpha, rng)
    assert np.allclose(props.sum(axis=1), 1.0)
    _assert_exact_cover(P.split_by_proportions(rows, labels, props, rng), rows)


def test_dirichlet_small_alpha_is_skewed_and_large_alpha_is_even():
    rng = np.random.default_rng(0)
    skewed = P.dirichlet_proportions(10, 5, 0.05, rng)
    even = P.dirichlet_proportions(10, 5, 1000.0, rng)
    assert skewed.max(axis=1).mean() > 0.8
    assert np.abs(even - 0.2).max() < 0.05


def test_dirichlet_rejects_non_positive_alpha():
    with pytest.raises(UserError, match="--alpha"):
        P.dirichlet_proportions(2, 2, 0.0, np.random.default_rng(0))


@pytest.mark.parametrize("n_classes,n_clients", [(10, 10), (10, 3), (2, 5), (3, 3)])
def test_label_split_gives_each_client_only_its_classes(n_classes, n_clients):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, n_classes, 2000)
    rows = np.arange(2000)
    owners = P.class_owners(n_classes, n_clients, rng)
    assert all(owners), "every class has an owner"
    held = {i for who in owners for i in who}
    assert held == set(range(n_clients)), "every client owns a class"
    parts = P.split_by_label(rows, labels, owners, n_clients, rng)
    _assert_exact_cover(parts, rows)
    for i, part in enumerate(parts):
        mine = {c for c, who in enumerate(owners) if i in who}
        assert set(np.unique(labels[part])) <= mine
    if n_classes >= n_clients:
        assert all(len(who) == 1 for who in owners), "a class lives on one client"


def test_label_split_one_class_per_client_for_ten_digits():
    owners = P.class_owners(10, 10, np.random.default_rng(3))
    assert sorted(who[0] for who in owners) == list(range(10))


def test_split_by_weights_is_disjoint_and_favours_heavy_clients():
    rng = np.random.default_rng(0)
    rows = np.arange(20000)
    match = rng.random(20000) < 0.2
    weights = np.ones((20000, 3))
    weights[match, 0] = 4.0
    parts = P.split_by_weights(rows, weights, rng)
    _assert_exact_cover(parts, rows)
    rate0 = match[parts[0]].mean()
    rate_others = match[np.concatenate(parts[1:])].mean()
    # a matching row lands on client 0 w.p. 4/6, another row w.p. 1/3, so client 0's match
    # rate is (0.2*4/6) / (0.2*4/6 + 0.8/3) = 1/3
    # and the others' (0.2*2/6) / (0.2*2/6 + 0.8*2/3) = 1/9
    assert 0.31 < rate0 < 0.36
    assert 0.09 < rate_others < 0.13


def test_random_feature_groups_are_disjoint_nonempty_and_cover():
    feats = [f"f{j}" for j in range(11)]
    groups = P.random_feature_groups(feats, 4, np.random.default_rng(0))
    assert all(groups)
    assert sorted(sum(groups, [])) == sorted(feats)
    for g in groups:
        assert g == sorted(g, key=feats.index), "canonical order inside a group"


def test_more_clients_than_features_is_a_user_error():
    with pytest.raises(UserError, match="cannot split 3 features among 4 clients"):
        P.random_feature_groups(["a", "b", "c"], 4, np.random.default_rng(0))


@pytest.mark.parametrize("n,expected", [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (6, (2, 3)),
                                        (7, (1, 7))])
def test_grid_shape_is_the_squarest_factoring(n, expected):
    assert P.grid_shape(n, 28, 28) == expected


def test_grid_shape_errors():
    with pytest.raises(UserError, match="--patches 2x2 gives 4 patches for 3 clients"):
        P.grid_shape(3, 8, 8, (2, 2))
    with pytest.raises(UserError, match="does not fit"):
        P.grid_shape(9, 2, 2)


def test_patches_without_overlap_tile_the_image_exactly():
    h, w = 7, 9
    names = [f"px_{r}_{c}" for r in range(h) for c in range(w)]
    boxes = P.patch_boxes(h, w, (2, 3), overlap=0)
    groups = [P.box_features(b, w, names) for b in boxes]
    assert sorted(sum(groups, [])) == sorted(names), "every pixel exactly once"
    assert all(len(g) >= 6 for g in groups)


def test_patches_with_overlap_share_border_pixels_between_neighbours():
    h = w = 8
    names = [f"px_{r}_{c}" for r in range(h) for c in range(w)]
    groups = [set(P.box_features(b, w, names)) for b in P.patch_boxes(h, w, (2, 2), 1)]
    assert set().union(*groups) == set(names)
    assert groups[0] & groups[1] and groups[0] & groups[2], "neighbours overlap"
    assert all(len(g) == 25 for g in groups), "4x4 quadrant grown by one pixel inwards"


def test_hybrid_blocks_share_a_block_and_split_the_rest():
    feats = [f"f{j}" for j in range(10)]
    shared, private = P.hybrid_feature_blocks(feats, 3, 2, np.random.default_rng(0))
    assert len(shared) == 2 and all(private)
    assert sorted(shared + sum(private, [])) == sorted(feats)
    assert not set(shared) & set(sum(private, []))
    with pytest.raises(UserError, match="private feature per client"):
        P.hybrid_feature_blocks(feats, 3, 8, np.random.default_rng(0))


def _spec(**kw):
    base = dict(setting="horizontal", n_clients=3, seed=0)
    base.update(kw)
    return P.PartitionSpec(**base)


def test_make_partition_vertical_aligns_samples_and_places_label():
    train, test = np.arange(0, 80), np.arange(80, 100)
    feats = ["a", "b", "c", "d", "e"]
    part = P.make_partition(_spec(setting="vertical", label_owner=1), train, test, feats, "y")
    for c in part.clients:
        assert np.array_equal(c.train_rows, train) and np.array_equal(c.test_rows, test)
    owned = [c.features for c in part.clients]
    assert [("y" in f) for f in owned] == [False, True, False]
    assert sorted(n for f in owned for n in f if n != "y") == feats


def test_make_partition_errors_name_the_problem():
    train, test = np.arange(10), np.arange(10, 12)
    with pytest.raises(UserError, match="client 3 would get no training rows"):
        P.make_partition(_spec(n_clients=4), np.arange(3), test, ["a"], None)
    with pytest.raises(UserError, match="needs a dataset with a target"):
        P.make_partition(_spec(split="label"), train, test, ["a"], None)
    with pytest.raises(UserError, match="--label-owner"):
        P.make_partition(_spec(setting="vertical", label_owner=5), train, test,
                         ["a", "b", "c"], "y")
    with pytest.raises(UserError, match="central has exactly one client"):
        P.make_partition(_spec(setting="central"), train, test, ["a"], None)
    with pytest.raises(UserError, match="--split label splits samples"):
        P.make_partition(_spec(setting="vertical", split="label"), train, test, ["a"] * 3,
                         "y", labels=np.zeros(12, np.int64))
    with pytest.raises(UserError, match="--label-owner applies to vertical and hybrid"):
        P.make_partition(_spec(label_owner=1), train, test, ["a"], "y")


def test_make_partition_is_deterministic_per_seed():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    feats = [f"f{j}" for j in range(8)]

    def run(seed):
        part = P.make_partition(_spec(setting="hybrid", split="dirichlet", seed=seed),
                                np.arange(250), np.arange(250, 300), feats, "y", labels=labels)
        return [(c.train_rows.tolist(), c.test_rows.tolist(), c.features) for c in part.clients]

    assert run(7) == run(7)
    assert run(7) != run(8)


@settings(max_examples=40, deadline=None)
@given(setting=st.sampled_from(["central", "horizontal", "vertical", "hybrid"]),
       n_train=st.integers(8, 120), n_feat=st.integers(5, 12), n_clients=st.integers(2, 4),
       split=st.sampled_from(["iid", "label", "dirichlet"]), seed=st.integers(0, 999))
def test_every_train_cell_is_held_and_rows_are_consistent(setting, n_train, n_feat, n_clients,
                                                           split, seed):
    if setting == "central":
        n_clients = 1
    if setting in ("central", "vertical"):
        split = "iid"
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n_train + 10)
    feats = [f"f{j}" for j in range(n_feat)]
    spec = P.PartitionSpec(setting=setting, n_clients=n_clients, seed=seed, split=split,
                           alpha=5.0)
    try:
        part = P.make_partition(spec, np.arange(n_train), np.arange(n_train, n_train + 10),
                                feats, "y", labels=labels)
    except UserError as err:  # an empty client is a legal outcome of a skewed split
        assert "would get no training rows" in str(err)
        return
    held = np.zeros((n_train, n_feat), dtype=int)
    for c in part.clients:
        cols = [feats.index(f) for f in c.features if f != "y"]
        held[np.ix_(c.train_rows, cols)] += 1
        assert set(c.test_rows) <= set(range(n_train, n_train + 10))
    assert (held.sum(axis=1) > 0).all() and (held.sum(axis=0) > 0).all()
    if setting != "hybrid":
        assert (held == 1).all()
    else:
        rows = [set(c.train_rows) for c in part.clients]
        assert sum(len(r) for r in rows) == n_train, "hybrid clients hold disjoint samples"
        shared = set.intersection(*(set(c.features) for c in part.clients)) - {"y"}
        assert shared, "at least one feature on every client"


def test_dirichlet_redraws_until_no_client_is_empty():
    labels = np.random.default_rng(0).integers(0, 2, 60)
    spec = P.PartitionSpec(setting="horizontal", n_clients=6, seed=1, split="dirichlet",
                           alpha=0.1)
    part = P.make_partition(spec, np.arange(50), np.arange(50, 60), ["a"], "y", labels=labels)
    assert part.info["dirichlet_draws"] > 1, "alpha 0.1 over 2 classes leaves clients empty"
    assert all(c.train_rows.size for c in part.clients)
    again = P.make_partition(spec, np.arange(50), np.arange(50, 60), ["a"], "y", labels=labels)
    assert [c.train_rows.tolist() for c in again.clients] == \
        [c.train_rows.tolist() for c in part.clients]
