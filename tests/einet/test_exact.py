"""Normalisation and marginalisation, checked by enumeration and numerical integration."""
import numpy as np
import pytest
import torch

from mpifc.circuit.einet import EiNet, EiNetConfig
from tests.einet.conftest import all_images, tiny


@pytest.mark.parametrize("leaf,levels", [("categorical", 3), ("bernoulli", 2), ("discretized_gaussian", 4)])
def test_discrete_einet_sums_to_one_over_every_image(leaf, levels):
    model = tiny(leaf, levels)
    images = all_images(levels, 4)
    assert float(np.logaddexp.reduce(model.log_likelihood(images))) == pytest.approx(0.0, abs=1e-12)
    # Still normalised after an EM step moved every parameter.
    rng = np.random.default_rng(0)
    model.apply_em(model.em_statistics(images[rng.integers(0, len(images), 20)]))
    assert float(np.logaddexp.reduce(model.log_likelihood(images))) == pytest.approx(0.0, abs=1e-12)


def test_random_tree_einet_sums_to_one():
    cfg = EiNetConfig(num_sums=3, leaf="categorical", num_levels=2, dtype="float64", seed=4)
    model = EiNet.random_binary_trees(5, depth=2, repetitions=3, config=cfg)
    ll = model.log_likelihood(all_images(2, 5))
    assert float(np.logaddexp.reduce(ll)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("shape", [(1, 2), (2, 1)])
def test_gaussian_einet_integrates_to_one(shape):
    model = tiny("gaussian", k=3, shape=shape, pieces=(2,), min_var=0.01, max_var=0.25,
                 eval_batch_size=1 << 20)
    # Move off the initial equal variances so the test covers distinct components.
    data = np.random.default_rng(1).random((30, 2))
    model.apply_em(model.em_statistics(data))
    grid = np.linspace(-2.5, 3.5, 401)
    xx, yy = np.meshgrid(grid, grid, indexing="ij")
    pts = np.stack([xx.ravel(), yy.ravel()], 1)
    dens = np.exp(model.log_likelihood(pts)).reshape(xx.shape)
    # Trapezoid rule: spectrally accurate for smooth densities that vanish at the borders.
    total = np.trapezoid(np.trapezoid(dens, grid, axis=1), grid)
    assert total == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("leaf,levels", [("categorical", 3), ("gaussian", 3), ("discretized_gaussian", 5)])
def test_marginalising_every_pixel_gives_zero(leaf, levels):
    model = tiny(leaf, levels)
    ll = model.log_likelihood(np.full((3, 4), np.nan))
    assert np.allclose(ll, np.zeros(3), rtol=0, atol=1e-12)


def test_nan_marginal_equals_sum_over_missing_pixels():
    model = tiny("categorical", 3)
    images = all_images(3, 4)
    ll = model.log_likelihood(images)
    # p(x0 = 2, x3 = 1) by enumeration vs. one pass with x1, x2 = NaN.
    keep = (images[:, 0] == 2) & (images[:, 3] == 1)
    expected = np.logaddexp.reduce(ll[keep])
    got = float(model.log_likelihood(np.array([[2.0, np.nan, np.nan, 1.0]]))[0])
    assert got == pytest.approx(expected, abs=1e-12)


def test_discretized_masses_sum_to_one_for_extreme_parameters():
    model = tiny("discretized_gaussian", 256, shape=(1, 2), pieces=(2,))
    leaf = model.leaf
    # Means far outside [0, 1] and the smallest variance: the tails must not produce NaN.
    leaf.params["mean"] = torch.tensor([[-3.0, 4.0], [0.5, 0.001]], dtype=torch.float64)
    leaf.params["var"] = torch.tensor([[1e-3, 1e-3], [1e-3, 0.25]], dtype=torch.float64)
    levels = torch.arange(256, dtype=torch.float64)
    x = torch.stack([levels, torch.full_like(levels, float("nan"))], 0).reshape(1, 2, 256)  # (L, m, batch)
    lp = leaf.log_prob(x)[0, 0]  # slot 0: (K, batch)
    assert torch.isfinite(lp).all()
    assert torch.allclose(torch.logsumexp(lp, 1), torch.zeros(2, dtype=torch.float64), atol=1e-12)
