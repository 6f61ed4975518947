"""HDF5 round trips are exact (bit-identical outputs), and malformed files fail clearly."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from mpifc.circuit.graph import LeafNode, ProductNode, SumNode
from mpifc.circuit.io import load_model, load_model_file, save_model_file
from mpifc.circuit.ratspn import RatSPN
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

from .conftest import LEAF_KINDS, random_circuit


def _mixed_circuit() -> SPN:
    """Every leaf type in one circuit: one variable per kind, a mixture of two factorisations."""
    rng = np.random.default_rng(0)
    comps = []
    for _ in range(2):
        comps.append(ProductNode([LeafNode(v, k.make(rng)) for v, k in enumerate(LEAF_KINDS)]))
    return SPN(SumNode(comps, [0.3, 0.7]))


def _probe(n_vars: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (64, n_vars)).astype(float) + rng.normal(0, 0.3, (64, n_vars)) * (rng.random((64, n_vars)) < 0.5)
    x[rng.random(x.shape) < 0.2] = np.nan
    return x


def test_spn_round_trip_is_bit_identical(tmp_path: Path) -> None:
    spn = _mixed_circuit()
    x = _probe(len(LEAF_KINDS))
    spn.apply_em(spn.em_statistics(x))  # parameters after EM must be saved, not the initial ones
    save_model_file(spn, tmp_path / "m.h5")
    back = load_model_file(tmp_path / "m.h5")
    assert isinstance(back, SPN) and back.scope == spn.scope
    assert np.array_equal(back.log_likelihood(x), spn.log_likelihood(x))
    np.testing.assert_array_equal(back.mpe(x), spn.mpe(x))
    np.testing.assert_array_equal(back.sample(20, 5), spn.sample(20, 5))
    assert back.num_parameters() == spn.num_parameters()
    # and a second save of the loaded model writes the same arrays
    save_model_file(back, tmp_path / "m2.h5")
    with h5py.File(tmp_path / "m.h5") as a, h5py.File(tmp_path / "m2.h5") as b:
        for k in ("kind", "n_children", "child_idx", "sum_weights", "leaf_var", "leaf_type"):
            np.testing.assert_array_equal(a["model"][k][()], b["model"][k][()])


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=[k.name for k in LEAF_KINDS])
def test_random_circuit_round_trip(kind, tmp_path: Path) -> None:
    spn = SPN(random_circuit((0, 3, 4), kind, np.random.default_rng(3)))
    save_model_file(spn, tmp_path / "m.h5")
    back = load_model_file(tmp_path / "m.h5")
    x = _probe(3, 1)
    assert back.scope == (0, 3, 4)
    assert np.array_equal(back.log_likelihood(x), spn.log_likelihood(x))


@pytest.mark.parametrize("leaf, kw", [("gaussian", {"min_var": 1e-3, "max_var": 0.25}), ("bernoulli", {}),
                                      ("categorical", {"n_categories": 3}),
                                      ("discretized_gaussian", {"levels": 3, "bin_width": 0.5})])
def test_ratspn_round_trip_is_bit_identical(leaf: str, kw: dict, tmp_path: Path) -> None:
    m = RatSPN(7, depth=2, repetitions=2, num_sums=3, num_leaves=2, num_roots=2, leaf=leaf, leaf_kwargs=kw, seed=4)
    x = np.clip(np.round(np.abs(_probe(7, 2))), 0, 1 if leaf == "bernoulli" else 2)
    m.apply_em(m.em_statistics(x))
    save_model_file(m, tmp_path / "r.h5")
    back = load_model_file(tmp_path / "r.h5")
    assert isinstance(back, RatSPN)
    assert np.array_equal(back.log_likelihood(x), m.log_likelihood(x))
    np.testing.assert_array_equal(back.mpe(x), m.mpe(x))
    np.testing.assert_array_equal(back.sample(10, 1), m.sample(10, 1))
    assert back.num_parameters() == m.num_parameters()


def test_malformed_group_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.h5"
    save_model_file(_mixed_circuit(), p)
    with h5py.File(p, "a") as f:
        del f["model"]["child_idx"]
    with pytest.raises(UserError, match=r"bad\.h5.*malformed spn"):
        load_model_file(p)
    with h5py.File(p, "a") as f:
        g = f.create_group("r")
        g.attrs["model_type"] = "ratspn"
    with h5py.File(p, "r") as f, pytest.raises(UserError, match=r"bad\.h5.*malformed ratspn"):
        load_model(f["r"])


def test_no_pickle_in_files(tmp_path: Path) -> None:
    save_model_file(_mixed_circuit(), tmp_path / "m.h5")
    save_model_file(RatSPN(4, depth=1, seed=0), tmp_path / "r.h5")
    for name in ("m.h5", "r.h5"):
        with h5py.File(tmp_path / name) as f:
            def check(_: str, obj) -> None:
                if isinstance(obj, h5py.Dataset):
                    assert obj.dtype.kind in "fiu", obj.name
            f.visititems(check)


def test_float32_spn_round_trip_keeps_dtype(tmp_path: Path) -> None:
    spn = SPN(random_circuit((0, 1, 2), LEAF_KINDS[4], np.random.default_rng(5)), dtype=torch.float32)
    save_model_file(spn, tmp_path / "m.h5")
    back = load_model_file(tmp_path / "m.h5")
    x = _probe(3, 4)
    assert back.log_likelihood(x).dtype == np.float32
    assert np.array_equal(back.log_likelihood(x), spn.log_likelihood(x))


def _write_layout1(root, group) -> None:
    """The layout-1 writer of the first model files (int64 CSR arrays, every node's scope, zero product
    weights, every known leaf type listed), kept here to prove old files still load."""
    from mpifc.circuit import graph as G
    from mpifc.circuit.leaves import LEAF_TYPES

    order = G.topological_order(root)
    pos = {id(n): i for i, n in enumerate(order)}
    names = list(LEAF_TYPES)
    kinds = {"leaf": 0, "product": 1, "sum": 2}
    group.create_dataset("kind", data=np.array([kinds[n.kind] for n in order], dtype=np.int8))
    group.create_dataset("child_ptr", data=np.cumsum([0] + [len(n.children) for n in order]).astype(np.int64))
    group.create_dataset("child_idx", data=np.array([pos[id(c)] for n in order for c in n.children], dtype=np.int64))
    group.create_dataset("weights", data=np.concatenate(
        [n.weights if isinstance(n, SumNode) else np.zeros(len(n.children)) for n in order]).astype(np.float64))
    group.create_dataset("scope_ptr", data=np.cumsum([0] + [len(n.scope) for n in order]).astype(np.int64))
    group.create_dataset("scope_vars", data=np.array([v for n in order for v in n.scope], dtype=np.int64))
    group.create_dataset("leaf_type", data=np.array(
        [names.index(n.dist.type_name) if isinstance(n, LeafNode) else -1 for n in order], dtype=np.int8))
    group.attrs["leaf_types"] = names
    group.attrs["model_type"] = "spn"
    group.attrs["dtype"] = "float64"
    lg = group.create_group("leaves")
    for t, name in enumerate(names):
        mine = [n.dist for n in order if isinstance(n, LeafNode) and n.dist.type_name == name]
        if not mine:
            continue
        cls = LEAF_TYPES[name]
        sub = lg.create_group(name)
        for p in cls.param_names:
            arrs = [lf.params()[p] for lf in mine]
            sub.create_dataset(p, data=np.concatenate([a.reshape(-1) for a in arrs]))
            if p in cls.ragged:
                sub.create_dataset(p + ".len", data=np.array([a.size for a in arrs], dtype=np.int64))


def test_layout1_files_still_load(tmp_path: Path) -> None:
    spn = _mixed_circuit()
    x = _probe(len(LEAF_KINDS))
    with h5py.File(tmp_path / "old.h5", "w") as f:
        _write_layout1(spn.root, f.create_group("model"))
    back = load_model_file(tmp_path / "old.h5")
    assert np.array_equal(back.log_likelihood(x), spn.log_likelihood(x))
    np.testing.assert_array_equal(back.sample(20, 5), spn.sample(20, 5))


def test_layout2_is_compact_and_exact(tmp_path: Path) -> None:
    """Small circuits get uint8 indices, product edges carry no weights, shared leaf settings
    are stored once, and the file is much smaller than layout 1."""
    from mpifc.circuit.leaves import Gaussian

    rng = np.random.default_rng(1)
    comps = [ProductNode([LeafNode(v, Gaussian(rng.normal(), 0.5 + rng.random(), min_var=1e-3, max_var=4.0))
                          for v in range(6)]) for _ in range(5)]
    spn = SPN(SumNode(comps, rng.dirichlet(np.ones(5))))
    save_model_file(spn, tmp_path / "new.h5")
    with h5py.File(tmp_path / "old.h5", "w") as f:
        _write_layout1(spn.root, f.create_group("model"))

    def payload(path: Path) -> int:
        total = []
        with h5py.File(path) as f:
            f["model"].visititems(lambda _, o: total.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
        return sum(total)

    with h5py.File(tmp_path / "new.h5") as f:
        g = f["model"]
        assert g.attrs["layout"] == 2 and list(g.attrs["leaf_types"]) == ["gaussian"]
        assert g["child_idx"].dtype == np.uint8 and g["leaf_var"].dtype == np.uint8
        assert g["sum_weights"].shape == (5,) and "leaf_type" not in g and "scope_vars" not in g
        assert g["leaves/gaussian/min_var"].shape == (1,) and g["leaves/gaussian/mean"].shape == (30,)
    assert payload(tmp_path / "new.h5") < 0.5 * payload(tmp_path / "old.h5")
    x = rng.normal(size=(50, 6))
    back = load_model_file(tmp_path / "new.h5")
    assert np.array_equal(back.log_likelihood(x), spn.log_likelihood(x))


def test_declared_scopes_survive_a_round_trip(tmp_path: Path) -> None:
    """An inner node whose declared scope is not its children's union keeps it (scopes written)."""
    from mpifc.circuit import graph as G
    from mpifc.circuit.leaves import Bernoulli

    leaf = LeafNode(0, Bernoulli(0.3))
    prod = ProductNode([leaf, LeafNode(2, Bernoulli(0.6))], scope=(0, 1, 2))
    spn_root = SumNode([prod], [1.0])
    g_order = G.topological_order(spn_root)
    with h5py.File(tmp_path / "m.h5", "w") as f:
        grp = f.create_group("model")
        from mpifc.circuit.spn import save_graph, load_graph

        save_graph(spn_root, grp)
        assert "scope_vars" in grp
        back = load_graph(grp)
    assert [tuple(n.scope) for n in G.topological_order(back)] == [tuple(n.scope) for n in g_order]


def _model_of_each_kind(kind: str):
    from mpifc.circuit.einet import EiNet, EiNetConfig
    from mpifc.federated.factorized import FactorizedModel

    if kind == "ratspn":
        return RatSPN(5, depth=2, repetitions=2, num_sums=2, num_leaves=2, leaf="gaussian", seed=0)
    if kind == "einet":
        return EiNet.poon_domingos((2, 2), [2], EiNetConfig(num_sums=2, leaf="gaussian", num_levels=3, dtype="float64"))
    if kind == "fcdt":
        from mpifc.federated.fcdt import TreeClassifier

        return TreeClassifier(3, 2, [1, -1, -1], [2, -1, -1], [0, -2, -2], [0.5, -2.0, -2.0],
                              [[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    x = np.random.default_rng(0).normal(size=(50, 3))
    x[:, 2] = np.arange(50) % 3
    return FactorizedModel.fit(x, ["real", "real", "categorical"], [0, 0, 3])


@pytest.mark.parametrize("kind,dataset,index,value,needle", [
    ("ratspn", "leaves/var", 3, -1.0, "'var'[3] = -1.0: a variance must be finite and > 0"),
    ("ratspn", "weights0", 0, 2.0, "'weights0' are not normalised"),
    ("ratspn", "root_weights", 0, np.nan, "'root_weights' holds a weight that is negative or not finite"),
    ("einet", "params/leaf_var", 1, 0.0, "'var' holds a variance <= 0"),
    ("einet", "params/mixing_1", 0, 0.3, "'mixing_1' are not normalised"),
    ("einet", "params/einsum_0", 0, -0.1, "'einsum_0' holds a weight that is negative"),
    ("factorized", "var", 1, -2.0, "'var'[1] = -2.0"),
    ("factorized", "log_probs", 6, np.inf, "'log_probs'[2]"),
    ("fcdt", "left", 0, 0, "a child id out of range"),
    ("fcdt", "feature", 0, 5, "'feature': a split on a column outside 0..1"),
    ("fcdt", "probs", 2, 1.5, "'probs': a node's class probabilities are not a distribution"),
], ids=lambda v: v if isinstance(v, str) and "/" not in v and " " not in v else None)
def test_a_model_with_a_parameter_out_of_its_domain_is_refused_on_load(kind, dataset, index, value, needle, tmp_path):
    """Each model type's loader checks its own parameters (file and wire alike), naming the file
    and the parameter: a model edited on purpose must not answer."""
    path = tmp_path / "bad.h5"
    save_model_file(_model_of_each_kind(kind), path)
    load_model_file(path)  # as written: fine
    with h5py.File(path, "r+") as f:
        ds = f[f"model/{dataset}"]
        a = ds[()]
        a.reshape(-1)[index] = value
        ds[...] = a
    with pytest.raises(UserError) as e:
        load_model_file(path)
    assert "bad.h5" in str(e.value) and needle in str(e.value), str(e.value)
