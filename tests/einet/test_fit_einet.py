"""``fit_einet``: the EiNet learner used as a federated client PC."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mpifc.circuit.einet import EiNet, fit_einet
from mpifc.errors import UserError


def test_fit_einet_on_binary_data_is_normalised_and_beats_uniform():
    rng = np.random.default_rng(0)
    z = rng.integers(0, 2, size=(400, 1))
    x = np.where(rng.random((400, 5)) < 0.85, z, 1 - z).astype(np.float64)  # strongly dependent bits
    model = fit_einet(x, ["discrete"] * 5, seed=1, num_sums=3, depth=2, repetitions=2, epochs=5,
                      batch_size=None)
    assert isinstance(model, EiNet)
    grid = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    total = np.exp(model.log_likelihood(grid)).sum()
    assert abs(total - 1.0) < 1e-9
    # uniform is 5 ln 0.5 = -3.47 nats; the true entropy is about 2.81 nats
    assert model.log_likelihood(x).mean().item() > 5 * np.log(0.5) + 0.2


def test_fit_einet_on_real_data_uses_gaussian_leaves_and_is_finite():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    model = fit_einet(x, ["real"] * 4, seed=0, num_sums=2, epochs=2)
    ll = model.log_likelihood(x)
    assert np.isfinite(ll).all()
    again = fit_einet(x, ["real"] * 4, seed=0, num_sums=2, epochs=2)
    assert np.array_equal(again.log_likelihood(x), ll)


def test_leaf_region_vars_sizes_the_trees_by_scope():
    # leaf regions of ~leaf_region_vars variables whatever the scope: depth round(log2(d / v))
    rng = np.random.default_rng(2)
    for d, want in ((64, 3), (32, 2), (24, 2), (9, 1), (3, 1)):
        x = rng.normal(size=(40, d))
        model = fit_einet(x, ["real"] * d, seed=0, num_sums=2, repetitions=2, epochs=0, leaf_region_vars=8)
        leaves = [model.graph.regions[r] for r in model.graph.leaf_regions()]
        assert max(len(r) for r in leaves) <= -(-d // 2 ** want)  # ceil(d / 2^depth)
        assert min(len(r) for r in leaves) >= d // 2 ** want
        same = fit_einet(x, ["real"] * d, seed=0, num_sums=2, repetitions=2, epochs=0, depth=want)
        assert same.num_parameters() == model.num_parameters()
    with pytest.raises(UserError, match="leaf_region_vars"):
        fit_einet(rng.normal(size=(10, 4)), ["real"] * 4, leaf_region_vars=0, epochs=0)


def test_an_explicit_leaf_overrides_the_mixed_default():
    # Real columns beside a binary target get mixed leaves by default (tests/einet/test_mixed_leaf.py);
    # an explicit leaf still fits one family to every column.
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=50), rng.normal(size=50), rng.integers(0, 2, 50)])
    assert fit_einet(x, ["real", "real", "discrete"], epochs=0).config.leaf == "mixed"
    model = fit_einet(x, ["real", "real", "discrete"], leaf="gaussian", epochs=1, num_sums=2, repetitions=1)
    assert model.config.leaf == "gaussian"
    assert np.isfinite(np.asarray(model.log_likelihood(x))).all()
