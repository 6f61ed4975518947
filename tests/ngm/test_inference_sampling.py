"""Inference by input optimisation and sampling in graph order."""
from __future__ import annotations

import numpy as np
from scipy import stats

from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.inference import InferenceSettings, infer, predict_feature
from mpifc.ngm.sampling import sample
from mpifc.ngm.schema import Schema, categorical
from mpifc.ngm.training import TrainConfig, fit_ngm



def test_inference_of_a_masked_real_beats_the_marginal_mean(chain_model, chain_train, chain_test):
    pred = predict_feature(chain_model, chain_test, "b")
    mse = np.mean((pred - chain_test[:, 1]) ** 2)
    baseline = np.mean((chain_train[:, 1].mean() - chain_test[:, 1]) ** 2)
    # The Bayes-optimal error given a and c is 0.36 / 1.64 = 0.22 of the unit variance.
    assert mse < 0.4 * baseline


def test_inference_of_several_unknowns_per_row(chain_model, chain_test):
    x = chain_test.copy()
    x[:, [0, 2]] = np.nan  # b and d known: predict a and c
    x[: len(x) // 2, 3] = np.nan  # and in half the rows d too
    res = infer(chain_model, x)
    assert not np.isnan(res.values).any()
    err_c = np.mean((res.values[:, 2] - chain_test[:, 2]) ** 2)
    err_a = np.mean((res.values[:, 0] - chain_test[:, 0]) ** 2)
    assert err_c < 0.6 and err_a < 0.6  # marginal variance is ~1
    assert np.allclose(res.probs["d"].sum(1), 1.0, atol=1e-5)


def test_inference_of_a_categorical_beats_the_majority_class(chain_model, chain_train, chain_test):
    p = predict_feature(chain_model, chain_test, "d")
    y = chain_test[:, 3].astype(int)
    nll = -np.mean(np.log(p[np.arange(len(y)), y]))
    freq = np.bincount(chain_train[:, 3].astype(int), minlength=3) / len(chain_train)
    nll_marginal = -np.mean(np.log(freq[y]))
    assert nll < 0.7 * nll_marginal
    assert np.mean(p.argmax(1) == y) > freq.max() + 0.1


def test_plain_paper_objective_still_works(chain_model, chain_test):
    plain = InferenceSettings(steps=50, lr=0.1, consistency=0.0)
    pred = predict_feature(chain_model, chain_test, "b", plain)
    assert np.mean((pred - chain_test[:, 1]) ** 2) < 0.5


def discrete_chain(n: int, seed: int) -> np.ndarray:
    """x0 ~ Cat(.2,.5,.3); x1 | x0 mostly copies x0; x2 | x1 is binary and noisy."""
    rng = np.random.default_rng(seed)
    x0 = rng.choice(3, size=n, p=[0.2, 0.5, 0.3])
    x1 = np.where(rng.random(n) < 0.8, x0, rng.choice(3, size=n))
    x2 = (rng.random(n) < np.array([0.1, 0.5, 0.9])[x1]).astype(int)
    return np.stack([x0, x1, x2], 1).astype(float)


P_X1 = 0.8 * np.array([0.2, 0.5, 0.3]) + 0.2 / 3
P_X2 = np.array([1 - P_X1 @ [0.1, 0.5, 0.9], P_X1 @ [0.1, 0.5, 0.9]])


def test_sampling_reproduces_known_marginals():
    schema = Schema((categorical("x0", 3), categorical("x1", 3), categorical("x2", 2)))
    graph = DependencyGraph.from_edges(schema.names, [("x0", "x1"), ("x1", "x2")])
    # Softmax heads need more Adam steps than regression heads under the same path penalty.
    config = TrainConfig(epochs=20, batch_size=64, seed=0, calib_rows=300)
    model = fit_ngm(discrete_chain(1500, 0), schema, graph, hidden=(16, 16), config=config)
    s = sample(model, 1500, np.random.default_rng(5))
    assert model.calibration.order[0] == 1  # x1 has the largest degree: the root
    for j, p in [(0, np.array([0.2, 0.5, 0.3])), (1, P_X1), (2, P_X2)]:
        obs = np.bincount(s[:, j].astype(int), minlength=len(p))
        assert stats.chisquare(obs, p * len(s)).pvalue > 0.001, (j, obs / len(s), p)
    # The dependencies survive too, not just the marginals: x1 copies x0 most of the time.
    assert np.mean(s[:, 0] == s[:, 1]) > 0.7


def test_sampling_reproduces_real_marginals_and_is_seeded(chain_model, chain_train):
    s = sample(chain_model, 1000, np.random.default_rng(0))
    assert not np.isnan(s).any()
    for j in range(3):  # each real of the chain is N(0, 1)
        assert stats.kstest(s[:, j], "norm").pvalue > 0.001, j
    assert abs(np.corrcoef(s[:, 0], s[:, 1])[0, 1] - 0.8) < 0.15
    again = sample(chain_model, 1000, np.random.default_rng(0))
    assert np.array_equal(s, again)
