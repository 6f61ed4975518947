"""``fit_einet``: the EiNet learner used as a federated client PC."""
from __future__ import annotations

import itertools

import numpy as np

from mpifc.circuit.einet import EiNet, fit_einet


def test_fit_einet_on_binary_data_is_normalised_and_beats_uniform():
    rng = np.random.default_rng(0)
    z = rng.integers(0, 2, size=(400, 1))
    x = np.where(rng.random((400, 5)) < 0.85, z, 1 - z).astype(np.float64)  # strongly dependent bits
    model = fit_einet(x, ["discrete"] * 5, seed=1, num_sums=3, depth=2, repetitions=2, epochs=5,
                      batch_size=None)
    assert isinstance(model, EiNet)
    grid = np.array(list(itertools.product([0.0, 1.0], repeat=5)))
    total = np.exp(model.log_likelihood(grid).double().numpy()).sum()
    assert abs(total - 1.0) < 1e-9
    # uniform is 5 ln 0.5 = -3.47 nats; the true entropy is about 2.81 nats
    assert model.log_likelihood(x).mean().item() > 5 * np.log(0.5) + 0.2


def test_fit_einet_on_real_data_uses_gaussian_leaves_and_is_finite():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    model = fit_einet(x, ["real"] * 4, seed=0, num_sums=2, epochs=2)
    ll = model.log_likelihood(x).numpy()
    assert np.isfinite(ll).all()
    again = fit_einet(x, ["real"] * 4, seed=0, num_sums=2, epochs=2)
    assert np.array_equal(again.log_likelihood(x).numpy(), ll)
