"""RAT-SPN over real and discrete variables (``leaf="mixed"``): a Gaussian per real variable, a
categorical with its own levels per discrete one."""
from __future__ import annotations

import itertools

import h5py
import numpy as np
import pytest
import torch

from mpifc.circuit.em import batch_em, sum_statistics
from mpifc.circuit.graph import validate
from mpifc.circuit.ratspn import RatSPN
from mpifc.circuit.spn import SPN
from mpifc.errors import UserError

LEVELS = (0, 3, 0, 2, 4, 0, 3)  # 0 = real


def _model(levels=LEVELS, seed: int = 2, **kw) -> RatSPN:
    return RatSPN(len(levels), depth=2, repetitions=2, num_sums=2, num_leaves=2, num_roots=2, leaf="mixed",
                  leaf_kwargs={"var_levels": tuple(levels), "min_var": 1e-3}, seed=seed, **kw)


def _data(n: int, seed: int, nan: bool, levels=LEVELS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = [rng.normal(size=n) + j if k == 0 else rng.integers(0, k, n).astype(float) for j, k in enumerate(levels)]
    x = np.column_stack(cols)
    if nan:
        x[rng.random(x.shape) < 0.25] = np.nan
    return x


def test_discrete_variables_sum_to_one_over_their_own_levels():
    levels = (3, 2, 4, 2)
    m = _model(levels, seed=5)
    full = np.array(list(itertools.product(*[range(k) for k in levels])), dtype=float)
    assert float(np.exp(m.log_likelihood(full)).sum()) == pytest.approx(1.0, abs=1e-12)
    beyond = full[:1].copy()
    beyond[0, 1] = 2.0  # a level the variable does not have
    assert m.log_likelihood(beyond)[0] < -1e6


def test_a_real_variable_integrates_to_one_beside_discrete_ones():
    m = RatSPN(3, depth=1, repetitions=3, num_sums=3, num_leaves=3, leaf="mixed",
               leaf_kwargs={"var_levels": (0, 3, 2), "min_var": 1e-2}, seed=4)
    grid = np.linspace(-14.0, 14.0, 5601)
    total = 0.0
    for a, b in itertools.product(range(3), range(2)):
        x = np.column_stack([grid, np.full(grid.size, a), np.full(grid.size, b)])
        total += float(np.trapezoid(np.exp(m.log_likelihood(x)), grid))
    assert total == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("nan", [False, True], ids=["complete", "missing"])
def test_matches_the_explicit_graph_in_likelihood_mpe_and_em(nan: bool):
    m = _model()
    root = m.to_graph()
    validate(root)
    g = SPN(root)
    assert g.num_parameters() == m.num_parameters()
    x = _data(40, 3, nan)
    torch.testing.assert_close(m.log_likelihood(x), g.log_likelihood(x), rtol=0, atol=1e-11)
    a, b = m.mpe(x), g.mpe(x)
    torch.testing.assert_close(g.circuit.max_log_value(a), g.circuit.max_log_value(b), rtol=0, atol=1e-10)
    disc = [j for j, k in enumerate(LEVELS) if k]
    assert np.all(a[:, disc] == np.round(a[:, disc]))  # discrete variables are completed with levels
    m.apply_em(m.em_statistics(x))
    g.apply_em(g.em_statistics(x))
    torch.testing.assert_close(m.log_likelihood(x), g.log_likelihood(x), rtol=0, atol=1e-9)


def test_em_never_decreases_train_ll_and_statistics_add_over_shards():
    m = _model(seed=8)
    x = _data(300, 9, nan=True)
    whole = m.em_statistics(x)
    parts = sum_statistics([m.em_statistics(x[:110]), m.em_statistics(x[110:])])
    for k, v in whole.to_arrays().items():
        np.testing.assert_allclose(v, parts.to_arrays()[k], rtol=1e-10, atol=1e-10)
    hist = batch_em(m, x, n_iter=6)
    assert all(q >= p - 1e-9 for p, q in zip(hist, hist[1:])), hist
    samples = m.sample(500, 3)
    for j, k in enumerate(LEVELS):
        if k:
            assert set(np.unique(samples[:, j])) <= set(range(k))


def test_per_variable_floors_hold_through_em_and_travel_with_the_model(tmp_path):
    from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

    floors = np.array([0.05, 0.0, 0.3, 0.0, 0.0, 1e-6, 0.0])
    m = _model(var_min_var=floors)
    x = _data(300, 1, nan=False)
    x[:200, 0] = 0.5  # two thirds of the rows on one value: a component would collapse onto it
    for _ in range(8):
        m.apply_em(m.em_statistics(x))
    var, lo = m.P["g_var"].numpy(), m.P["g_min_var"].numpy()
    slot_var = np.repeat(np.concatenate([np.arange(7), [7]])[m.gidx.numpy().reshape(-1)], 2)
    for v in range(7):
        mine = slot_var == v
        assert np.all(lo[mine] == max(1e-3, floors[v])) and np.all(var[mine] >= lo[mine])
    assert var[slot_var == 0].min() == pytest.approx(0.05)  # the floor binds on the repeated value
    with h5py.File(tmp_path / "m.h5", "w") as f:
        m.save(f.create_group("m"))
    with h5py.File(tmp_path / "m.h5", "r") as f:
        back = RatSPN.load(f["m"])
    wired = model_from_bytes(model_to_bytes(m))
    for other in (back, wired):
        assert other.leaf_kwargs["var_levels"] == LEVELS
        np.testing.assert_array_equal(other.log_likelihood(x), m.log_likelihood(x))


@pytest.mark.parametrize("levels, msg", [((0, 3), "var_levels with one entry per variable"),
                                         ((0, 1, 2), "0 for real and >= 2 for discrete")])
def test_bad_levels_are_a_user_error(levels, msg):
    with pytest.raises(UserError, match=msg):
        RatSPN(3, depth=1, leaf="mixed", leaf_kwargs={"var_levels": levels})


def test_the_learner_picks_mixed_leaves_for_mixed_columns_and_honours_declared_levels():
    from mpifc.federated.learners import fit_leaf

    x = _data(200, 4, nan=False, levels=(0, 3, 2, 0))
    m = fit_leaf("ratspn", x, ["real", "discrete", "categorical", "real"], 0, n_categories=[0, 5, 2, 0],
                 em_iters=3)
    assert m.cfg["leaf"] == "mixed" and m.leaf_kwargs["var_levels"] == (0, 5, 2, 0)
    unseen = x[:3].copy()
    unseen[:, 1] = 4.0  # a declared level no training row holds: smoothed mass, not impossible
    assert np.all(np.isfinite(m.log_likelihood(unseen))) and np.all(m.log_likelihood(unseen) > -1e3)
    assert fit_leaf("ratspn", _data(50, 1, False, (0, 0)), ["real", "real"], 0, em_iters=1).cfg["leaf"] == "gaussian"
    assert fit_leaf("ratspn", _data(50, 1, False, (2, 2)), ["discrete"] * 2, 0, em_iters=1).cfg["leaf"] == "bernoulli"
