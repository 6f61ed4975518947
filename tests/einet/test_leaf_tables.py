"""The discretised Gaussian's level tables give the same numbers as evaluating every observation."""
import numpy as np
import pytest
import torch

from mpifc.circuit.einet import EiNet, EiNetConfig


def _pair(levels: int = 17, seed: int = 3) -> tuple[EiNet, EiNet]:
    """Two equal random-tree EiNets; the second never builds tables (per-observation route)."""
    cfg = EiNetConfig(num_sums=3, leaf="discretized_gaussian", num_levels=levels, dtype="float64", seed=seed,
                      eval_batch_size=7)
    tabled = EiNet.random_binary_trees(9, depth=2, repetitions=2, config=cfg)
    direct = EiNet.random_binary_trees(9, depth=2, repetitions=2, config=cfg)
    direct.leaf.TABLE_MAX_LEVELS = 0
    return tabled, direct


def _data(levels: int, n: int = 40) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.integers(0, levels, (n, 9)).astype(np.float64)
    x[rng.random(x.shape) < 0.2] = np.nan  # marginalised entries
    return x


def test_tables_match_per_observation_route_through_em():
    tabled, direct = _pair()
    x = _data(17)
    for step in (1.0, 0.3):
        assert np.allclose(tabled.log_likelihood(x), direct.log_likelihood(x), rtol=0, atol=1e-10)
        a, b = tabled.em_statistics(x), direct.em_statistics(x)
        assert set(a.tensors) == set(b.tensors)
        for k in a.tensors:
            assert torch.allclose(a.tensors[k], b.tensors[k], rtol=1e-10, atol=1e-10), k
        # the M-step changes the parameters: the cached tables must follow
        tabled.apply_em(a, step)
        direct.apply_em(b, step)
    assert np.allclose(tabled.log_likelihood(x), direct.log_likelihood(x), rtol=0, atol=1e-10)
    assert hasattr(tabled.leaf, "_table_cache") and not hasattr(direct.leaf, "_table_cache")


def test_tables_follow_in_place_parameter_updates():
    tabled, direct = _pair(levels=5)
    x = _data(5)
    tabled.log_likelihood(x)  # builds the tables
    for model in (tabled, direct):
        model.leaf.params["mean"].mul_(0.5)
        model.leaf.params["var"].clamp_(max=0.05)
    assert np.allclose(tabled.log_likelihood(x), direct.log_likelihood(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("levels", [2, 256])
def test_tabled_masses_sum_to_one(levels):
    tabled, _ = _pair(levels)
    table = tabled.leaf._tables()[0][:-1].reshape(tabled.leaf.num_slots, levels, -1)
    assert torch.allclose(torch.logsumexp(table, 1), torch.zeros(()).double(), atol=1e-12)
