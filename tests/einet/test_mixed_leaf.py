"""``leaf="mixed"``: a Gaussian per real variable and a categorical (its own levels) per discrete
one, so an EiNet fits tabular data that mixes the two (``fit_einet``'s default on such data)."""
from __future__ import annotations

import io
import itertools
import warnings

import h5py
import numpy as np
import pytest
import torch

from mpifc.circuit.einet import EiNet, EiNetConfig, fit_einet
from mpifc.errors import UserError

# var 0, 2: real; var 1: binary; var 3: three levels.
LEVELS = (0, 2, 0, 3)


def mixed(seed: int = 0, **kw) -> EiNet:
    cfg = EiNetConfig(num_sums=3, leaf="mixed", var_levels=LEVELS, dtype="float64", seed=seed,
                      min_var=0.05, max_var=1.0, eval_batch_size=1 << 20, **kw)
    return EiNet.random_binary_trees(4, depth=1, repetitions=2, config=cfg)


def mixed_data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 2, n)
    c = np.where(rng.random(n) < 0.7, b + rng.integers(0, 2, n), rng.integers(0, 3, n))
    return np.column_stack([b + 0.3 * rng.normal(size=n), b, c - 1 + 0.3 * rng.normal(size=n), c]).astype(float)


def total_mass(model: EiNet) -> float:
    """Integral over the two real variables (trapezoid on a grid) of the sum over the 2 x 3
    discrete values: 1 for a normalised model; mass on a binary variable's third level would be
    missing from it."""
    grid = np.linspace(-7.0, 8.0, 301)
    xx, yy = np.meshgrid(grid, grid, indexing="ij")
    total = 0.0
    for b, c in itertools.product(range(2), range(3)):
        pts = np.column_stack([xx.ravel(), np.full(xx.size, b), yy.ravel(), np.full(xx.size, c)])
        dens = np.exp(model.log_likelihood(pts)).reshape(xx.shape)
        total += np.trapezoid(np.trapezoid(dens, grid, axis=1), grid)
    return float(total)


def test_mixed_einet_is_normalised_before_and_after_em():
    model = mixed()
    assert total_mass(model) == pytest.approx(1.0, abs=1e-6)
    x = mixed_data(200, 1)
    for _ in range(3):
        model.apply_em(model.em_statistics(x))
    assert total_mass(model) == pytest.approx(1.0, abs=1e-6)
    # The binary variable's slots give its impossible third level exactly zero probability.
    cat = model.leaf.cat
    binary_slots = (model.slot_var.reshape(-1) == 1) & model.slot_mask.reshape(-1)
    assert binary_slots.any()
    assert torch.all(cat.params["probs"][binary_slots][..., 2] == 0)
    assert torch.allclose(cat.params["probs"][binary_slots].sum(-1), torch.ones(1, dtype=torch.float64))


def test_mixed_marginals_equal_sums_over_levels():
    model = mixed(seed=2)
    model.apply_em(model.em_statistics(mixed_data(100, 3)))
    x = mixed_data(5, 4)
    q = x.copy()
    q[:, 3] = np.nan  # the 3-level variable
    ll = model.log_likelihood(q)
    by_level = [model.log_likelihood(np.where(np.isnan(q), v, q)) for v in (0.0, 1.0, 2.0)]
    assert np.allclose(ll, np.logaddexp.reduce(np.stack(by_level), axis=0), rtol=0, atol=1e-12)
    assert np.allclose(model.log_likelihood(np.full((2, 4), np.nan)), np.zeros(2), rtol=0)


def test_mixed_statistics_add_over_shards_and_queries_respect_the_kinds():
    model = mixed(seed=3)
    x = mixed_data(120, 5)
    whole = model.em_statistics(x)
    parts = model.em_statistics(x[:50]) + model.em_statistics(x[50:])
    for k, v in whole.tensors.items():
        assert torch.allclose(v, parts.tensors[k], atol=1e-9), k
    model.apply_em(whole)
    s = model.sample(500, np.random.default_rng(0))
    assert set(np.unique(s[:, 1])) <= {0.0, 1.0} and set(np.unique(s[:, 3])) <= {0.0, 1.0, 2.0}
    assert len(np.unique(s[:, 0])) > 100  # real draws
    e = x[:10].copy()
    e[:, [1, 3]] = np.nan
    done = model.mpe(e)
    assert np.array_equal(done[:, [0, 2]], x[:10, [0, 2]])
    assert set(np.unique(done[:, 1])) <= {0.0, 1.0} and set(np.unique(done[:, 3])) <= {0.0, 1.0, 2.0}


def test_mixed_save_load_is_bit_identical():
    model = mixed(seed=4)
    x = mixed_data(80, 6)
    model.apply_em(model.em_statistics(x))
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        model.save(f.create_group("m"))
    with h5py.File(buf, "r") as f:
        again = EiNet.load(f["m"])
    assert again.config.var_levels == LEVELS
    assert np.array_equal(model.log_likelihood(x), again.log_likelihood(x))
    assert again.num_parameters() == model.num_parameters()


def test_mixed_bad_values_and_configs_name_the_column():
    model = mixed()
    bad = mixed_data(3, 0)
    bad[2, 1] = 2.0  # binary variable
    with pytest.raises(UserError, match=r"column 1 is discrete with 2 levels.*0\.\.1, got 2\.0 \(row 2\)"):
        model.log_likelihood(bad)
    with pytest.raises(UserError, match="var_levels"):
        EiNetConfig(leaf="mixed").validate()
    with pytest.raises(UserError, match="var_levels: has 3 entries"):
        EiNet.random_binary_trees(4, 1, 1, EiNetConfig(leaf="mixed", var_levels=(0, 2, 0)))


def test_fit_einet_picks_mixed_leaves_for_mixed_meta_types():
    # Real columns beside a binary target (breast cancer's layout) used to be refused.
    x = mixed_data(300, 7)
    meta = ["real", "discrete", "real", "categorical"]
    model = fit_einet(x, meta, seed=0, num_sums=3, depth=1, repetitions=2, epochs=3)
    assert model.config.leaf == "mixed" and model.config.var_levels == (0, 2, 0, 3)
    # Declared categories win over the largest value seen (a level absent from this shard).
    wide = fit_einet(x, meta, seed=0, num_sums=3, depth=1, repetitions=2, epochs=0, n_categories=[0, 2, 0, 5])
    assert wide.config.var_levels == (0, 2, 0, 5)
    test = mixed_data(200, 8)
    ll = model.log_likelihood(test)
    assert np.isfinite(ll).all()
    # It learns the dependence: better than independent columns (a Gaussian per real column and
    # the level frequencies per discrete one, fitted on the same rows): -3.81 nats here.
    indep = 0.0
    for j in (0, 2):
        mu, sd = x[:, j].mean(), x[:, j].std()
        indep += np.mean(-0.5 * ((test[:, j] - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi))
    for j, levels in ((1, 2), (3, 3)):
        freq = np.bincount(x[:, j].astype(int), minlength=levels) / len(x)
        indep += np.mean(np.log(freq[test[:, j].astype(int)]))
    assert ll.mean() > indep + 0.3
    again = fit_einet(x, meta, seed=0, num_sums=3, depth=1, repetitions=2, epochs=3)
    assert np.array_equal(again.log_likelihood(test), ll)
    with pytest.raises(UserError, match="discrete column 1 needs non-negative integer"):
        fit_einet(np.where(np.arange(4) == 1, 0.5, x), meta, epochs=0)
    with pytest.raises(UserError, match="discrete column 3 has value 2 but 2 declared"):
        fit_einet(x, meta, epochs=0, n_categories=[0, 2, 0, 2])


def test_fit_einet_tabular_max_var_follows_the_data():
    rng = np.random.default_rng(0)
    x = rng.normal(scale=[1.0, 3.0], size=(400, 2))
    model = fit_einet(x, ["real", "real"], epochs=0)
    assert model.config.max_var == pytest.approx(np.var(x[:, 1]))
    assert fit_einet(x / 10, ["real", "real"], epochs=0).config.max_var == 0.25
    assert fit_einet(x, ["real", "real"], epochs=0, max_var=0.5).config.max_var == 0.5
    holes = x.copy()
    holes[:, 0] = np.nan  # a column with no observed value has no variance: skipped, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_einet(holes, ["real", "real"], epochs=0).config.max_var == pytest.approx(np.var(x[:, 1]))
    img = rng.random((50, 4))
    assert fit_einet(img, ["real"] * 4, epochs=0, image_shape=(2, 2), pd_num_pieces=(2,)).config.max_var == 0.25


def test_fit_einet_discrete_levels_honour_the_declared_categories():
    # A client whose shard never shows the top level of a declared 4-level variable still scores
    # it (a test row may hold it): levels come from the declaration, not only from the shard.
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, size=(60, 3)).astype(float)
    model = fit_einet(x, ["categorical"] * 3, epochs=1, num_sums=2, repetitions=1, n_categories=[4, 4, 4])
    assert (model.config.leaf, model.config.num_levels) == ("categorical", 4)
    assert np.isfinite(model.log_likelihood(np.array([[3.0, 0.0, 1.0]]))).all()
    assert fit_einet(x, ["categorical"] * 3, epochs=0).config.num_levels == 3
    with pytest.raises(UserError, match="discrete column 2 needs non-negative integer"):
        fit_einet(np.column_stack([x[:, :2], -x[:, 2]]) - np.array([0, 0, 1.0]), ["categorical"] * 3, epochs=0)
