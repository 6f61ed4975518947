"""In-process properties of the baseline building blocks (no MPI)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpifc.baselines.fedavg import FedAvgConfig, sampled_clients, shuffle_generator, weighted_average
from mpifc.baselines.mlp import get_flat, make_mlp, n_parameters, parse_hidden, set_flat, sgd_epochs
from mpifc.baselines.splitnn import SplitNetwork, SplitNNConfig
from mpifc.errors import UserError


def test_flat_parameters_round_trip_and_count():
    m = make_mlp(7, (5, 3), 2, seed=1)
    theta = get_flat(m)
    assert theta.shape == (n_parameters(m),) == (7 * 5 + 5 + 5 * 3 + 3 + 3 * 2 + 2,)
    other = make_mlp(7, (5, 3), 2, seed=2)
    assert not np.array_equal(get_flat(other), theta)
    set_flat(other, theta)
    assert np.array_equal(get_flat(other), theta)
    x = torch.randn(4, 7)
    assert torch.equal(other(x), m(x))


def test_same_seed_same_model_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = make_mlp(4, (8,), 3, seed=5)
    after = torch.rand(1)
    assert torch.equal(before, after), "make_mlp must not consume the caller's random numbers"
    assert np.array_equal(get_flat(a), get_flat(make_mlp(4, (8,), 3, seed=5)))


def test_sgd_epochs_reduce_loss_and_are_deterministic():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(60, 3)).astype(np.float32))
    y = (x[:, 0] > 0).long()
    runs = []
    for _ in range(2):
        m = make_mlp(3, (8,), 2, seed=0)
        first = sgd_epochs(m, x, y, 1, 10, 0.2, shuffle_generator(0, 0))
        last = sgd_epochs(m, x, y, 30, 10, 0.2, shuffle_generator(0, 0))
        runs.append(get_flat(m))
    assert last < first
    assert np.array_equal(runs[0], runs[1])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=5), st.integers(0, 2**31 - 1))
def test_weighted_average_is_the_count_weighted_mean(counts, seed):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=6).astype(np.float32) for _ in counts]
    avg = weighted_average(params, counts, np.dtype(np.float32))
    expect = sum(n * p.astype(np.float64) for n, p in zip(counts, params)) / sum(counts)
    assert avg.dtype == np.float32
    np.testing.assert_allclose(avg, expect, rtol=1e-6, atol=1e-7)
    # one client: the average is that client's parameters, bit for bit
    assert np.array_equal(weighted_average(params[:1], counts[:1], np.dtype(np.float32)), params[0])


@given(st.integers(1, 20), st.floats(0.01, 1.0), st.integers(0, 100), st.integers(0, 50))
def test_sampled_clients(n, fraction, seed, r):
    chosen = sampled_clients(n, fraction, seed, r)
    assert len(chosen) == max(1, min(n, int(round(fraction * n))))
    assert chosen == sorted(set(chosen)) and all(0 <= c < n for c in chosen)
    assert chosen == sampled_clients(n, fraction, seed, r)


def test_bad_settings_name_the_field():
    with pytest.raises(UserError, match="--rounds"):
        FedAvgConfig(dir="x", rounds=0).check()
    with pytest.raises(UserError, match="--fraction"):
        FedAvgConfig(dir="x", fraction=1.5).check()
    with pytest.raises(UserError, match="--cut"):
        SplitNNConfig(dir="x", cut=0).check()
    with pytest.raises(UserError, match="--hidden"):
        parse_hidden("64,x")


def test_split_network_forward_is_the_concatenated_network():
    net = SplitNetwork([3, 2], n_classes=2, cut=4, bottom_hidden=(5,), top_hidden=(6,), seed=0, dtype=torch.float32)
    x = torch.randn(7, 5)
    xs = [x[:, :3], x[:, 3:]]
    # the same function written as one network over the joined columns
    h = torch.cat([net.bottoms[0](xs[0]), net.bottoms[1](xs[1])], dim=1)
    assert torch.equal(net.forward(xs), net.top(h))
    # cut layers are ReLU outputs: clients never send raw linear features
    assert (h >= 0).all()


def test_configs_survive_the_command_line():
    """What a launcher builds with ``to_argv`` is what the job parses back."""
    import argparse

    from mpifc.cli.baseline import add_fedavg_arguments, add_splitnn_arguments, fedavg_config, splitnn_config

    def parser(add):
        p = argparse.ArgumentParser()
        add(p)
        return p

    fa = FedAvgConfig(dir="/d", rounds=7, local_epochs=3, fraction=0.3, batch_size=0, lr=0.05, hidden=(8, 4),
                      seed=9, dtype="float64", deadline=12.5, save_params="/p.npy", device="cpu")
    assert fedavg_config(parser(add_fedavg_arguments).parse_args(fa.to_argv())) == fa
    sp = SplitNNConfig(dir="/d", epochs=2, cut=5, batch_size=16, lr=0.3, bottom_hidden=(), top_hidden=(6, 3), seed=4, device="cuda:1")
    assert splitnn_config(parser(add_splitnn_arguments).parse_args(sp.to_argv())) == sp


def test_baseline_kinds_live_beside_the_fc_protocol():
    """Experiments import both protocols into one process: names and ids (= MPI tags) stay distinct,
    and SplitNN's traffic is declared as what it is."""
    import mpifc.baselines.protocol as bp
    import mpifc.fedpc.protocol  # noqa: F401  (raises on an id collision)
    from mpifc.runtime.kinds import all_kinds

    kinds = all_kinds()
    assert len({k.kind_id for k in kinds}) == len(kinds)
    assert (bp.SPLIT_ACT.payload, bp.SPLIT_GRAD.payload) == ("activation", "gradient")
    assert bp.FEDAVG_LOCAL.payload == "model_parameters"
