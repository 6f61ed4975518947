"""EM: monotone likelihood, online == batch at step 1, additive statistics, presets."""
import numpy as np
import pytest
import torch

from mpifc.circuit.einet import EiNet, EiNetConfig, EiNetStats, EMSchedule, train_em
from mpifc.circuit.einet.training import PRESETS, build_from_preset, get_preset
from mpifc.errors import UserError
from tests.einet.conftest import tiny


def _digits_model(leaf: str, **kw) -> EiNet:
    cfg = EiNetConfig(num_sums=4, leaf=leaf, num_levels=17, dtype="float64", seed=3, **kw)
    return EiNet.poon_domingos((8, 8), [2], cfg)


@pytest.mark.parametrize("leaf,scale,kw", [
    ("gaussian", 16.0, {}),
    ("categorical", 1.0, {"pseudocount": 0.0}),
    ("discretized_gaussian", 1.0, {}),
])
def test_full_batch_em_never_decreases_train_likelihood(digits, leaf, scale, kw):
    x = digits[:150] / scale
    model = _digits_model(leaf, **kw)
    lls = [float(model.log_likelihood(x).mean())]
    for _ in range(4):
        model.apply_em(model.em_statistics(x))
        lls.append(float(model.log_likelihood(x).mean()))
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(lls, lls[1:])), lls
    assert lls[-1] > lls[0] + 1.0


def test_online_em_step_one_full_batch_equals_batch_em(digits):
    x = digits[:200] / 16.0
    a, b = _digits_model("gaussian"), _digits_model("gaussian")
    train_em(a, x, EMSchedule(num_epochs=1, batch_size=len(x), online_em_frequency=1, online_em_stepsize=1.0))
    b.apply_em(b.em_statistics(x))
    for ta, tb in zip([*a.leaf.params.values(), *a.einsum_weights, *a.mixing_weights],
                      [*b.leaf.params.values(), *b.einsum_weights, *b.mixing_weights]):
        assert torch.equal(ta, tb)


def test_online_em_with_small_steps_improves_likelihood(digits):
    x = digits[:200] / 16.0
    model = _digits_model("gaussian")
    before = float(model.log_likelihood(x).mean())
    hist = train_em(model, x, EMSchedule(num_epochs=2, batch_size=50, online_em_frequency=2,
                                         online_em_stepsize=0.5, seed=1))
    assert len(hist) == 2
    assert float(model.log_likelihood(x).mean()) > before + 1.0


@pytest.mark.parametrize("leaf,scale", [("gaussian", 16.0), ("categorical", 1.0), ("discretized_gaussian", 1.0)])
def test_statistics_are_additive_over_shards_and_weights(digits, leaf, scale):
    x = digits[:120] / scale
    x[5, 3] = np.nan  # a missing value must be handled identically in both shards
    model = _digits_model(leaf)
    whole = model.em_statistics(x).to_arrays()
    parts = (model.em_statistics(x[:50]) + model.em_statistics(x[50:])).to_arrays()
    w = np.ones(len(x))
    w[:50] = 2.0
    weighted = model.em_statistics(x, sample_weight=w).to_arrays()
    doubled = (model.em_statistics(x) + model.em_statistics(x[:50])).to_arrays()
    zero_w = np.where(np.arange(len(x)) < 50, 0.0, 1.0)
    dropped = model.em_statistics(x, sample_weight=zero_w).to_arrays()
    tail = model.em_statistics(x[50:]).to_arrays()
    assert set(whole) == set(parts)
    for k in whole:
        np.testing.assert_allclose(parts[k], whole[k], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(weighted[k], doubled[k], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(dropped[k], tail[k], rtol=1e-9, atol=1e-9)


def test_stats_survive_array_transport(digits):
    x = digits[:60] / 16.0
    a, b = _digits_model("gaussian"), _digits_model("gaussian")
    stats = a.em_statistics(x)
    a.apply_em(stats)
    b.apply_em(EiNetStats.from_arrays(stats.to_arrays()))
    np.testing.assert_array_equal(a.log_likelihood(x), b.log_likelihood(x))


def test_presets_match_table_5():
    assert set(PRESETS) >= {"mnist", "imagenet32", "celeba"}
    m = get_preset("mnist").schedule
    assert (m.num_epochs, m.batch_size, m.online_em_frequency, m.online_em_stepsize) == (5, 64, 5, 0.1)
    c = get_preset("celeba")
    assert (c.num_sums, c.pd_num_pieces, c.schedule.online_em_stepsize) == (40, (8,), 0.25)
    model, schedule = build_from_preset("mnist", (8, 8), num_levels=17)
    assert model.config.num_sums == 10 and model.config.min_var == 1e-3 and model.config.max_var == 0.25
    with pytest.raises(UserError, match="preset"):
        get_preset("svhn")


@pytest.mark.parametrize("schedule,field", [
    (EMSchedule(batch_size=0), "batch_size"),
    (EMSchedule(online_em_frequency=0), "online_em_frequency"),
    (EMSchedule(online_em_stepsize=1.5), "online_em_stepsize"),
])
def test_bad_schedule_names_the_field(schedule, field):
    with pytest.raises(UserError, match=field):
        train_em(tiny("gaussian"), np.zeros((4, 4)), schedule)
