"""One variance-floor rule for every learner's Gaussian leaves: a repeated value is never modelled
more finely than the interval it stands for (``tie_variance_floors``); and discrete leaves cover
the declared levels."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.circuit.leaves import Gaussian, tie_variance_floors


def test_the_floor_is_the_variance_of_a_uniform_over_the_most_repeated_values_interval():
    x = np.array([
        [0, 1, 0.0, 7, 0],
        [0, 2, 1.0, 7, 1],
        [0, 2, 2.0, 7, 2],
        [0, 2, 3.0, 7, 0],
        [1, 5, 4.0, 7, 1],
        [2, np.nan, 5.0, 7, 2],
        [3, 6, 6.0, 7, 0],
    ], dtype=float)
    got = tie_variance_floors(x, [True, True, True, True, False])
    # col 0: 0 repeats at the low end: halfway to 1 above, mirrored below -> width 1
    # col 1: 2 repeats: halfway to 1 below (0.5) and to 5 above (1.5) -> width 2
    # col 2: no value repeats; col 3: one value only; col 4: not real
    np.testing.assert_allclose(got, [1 / 12, 4 / 12, 0.0, 0.0, 0.0], rtol=0, atol=1e-15)


def _atom_data(n: int = 600, seed: int = 0) -> np.ndarray:
    """Column 0: 70% of the rows on 0 (a point mass, as an imputed median or a zero-inflated
    amount in normal-score units), the rest at least 0.5 away; columns 1-3 Gaussian."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    x[:, 0] = np.where(np.arange(n) < int(0.7 * n), 0.0, 0.5 + np.abs(x[:, 0]))
    x[:, 1] += x[:, 0]
    return x


def test_learnspn_gaussian_leaves_respect_the_floor():
    from mpifc.circuit.graph import LeafNode, topological_order
    from mpifc.circuit.learnspn import learn_spn

    x = _atom_data()
    floor = tie_variance_floors(x, [True] * 4)
    assert floor[0] > 1e-2
    spn = learn_spn(x, ["real"] * 4, threshold=0.3, min_instances_slice=100, seed=0)
    leaves = [n for n in topological_order(spn.root) if isinstance(n, LeafNode) and isinstance(n.dist, Gaussian)]
    on_atom = [float(n.dist.params()["var"]) for n in leaves if n.scope[0] == 0]
    assert on_atom and min(on_atom) >= floor[0] * (1 - 1e-12)
    assert min(on_atom) == pytest.approx(floor[0])  # a slice of the repeated rows hits the floor


def test_ratspn_and_einet_gaussians_respect_the_floor():
    from mpifc.federated.learners import fit_leaf

    x = _atom_data(seed=1)
    floor = tie_variance_floors(x, [True] * 4)
    rat = fit_leaf("ratspn", x, ["real"] * 4, 0, em_iters=10)
    slot_var = np.repeat(np.concatenate([np.arange(4), [4]])[rat.gidx.numpy().reshape(-1)], rat._shape[3])
    var = rat.P["var"].numpy()
    assert var[slot_var == 0].min() >= floor[0] * (1 - 1e-12)
    ein = fit_leaf("einet", x, ["real"] * 4, 0, epochs=3, num_sums=3, depth=1, repetitions=2)
    assert ein.config.var_min_var == tuple(floor)
    lf = ein.leaf
    slot = ein.slot_var.reshape(-1)
    ev = lf.params["var"].double().reshape(lf.num_slots, -1)
    assert float(ev[slot == 0].min()) >= floor[0] * (1 - 1e-6)


def test_learnspn_discrete_leaves_cover_declared_levels_missing_from_the_rows():
    from mpifc.federated.learners import fit_leaf

    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(size=300), rng.integers(0, 3, 300)]).astype(float)
    spn = fit_leaf("learnspn", x, ["real", "discrete"], 0, n_categories=[0, 5], min_instances_slice=50)
    probe = np.column_stack([np.full(5, np.nan), np.arange(5.0)])
    mass = np.exp(spn.log_likelihood(probe))
    assert mass.sum() == pytest.approx(1.0, abs=1e-12) and mass[3:].min() > 0


def test_a_cluster_whose_rows_are_one_value_gets_the_floor_of_the_clients_rows():
    # Vertical FL: client 0 clusters its rows (K=2) and fits one RAT-SPN per cluster. The rows
    # with the repeated value form one cluster, where the column is constant: without the
    # client's floor its Gaussians would shrink to min_var and claim ~+6 nats per row.
    from mpifc.federated.one_pass import ClientDeclaration, OnePassBuilder, build_single_process, ids_digest

    rng = np.random.default_rng(5)
    n = 400
    atom = np.arange(n) < 280
    a = np.where(atom, 0.0, 0.5 + np.abs(rng.normal(size=n)))
    b = np.where(atom, -3.0, 3.0) + 0.1 * rng.normal(size=n)
    c, d = rng.normal(size=n), rng.normal(size=n)
    ids = np.arange(n, dtype=np.int64)
    decl = [ClientDeclaration(0, ("a", "b"), ("real", "real"), (0, 0), n, ids_digest(ids)),
            ClientDeclaration(1, ("c", "d"), ("real", "real"), (0, 0), n, ids_digest(ids))]
    b1 = OnePassBuilder(n_clusters=2, n_products=1, seed=0, learner="ratspn", glue="combinatorial",
                        hyperparameters={"em_iters": 5})
    fc = build_single_process(b1, [(decl[0], np.column_stack([a, b])), (decl[1], np.column_stack([c, d]))],
                              ["a", "b", "c", "d"], None, "vertical")
    floor = tie_variance_floors(np.column_stack([a, b]), [True, True])[0]
    assert floor > 1e-2
    client0 = [n.leaf.model for n in fc.leaves if n.leaf.client == 0]
    assert len(client0) == 2
    for m in client0:
        slot_var = np.repeat(np.concatenate([np.arange(2), [2]])[m.gidx.numpy().reshape(-1)], m._shape[3])
        assert m.P["var"].numpy()[slot_var == 0].min() >= floor * (1 - 1e-12)
