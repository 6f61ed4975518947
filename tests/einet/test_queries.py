"""Sampling (chi-square against enumeration), conditional sampling, MPE, HDF5, dtypes, guards."""
import numpy as np
import pytest
import torch
from scipy import stats as sps

from mpifc.circuit.einet import EiNet, EiNetConfig
from mpifc.circuit.io import load_model_file, save_model_file
from mpifc.errors import UserError
from tests.einet.conftest import all_images, tiny


def _counts(samples: np.ndarray, levels: int) -> np.ndarray:
    codes = (samples @ (levels ** np.arange(samples.shape[1])[::-1])).astype(int)
    return np.bincount(codes, minlength=levels ** samples.shape[1])


def test_sample_frequencies_match_enumerated_probabilities():
    model = tiny("bernoulli", 2, k=3, seed=7)
    probs = np.exp(model.log_likelihood(all_images(2, 4)))
    samples = model.sample(20000, np.random.default_rng(0))
    assert set(np.unique(samples)) <= {0.0, 1.0}
    _, p = sps.chisquare(_counts(samples, 2), probs * len(samples))
    assert p > 1e-3


def test_conditional_sample_frequencies_match_enumeration():
    model = tiny("categorical", 3, k=3, seed=5)
    images = all_images(3, 4)
    ll = model.log_likelihood(images)
    evidence = np.array([2.0, np.nan, 0.0, np.nan])
    keep = (images[:, 0] == 2) & (images[:, 2] == 0)
    cond = np.exp(ll[keep] - np.logaddexp.reduce(ll[keep]))
    samples = model.sample(20000, np.random.default_rng(1), evidence=np.tile(evidence, (20000, 1)))
    assert (samples[:, 0] == 2).all() and (samples[:, 2] == 0).all()
    free = samples[:, [1, 3]]
    _, p = sps.chisquare(_counts(free, 3), cond * len(samples))
    assert p > 1e-3


def test_continuous_samples_match_model_moments():
    model = tiny("gaussian", k=2, shape=(1, 2), pieces=(2,))
    s = model.sample(20000, np.random.default_rng(2))
    # E[x0] by numerical integration of the marginal p(x0) (x1 marginalised with NaN).
    grid = np.linspace(-3, 4, 2001)
    dens = np.exp(model.log_likelihood(np.stack([grid, np.full_like(grid, np.nan)], 1)))
    mean = np.trapezoid(grid * dens, grid)
    sd = np.sqrt(np.trapezoid((grid - mean) ** 2 * dens, grid))
    assert abs(s[:, 0].mean() - mean) < 4 * sd / np.sqrt(len(s))


def test_mpe_of_a_single_component_model_is_the_enumerated_argmax():
    # With K = 1 every sum node has one child, so backtracking MPE is exact.
    model = tiny("categorical", 3, k=1, seed=2)
    images = all_images(3, 4)
    best = images[int(np.argmax(model.log_likelihood(images)))]
    np.testing.assert_array_equal(model.mpe(np.full((1, 4), np.nan))[0], best)
    evidence = np.array([[1.0, np.nan, np.nan, 0.0]])
    keep = (images[:, 0] == 1) & (images[:, 3] == 0)
    cbest = images[keep][int(np.argmax(model.log_likelihood(images[keep])))]
    np.testing.assert_array_equal(model.mpe(evidence)[0], cbest)


def test_mpe_keeps_evidence_and_completes_everything():
    model = tiny("discretized_gaussian", 5, k=3)
    x = np.array([[np.nan, 3.0, np.nan, np.nan], [1.0, 2.0, 3.0, 4.0]])
    out = model.mpe(x)
    assert not np.isnan(out).any()
    assert out[0, 1] == 3.0
    np.testing.assert_array_equal(out[1], x[1])


def test_hdf5_round_trip_is_identical(tmp_path, digits):
    cfg = EiNetConfig(num_sums=3, leaf="discretized_gaussian", num_levels=17, seed=11)
    model = EiNet.poon_domingos((8, 8), [4, 2], cfg)
    model.apply_em(model.em_statistics(digits[:100]))
    save_model_file(model, tmp_path / "einet.h5")
    loaded = load_model_file(tmp_path / "einet.h5")
    assert isinstance(loaded, EiNet) and loaded.num_parameters() == model.num_parameters()
    x = digits[100:150].copy()
    x[::3, 5:20] = np.nan
    assert np.array_equal(model.log_likelihood(x), loaded.log_likelihood(x))
    np.testing.assert_array_equal(model.mpe(x), loaded.mpe(x))
    np.testing.assert_array_equal(model.sample(5, np.random.default_rng(3)),
                                  loaded.sample(5, np.random.default_rng(3)))


def test_float32_agrees_with_float64(digits):
    """Tolerance: |ll32 - ll64| <= 1e-4 * (1 + |ll64|) per image, before and after 2 EM steps."""
    x = digits[:100] / 16.0
    models = {d: EiNet.poon_domingos((8, 8), [4], EiNetConfig(num_sums=4, dtype=d, seed=5))
              for d in ("float32", "float64")}
    for _ in range(3):
        l32, l64 = (models[d].log_likelihood(x) for d in ("float32", "float64"))
        assert np.all(np.abs(l32 - l64) <= 1e-4 * (1 + np.abs(l64)))
        for m in models.values():
            m.apply_em(m.em_statistics(x))


def test_same_seed_same_model_different_seed_different_model(digits):
    x = digits[:20] / 16.0
    a, b, c = (EiNet.poon_domingos((8, 8), [2], EiNetConfig(num_sums=3, seed=s)) for s in (1, 1, 2))
    assert np.array_equal(a.log_likelihood(x), b.log_likelihood(x))
    assert not np.array_equal(a.log_likelihood(x), c.log_likelihood(x))


def test_max_params_guard_fails_before_allocating():
    with pytest.raises(UserError, match="max_params"):
        EiNet.poon_domingos((28, 28), [7], EiNetConfig(num_sums=10, max_params=1_000_000))


@pytest.mark.parametrize("x,leaf,field", [
    (np.zeros((2, 3)), "gaussian", "x"),
    (np.full((2, 4), 0.5), "categorical", "x"),
    (np.full((2, 4), 7.0), "categorical", "x"),
    (np.array([[np.inf, 0, 0, 0]]), "gaussian", "x"),
])
def test_bad_input_names_the_field(x, leaf, field):
    with pytest.raises(UserError, match=field):
        tiny(leaf, 3).log_likelihood(x)


def test_bad_config_names_the_field():
    with pytest.raises(UserError, match="leaf"):
        tiny("poisson")
    with pytest.raises(UserError, match="min_var"):
        tiny("gaussian", min_var=0.5, max_var=0.1)


def test_discretised_copy_of_a_gaussian_model_is_normalised_over_levels():
    model = tiny("gaussian", k=2)
    data = np.random.default_rng(4).integers(0, 4, (40, 4)) / 3.0
    model.apply_em(model.em_statistics(data))
    disc = model.with_leaf("discretized_gaussian", num_levels=4)
    assert float(np.logaddexp.reduce(disc.log_likelihood(all_images(4, 4)))) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(UserError, match="leaf"):
        tiny("categorical").with_leaf("gaussian")


def test_fulfils_the_density_model_contract():
    from mpifc.circuit.base import DensityModel, EMStatistics

    model = tiny("gaussian")
    assert isinstance(model, DensityModel)
    stats = model.em_statistics(np.zeros((3, 4)))
    assert isinstance(stats, EMStatistics)
    assert all(v.dtype == np.float64 for v in stats.to_arrays().values())
    assert model.log_likelihood(np.zeros((3, 4))).dtype == np.float64
