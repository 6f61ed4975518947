"""Level codes for few-valued columns and the normal-score scale: fitted on training rows only,
invertible, chosen on validation rows, written to and read back from the manifest."""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_prep.preprocess import Preprocessor
from data_prep.transforms import MIN_ROWS, NormalScore, few_levels, from_levels, safe_median, select_scale, \
    select_scales, to_levels

from .conftest import make_table

TRAIN = np.arange(0, 180)
TEST = np.arange(180, 240)
NEW = dict(scale="auto", max_levels=32, seed=0)  # the tabular defaults of prepare()


def heavy(n: int, seed: int) -> np.ndarray:
    """Log-normal with a few repeated values (ties) and a Pareto tail."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.lognormal(0.0, 1.0, n), 3)
    x[rng.random(n) < 0.1] = 0.0
    x[rng.random(n) < 0.02] *= 1e4
    return x


def test_normal_score_is_increasing_and_inverts_to_1e9_inside_between_and_beyond_the_knots():
    ns = NormalScore.fit(heavy(3000, 0))
    assert np.all(np.diff(ns.x) > 0) and np.all(np.diff(ns.z) > 0) and ns.x.size <= 256 + 64
    probe = np.concatenate([ns.x, 0.5 * (ns.x[1:] + ns.x[:-1]), [-1e6, -3.0, ns.x[-1] + 1e-3, 1e5, 1e9]])
    z = ns.forward(probe)
    back = ns.inverse(z)
    np.testing.assert_allclose(back, probe, rtol=1e-12, atol=1e-9)
    order = np.argsort(probe)
    assert np.all(np.diff(z[order]) > 0)
    assert np.isnan(ns.forward(np.array([np.nan]))[0]) and np.isnan(ns.inverse(np.array([np.nan]))[0])


def test_a_far_out_value_stays_a_few_units_out():
    x = np.random.default_rng(1).standard_normal(2000)
    ns = NormalScore.fit(x)
    far = x.std() * 1e4  # ten thousand standard deviations out
    assert ns.z[-1] < ns.forward(np.array([far]))[0] < ns.z[-1] + 15
    assert ns.z[0] - 15 < ns.forward(np.array([-far]))[0] < ns.z[0]


def test_a_repeated_value_maps_to_the_middle_of_its_block():
    from scipy.special import ndtri

    x = np.array([0.0] * 60 + list(np.arange(1.0, 41.0)))  # 0 holds rows 0..59 of 100: mid-rank 30 / 100
    ns = NormalScore.fit(x)
    assert ns.forward(np.array([0.0]))[0] == pytest.approx(ndtri(0.3), abs=1e-12)
    # knots are means of 5 consecutive values: 20 lies between two, near its quantile; the
    # largest value, one row's, is no knot (it lands in the upper tail)
    assert ns.forward(np.array([20.0]))[0] == pytest.approx(ndtri(0.795), abs=0.01)
    assert ns.x[-1] < 40.0 < ns.inverse(np.array([3.0]))[0]


def test_no_knot_level_or_imputed_value_is_a_value_fewer_than_k_rows_hold():
    # integer-valued: the mean of five consecutive values is often one of them, or another's
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.integers(1, 400, 300), np.full(40, 0.5), np.full(7, 500.0)]).astype(float)
    lattice = np.arange(-100.0, 600.0, 0.5)
    for n_knots in (256, 32):
        ns = NormalScore.fit(x, n_knots=n_knots)
        assert ns.x.size <= min(n_knots, x.size // MIN_ROWS) and np.all(np.diff(ns.x) > 0) and np.all(np.diff(ns.z) > 0)
        assert not np.isin(ns.x, lattice).any()  # no value, nor any point of the values' grid
        assert not np.isin(ns.forward(x), ns.z).any()  # no row maps onto a knot
    # the knots are no chain of pairs of values: each is the mean of five values no other knot uses
    assert NormalScore.fit(np.arange(9.0)) is None and NormalScore.fit(np.arange(10.0)).x.size == 2
    # levels: only values k rows hold; a rarer one is read as its nearest level
    col = np.array([0.0] * 30 + [1.0] * 9 + [2.0] * 4 + [7.0])
    levels = few_levels(col, 32)
    assert levels.tolist() == [0.0, 1.0]
    assert to_levels(np.array([2.0, 7.0]), levels).tolist() == [1.0, 1.0]
    assert few_levels(np.array([1.0, 2.0, 3.0]), 32) is None  # no value held k times: no levels
    # the median of a column, unless fewer than k rows hold it: then a point in the gap above
    assert safe_median(np.array([1.0] * 5 + [2.0] * 6)) == 2.0
    m = safe_median(np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan]))
    assert 3.0 < m < 4.0 and m not in (3.5,)


def test_log_derivative_is_the_slope_between_knots_and_in_the_tails():
    ns = NormalScore.fit(heavy(500, 2))
    inside = 0.5 * (ns.x[3:8] + ns.x[4:9])
    tails = np.array([ns.x[0] - 5.0, ns.x[-1] + 7.0])
    for v in np.concatenate([inside, tails]):
        h = 1e-7 * max(1.0, abs(v))
        fd = (ns.forward(np.array([v + h])) - ns.forward(np.array([v - h])))[0] / (2 * h)
        assert ns.log_derivative(np.array([v]))[0] == pytest.approx(np.log(fd), abs=1e-5)


def test_levels_read_a_value_as_its_nearest_level_and_give_levels_back_exactly():
    levels = np.array([0.0, 1.0, 2.0, 5.0])
    v = np.array([0.0, 1.0, 5.0, 0.5, 3.4, 3.5, 3.6, -7.0, 99.0, np.nan])
    codes = to_levels(v, levels)
    np.testing.assert_array_equal(codes[:-1], [0, 1, 3, 0, 2, 2, 3, 0, 3])  # ties: the lower level
    assert np.isnan(codes[-1])
    np.testing.assert_array_equal(from_levels(codes[:3], levels), v[:3])
    assert few_levels(np.array([1.0, 2.0, 2.0, np.nan, 3.0]), 3, k=1).tolist() == [1.0, 2.0, 3.0]
    assert few_levels(np.array([1.0, 2.0, 3.0, 4.0]), 3, k=1) is None and few_levels(levels, 0) is None


def test_the_scale_is_chosen_on_validation_rows_heavy_tails_normal_score_a_gaussian_standardize():
    rng = np.random.default_rng(3)
    tail = rng.lognormal(0.0, 1.5, 2000)  # skewed, heavy right tail
    chosen, scores = select_scale(tail[:1600], tail[1600:])
    assert chosen == "normal-score" and scores["normal-score"] > scores["standardize"]
    gauss = rng.standard_normal(2000)
    chosen, scores = select_scale(gauss[:1600], gauss[1600:])
    assert chosen == "standardize" and set(scores) == {"standardize", "normal-score"}
    assert select_scale(np.ones(10), np.ones(3)) == ("standardize", {})  # nothing to choose on a constant


def test_the_scales_of_many_columns_chosen_together_are_those_chosen_one_by_one(monkeypatch):
    # columns of different kinds and missing cells, two columns per batch
    import data_prep.transforms as transforms

    monkeypatch.setattr(transforms, "_GMM_CELLS", 240 * transforms.GMM_COMPONENTS * 2)
    rng = np.random.default_rng(5)
    x = np.column_stack([rng.lognormal(0.0, 1.5, 300), rng.standard_normal(300), np.ones(300),
                         rng.standard_t(2, 300), rng.normal(size=300) ** 3, rng.integers(0, 4, 300) * 1.0])
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:, 4][:295] = np.nan  # five values: no normal score to fit
    fit, val = x[:240], x[240:]
    many = select_scales(fit, val)
    for j in range(x.shape[1]):
        one = select_scale(fit[:, j], val[:, j][~np.isnan(val[:, j])])
        assert many[j][0] == one[0] and many[j][1].keys() == one[1].keys()
        assert all(abs(many[j][1][k] - one[1][k]) < 1e-12 for k in one[1])
    assert {c for c, _ in many} == {"standardize", "normal-score"}


def _params(pre: Preprocessor) -> str:
    return json.dumps(pre.to_json(), sort_keys=True)


def test_level_codes_and_chosen_scales_ignore_the_test_rows(table):
    before = _params(Preprocessor.fit(table, TRAIN, **NEW))
    table.x[TEST, 0] = 1e9
    table.x[TEST, 1] = 99.0         # a count never seen in training
    table.x[TEST, 2] = 2
    table.y[TEST] = 1 - table.y[TEST]
    assert _params(Preprocessor.fit(table, TRAIN, **NEW)) == before


def test_few_valued_and_categorical_columns_become_levels_real_columns_get_a_recorded_scale(table):
    pre = Preprocessor.fit(table, TRAIN, **NEW)
    kinds = {f: c.kind for f, c in zip(pre.features, pre.columns)}
    assert kinds == {"real_a": kinds["real_a"], "disc": "levels", "cat_a": "levels", "real_b": kinds["real_b"],
                     "cat_b": "levels"}
    assert {kinds["real_a"], kinds["real_b"]} <= {"standardize", "normal-score"}
    assert pre.meta_types == ["real", "discrete", "discrete", "real", "discrete"]
    # cat_b misses values in training rows: its missing category is a level of its own
    assert [c.n_categories for c in pre.columns] == [None, 7, 3, None, 5]
    out = pre.transform(table.x)
    for k in (1, 2, 4):
        assert set(np.unique(out[:, k])) <= set(range(pre.columns[k].n_categories))
    # target encoding orders a categorical's levels by class rate
    cat_a = pre.columns[2]
    assert np.all(np.diff(cat_a.lookup[cat_a.level_codes]) >= 0)
    rec = pre.to_json()
    assert rec["selection"]["validation_rows"] == 36 and rec["selection"]["fit_rows"] == 144
    for name in ("real_a", "real_b"):
        entry = rec["columns"][name]
        assert entry["transform"] in ("standardize", "normal-score")
        assert set(entry["selection"]) == {"standardize", "normal-score"}
        assert entry["transform"] == max(entry["selection"], key=entry["selection"].get)


def test_the_manifest_entry_reads_back_to_the_same_transform_and_inverse(table):
    pre = Preprocessor.fit(table, TRAIN, **NEW)
    back = Preprocessor.from_json(json.loads(json.dumps(pre.to_json())))
    x = table.x[TEST]
    assert np.array_equal(pre.transform(x), back.transform(x), equal_nan=True)
    out = back.transform(x)
    raw = back.inverse_transform(out)
    for k in range(x.shape[1]):
        seen = ~np.isnan(x[:, k])
        np.testing.assert_allclose(raw[seen, k], x[seen, k], rtol=0, atol=1e-9 * max(1.0, np.abs(x[seen, k]).max()))


def test_a_query_keeps_missing_cells_missing_in_level_columns(table):
    pre = Preprocessor.fit(table, TRAIN, **NEW)
    x = table.x[TEST].copy()
    x[:, :] = np.nan
    out = x.copy()
    pre.transform_inplace(out, impute=False)
    assert np.isnan(out).all()


def test_manifests_written_before_levels_and_scales_read_as_before(table):
    old = Preprocessor.fit(table, TRAIN)  # target encoding as reals, standardisation
    entry = old.to_json()
    for col in entry["columns"].values():
        col.pop("transform")
    back = Preprocessor.from_json(entry)
    assert np.array_equal(old.transform(table.x), back.transform(table.x))
    assert back.meta_types == ["real"] * 5
    assert [c.kind for c in back.columns] == ["standardize", "standardize", "target-encoding", "standardize",
                                              "target-encoding"]


def test_prepare_defaults_for_tables_and_the_old_behaviour_on_request(tmp_path):
    from data_prep.prepare import PrepConfig, prepare_table

    table = make_table(own_test=True)
    new = prepare_table(table, PrepConfig(setting="horizontal", clients=2))
    assert new.preprocessor.selection is not None
    assert new.feature_meta()["disc"] == {"meta_type": "discrete", "raw_meta_type": "discrete", "n_categories": 7}
    old = prepare_table(make_table(own_test=True), PrepConfig(setting="horizontal", clients=2, scale="standardize",
                                                             max_levels=0))
    assert old.preprocessor.meta_types == ["real"] * 5 and old.preprocessor.selection is None
