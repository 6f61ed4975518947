"""The flat evaluator (:mod:`mpifc.federated.flat`) answers as the reference upward pass does.

Models of a mixed table (real columns with Gaussian and histogram leaves, a count, a category,
a yes/no target), prepared and trained as a user does (``python -m data_prep`` on a CSV with a
schema, :func:`mpifc.simulate` = ``mpifc train``): every setting, LearnSPN, decision-tree and
factorized clients, the class glue (class-conditioned circuits). Rows hold missing cells,
marginalised columns, far-out values (the log-space program's rows) and values outside a
column's domain; every answer is held to the reference to 1e-9 nats.
"""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from mpifc.api import proba_from_joint
from mpifc.federated import evaluate as E
from mpifc.federated.flat import FlatCircuit

CITIES = ("Paris", "Rome", "Oslo", "Lima")
SCHEMA = {"columns": [{"name": "age", "type": "real"}, {"name": "gain", "type": "real"},
                      {"name": "visits", "type": "discrete"}, {"name": "city", "type": "categorical"},
                      {"name": "outcome", "type": "categorical"}], "target": "outcome"}

# name -> (setting, clients, simulate() keywords)
MODELS = {
    "horizontal-class": ("horizontal", 3, {}),
    "horizontal-random": ("horizontal", 3, {"glue": "random", "clusters": 2}),
    "vertical": ("vertical", 2, {"refine": "none"}),
    "hybrid": ("hybrid", 2, {}),
    "dt": ("horizontal", 3, {"learner": "dt"}),
    "factorized": ("vertical", 2, {"learner": "factorized", "clusters": 2, "refine": "none"}),
}


def _table(n: int, seed: int) -> list[list[str]]:
    """A real column, a real column that is 0 in about half the rows (histogram leaves), a count,
    a city and an outcome that depends on them; about 5% of the feature cells empty."""
    rng = np.random.default_rng(seed)
    city = rng.integers(0, len(CITIES), n)
    age = rng.normal(40 + 6 * city, 9, n)
    gain = np.where(rng.random(n) < 0.5, 0.0, np.round(rng.exponential(300 + 200 * city, n)))
    visits = rng.poisson(1 + city, n)
    p = 1 / (1 + np.exp(-(0.1 * (age - 45) + 0.002 * gain + 0.4 * visits - 1.5)))
    out = rng.random(n) < p
    rows = []
    for i in range(n):
        row = [f"{age[i]:.2f}", f"{gain[i]:.0f}", str(visits[i]), CITIES[city[i]], "yes" if out[i] else "no"]
        rows.append([("" if j < 4 and rng.random() < 0.05 else v) for j, v in enumerate(row)])
    return rows


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``{name: FederatedModel}`` for every entry of :data:`MODELS`, and the query rows (model
    units) under ``"rows"``."""
    import mpifc
    from mpifc.cli.prep import main as prep

    d = tmp_path_factory.mktemp("flat")
    data = d / "people.csv"
    with data.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([c["name"] for c in SCHEMA["columns"]])
        w.writerows(_table(900, 0))
    (d / "people.schema.json").write_text(json.dumps(SCHEMA))
    out = {}
    for name, (setting, clients, kw) in MODELS.items():
        shards = d / f"shards-{setting}-{clients}"
        if not shards.exists():
            assert prep(["--dataset", "csv", "--path", str(data), "--setting", setting, "--clients", str(clients),
                         "--seed", "0", "--out", str(shards)]) == 0
        out[name] = mpifc.simulate(shards, seed=1, **kw)
    fm = out["horizontal-class"]
    cols = {c["name"]: [] for c in SCHEMA["columns"]}
    for r in _table(300, 1):
        for c, v in zip(cols, r):
            cols[c].append(v)
    out["rows"] = fm.encode(cols)
    return out


def _odd_rows(x: np.ndarray, features: list[str]) -> np.ndarray:
    """Rows the linear program cannot take: far-out reals (underflow, histogram tails), a count
    outside its domain, a code between two categories, every cell missing."""
    odd = x[:6].copy()
    odd[0, features.index("age")] = 1e4
    odd[1, features.index("gain")] = -40.0
    odd[2, features.index("visits")] = 1e3
    odd[3, features.index("city")] = 1.5
    odd[4, :] = np.nan
    odd[5, features.index("gain")] = 1e6
    return np.concatenate([x, odd])


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isneginf(got) & np.isneginf(want), 0.0, np.abs(got - want))
    assert np.all(gap <= 1e-9), np.max(gap)


@pytest.mark.parametrize("name", list(MODELS))
def test_likelihoods_and_marginals_equal_the_reference_pass(models, name):
    fm = models[name]
    x = _odd_rows(models["rows"], fm.features)
    flat = FlatCircuit(fm.fc)
    _close(flat.root_values(x)[:, 0], E.log_likelihood(fm.fc, x))
    for keep in (["age", "city"], ["gain"], ["visits", "outcome"]):
        masked = fm.keep_columns(x, keep)
        _close(flat.root_values(masked)[:, 0], E.log_likelihood(fm.fc, masked))
    assert np.array_equal(fm.log_likelihood(x), flat.root_values(x)[:, 0])


@pytest.mark.parametrize("name", list(MODELS))
def test_class_log_joints_equal_the_reference_pass(models, name):
    fm = models[name]
    x = _odd_rows(models["rows"], fm.features)
    targets = ["outcome"] + (["city", "visits"] if name != "dt" else [])  # FC[DT] predicts its target only
    for target in targets:
        blank = x.copy()
        blank[:, fm.features.index(target)] = np.nan
        want = E.class_log_joint(fm.fc, blank, target)
        _close(FlatCircuit(fm.fc, target).root_values(x), want)
        np.testing.assert_allclose(fm.predict_proba(x, target), proba_from_joint(want), rtol=0, atol=1e-9)


def test_the_linear_program_takes_ordinary_rows_and_leaves_odd_ones_to_log_space(models):
    """Ordinary rows never reach the log-space program; a row whose likelihood underflows or
    that holds a value outside a discrete column's domain does (and is exact, above)."""
    from mpifc.federated import flat

    fm = models["horizontal-random"]
    x = models["rows"]
    f = FlatCircuit(fm.fc)
    xt = np.ascontiguousarray(x.T)
    codes = {c.col: c.codes(xt[c.col]) for c in f.codings.values()}
    _, ok = flat._linear_pass(f._linear, xt, codes, np.empty((f._linear.n_nodes, len(x))))
    assert ok.all()
    odd = _odd_rows(x, fm.features)[len(x):]
    ot = np.ascontiguousarray(odd.T)
    codes = {c.col: c.codes(ot[c.col]) for c in f.codings.values()}
    _, ok = flat._linear_pass(f._linear, ot, codes, np.empty((f._linear.n_nodes, len(odd))))
    assert not ok[[0, 2, 3]].any() and ok[4]  # the all-missing row is ordinary: log 1


def test_the_models_hold_every_kind_of_leaf_and_client_model(models):
    """The equality tests above meet Gaussian, continuous histogram, categorical and Bernoulli
    leaves, and client models that are not circuits (decision trees, factorized PCs)."""
    from mpifc.federated import flat

    seen = set()
    for name in MODELS:
        nodes, _, client_models, _ = FlatCircuit(models[name].fc)._parts
        for n in nodes:
            if isinstance(n, flat._Leaf):
                kind = n.dist.type_name
                if kind == "histogram":
                    kind += "-discrete" if float(n.dist._p["discrete"]) else "-real"
                seen.add(kind)
        seen.update(type(m.model).__name__ for m in client_models)
    want = {"gaussian", "histogram-real", "categorical", "bernoulli", "TreeClassifier", "FactorizedModel"}
    assert want <= seen, sorted(want - seen)


def test_the_class_terms_equal_their_logsumexp_where_linear_space_underflows():
    # log p(c, x) = logsumexp_i (a_i(x) + t_i(c)), one matrix product in linear space; rows whose
    # terms lie thousands of nats apart, classes no term gives mass (-inf) and all-impossible rows
    # are computed again in log space, so every entry equals the brute-force logsumexp
    from scipy.special import logsumexp

    from mpifc.federated.flat import _Terms

    rng = np.random.default_rng(0)
    n_terms, n_classes, n_roots = 40, 30, 7
    logt = np.log(rng.dirichlet(np.full(n_classes, 0.3), n_terms))
    logt[rng.random(logt.shape) < 0.6] = -np.inf  # sparse classes, as point-mass target leaves give
    logt[:, 3] = -np.inf
    idx = rng.integers(0, n_roots + 1, (n_terms, 3))
    terms = _Terms(rng.normal(size=n_terms), idx, logt, n_roots)
    values = rng.normal(size=(50, n_roots)) * np.array([1, 1, 1, 1, 1, 400, 4000])
    values[7] = -np.inf
    got = terms.joint(values)
    a = np.concatenate([values, np.zeros((50, 1))], axis=1)[:, idx].sum(axis=2) + terms.const
    with np.errstate(divide="ignore"):
        want = logsumexp(a[:, :, None] + logt[None], axis=1)
    _close(got, want)
    assert np.isneginf(got[:, 3]).all() and np.isneginf(got[7]).all()
