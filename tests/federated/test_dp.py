"""``--dp-epsilon``: Laplace noise of scale Δ/ε on everything a client computes from its rows
(mpifc.federated.dp), and what the plan and the model say of it."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.errors import UserError
from mpifc.federated.dp import client_sensitivity, noisy_statistics, task_sensitivity
from mpifc.federated.one_pass import ClientDeclaration, OnePassBuilder, build_single_process


def test_the_noise_is_laplace_of_scale_sensitivity_over_epsilon():
    # 20,400 draws of noise from one call (4 discrete columns of 5,000 levels, 200 real columns)
    rng = np.random.default_rng(7)
    n, d_real, d_disc, levels = 300, 200, 4, 5000
    x = np.column_stack([rng.normal(size=(n, d_real)) * 3, rng.integers(0, levels, (n, d_disc))]).astype(float)
    meta = ["real"] * d_real + ["discrete"] * d_disc
    cards = [0] * d_real + [levels] * d_disc
    clip, eps = 4.0, 0.5
    delta = task_sensitivity(meta, clip)
    assert delta == 1 + d_real * (clip + clip ** 2) + d_disc
    b = delta / eps
    n_noisy, noisy, exact = noisy_statistics(x, meta, cards, clip, b, np.random.default_rng(11))
    assert np.all(exact.s1[:d_real] == np.clip(x[:, :d_real], -clip, clip).sum(0))  # clipped before summing
    z = np.concatenate([[n_noisy - n], (noisy.s1 - exact.s1)[:d_real], (noisy.s2 - exact.s2)[:d_real],
                        (noisy.counts - exact.counts)[d_real:].ravel()]) / b
    assert z.size == 1 + 2 * d_real + d_disc * levels
    # Under Laplace(0, b): |z| ~ Exp(1) and z^2 has mean 2. With m = 20,401 draws the sample mean
    # of |z| has sd 1/sqrt(m) = 0.7 %, of z^2 sd sqrt(20/m) = 3.1 %: the bounds below are > 7 and
    # > 6 sd out; the Kolmogorov distance to the Laplace CDF stays below 2.69 / sqrt(m) with
    # probability 1 - 1e-6. Together the test fails a correct mechanism with probability < 1e-6
    # (and, seeded, never changes its verdict).
    m = z.size
    assert abs(np.abs(z).mean() - 1) < 0.05 and abs(np.mean(z * z) / 2 - 1) < 0.2
    s = np.sort(z)
    cdf = np.where(s < 0, 0.5 * np.exp(s), 1 - 0.5 * np.exp(-s))
    ks = max(np.max(np.arange(1, m + 1) / m - cdf), np.max(cdf - np.arange(m) / m))
    assert ks < 2.69 / np.sqrt(m)
    # the same draws at half the scale: not Laplace(b)
    assert abs(np.abs(z / 2).mean() - 1) > 0.4


def _decls(n_rows: int):
    meta, cards = ("real", "real", "discrete"), (0, 0, 2)
    return [ClientDeclaration(c, ("a", "b", "y"), meta, cards, n_rows, "ids") for c in range(3)]


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return np.column_stack([rng.normal(size=n) + 2 * y, rng.normal(size=n), y]).astype(float)


def test_a_dp_plan_learns_one_noisy_pc_per_class_and_reports_noisy_counts():
    hp = {"dp_epsilon": 2.0, "dp_seed": 3, "dp_clip": 3.0}
    b = OnePassBuilder(n_clusters=None, glue="class", seed=0, learner="factorized", hyperparameters=hp)
    data = [(dcl, _rows(200, c)) for c, dcl in enumerate(_decls(200))]
    plan = b.plan([dcl for dcl, _ in data], ("a", "b", "y"), "y", "horizontal")
    assert all(t.by_class for t in plan.tasks)
    fc = build_single_process(b, data, ("a", "b", "y"), "y", "horizontal")
    leaves = [n.leaf for n in fc.leaves]
    assert len(leaves) == 3 * 2 and {leaf.cluster for leaf in leaves} == {0, 1}
    true = {(c, k): int(np.sum(x[:, 2] == k)) for c, (_, x) in enumerate(data) for k in (0, 1)}
    assert [leaf.n_rows for leaf in leaves] != [true[(leaf.client, leaf.cluster)] for leaf in leaves]
    again = build_single_process(b, data, ("a", "b", "y"), "y", "horizontal")
    assert [n.leaf.n_rows for n in again.leaves] == [leaf.n_rows for leaf in leaves]  # dp_seed
    assert client_sensitivity([["real", "real", "discrete"]], 3.0) == 1 + 2 * (3 + 9) + 1
    # k-means clusters depend on other rows: under DP a single-owner subspace is one PC
    v = OnePassBuilder(n_clusters=4, glue="random", seed=0, learner="factorized", hyperparameters=hp)
    vdecls = [ClientDeclaration(c, (f,), ("real",), (0,), 50, "i") for c, f in enumerate("ab")]
    assert all(t.n_clusters == 1 for t in v.plan(vdecls, ("a", "b"), None, "vertical").tasks)


def test_dp_refuses_learners_and_glue_it_does_not_cover():
    hp = {"dp_epsilon": 1.0}
    with pytest.raises(UserError, match="only the factorized learner"):
        OnePassBuilder(glue="class", learner="learnspn", hyperparameters=hp).plan(_decls(50), ("a", "b", "y"), "y",
                                                                               "horizontal")
    vdecls = [ClientDeclaration(c, (f,), ("real",), (0,), 50, "i") for c, f in enumerate("ab")]
    with pytest.raises(UserError, match="cooccurrence"):
        OnePassBuilder(glue="cooccurrence", learner="factorized", hyperparameters=hp).plan(vdecls, ("a", "b"), None,
                                                                                        "vertical")


def test_the_model_records_the_accounting():
    from mpifc.fedpc.train import privacy_record

    hp = {"dp_epsilon": 2.0, "dp_clip": 3.0}
    b = OnePassBuilder(glue="class", seed=0, learner="factorized", hyperparameters=hp)
    plan = b.plan(_decls(80), ("a", "b", "y"), "y", "horizontal")
    rec = privacy_record({"hyperparameters": hp}, plan)["dp"]
    assert rec["epsilon"] == 2.0 and rec["mechanism"] == "laplace" and rec["clip"] == 3.0
    assert rec["per_client"]["0"] == {"sensitivity_l1": 26.0, "scale": 13.0}
    assert "entropy" in rec["noise"]


@pytest.mark.parametrize("argv,msg", [(["--dp-epsilon", "-1"], "--dp-epsilon must be a finite number > 0"),
                                      (["--dp-epsilon", "nan"], "--dp-epsilon must be a finite number > 0"),
                                      (["--dp-epsilon", "1", "--dp-clip", "0"], "--dp-clip must be"),
                                      (["--dp-seed", "3"], "need --dp-epsilon")])
def test_the_dp_flags_refuse_bad_values_naming_the_flag(argv, msg):
    import argparse

    from mpifc.cli.train import add_fedpc_train_arguments, train_config

    p = argparse.ArgumentParser()
    add_fedpc_train_arguments(p)
    with pytest.raises(UserError, match=msg):
        train_config(p.parse_args(["d", "--model", "m.h5", *argv]))
    cfg = train_config(p.parse_args(["d", "--model", "m.h5", "--dp-epsilon", "2"]))
    assert cfg["learner"] == "factorized" and cfg["hyperparameters"]["dp_epsilon"] == 2.0
